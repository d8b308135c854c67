#!/usr/bin/env bash
# Service under abuse: p99 of authenticated GET /v1/users/{id} while 500 slow-header connections and
# 50 clients posting junk receipts and oversized-x5c notifications hit the same server, as a ratio to
# the unloaded p99 in the same run (aim: at most 2×), and receipts still processed end to end per second.
set -euo pipefail
cd "$(dirname "$0")/.."
RECEIPTS=${BENCH_ABUSE_RECEIPTS:-3000}
. bench/lib.sh

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
"$PYTHON" bench/server_prepare.py "$APPSTORE" "$WORK" "$RECEIPTS" "$RECEIPTS"
SERVER=$(start server "$BIN" server serve --data "$WORK/server" --port 0 --quiet --appstore-url "$APPSTORE" --trust-emulator \
  --admin-key sk_admin_benchmark --concurrency 2048)
[ -n "$SERVER" ] || { cat "$WORK/server.log"; exit 1; }
STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/abuse-$STAMP.txt
echo "# Purchase server under abuse, $STAMP ($(machine)); emulator, server and abusers on this machine" > "$OUT"
"$PYTHON" bench/abuse_load.py "$SERVER" "$APPSTORE" "$WORK/receipts-fast.txt" "$WORK/receipts-slow.txt" | tee -a "$OUT"
echo "written: $OUT"
