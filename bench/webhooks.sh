#!/usr/bin/env bash
# Webhook delivery benchmark (SQLite, an instant App Store): settlement with and without an endpoint, events
# delivered per second to `storekeeper webhook listen`, and the delay from the change to arrival.
set -euo pipefail
cd "$(dirname "$0")/.."
RECEIPTS=${BENCH_WEBHOOK_RECEIPTS:-5000}
. bench/lib.sh

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
echo "preparing 2 × $RECEIPTS receipts on the emulator…"
"$PYTHON" bench/server_prepare.py "$APPSTORE" "$WORK" "$RECEIPTS" "$RECEIPTS"
LISTENER=$(start listener "$BIN" webhook listen --port 0 --quiet)
SERVER=$(start server "$BIN" server serve --data "$WORK/server" --port 0 --quiet --appstore-url "$APPSTORE" --trust-emulator \
  --admin-key sk_admin_benchmark --concurrency 6000)
[ -n "$SERVER" ] && [ -n "$LISTENER" ] || { cat "$WORK"/*.log; exit 1; }

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/webhooks-$STAMP.txt
echo "# Webhook benchmark, $STAMP ($(machine)); emulator, server, receiver and load generator on this machine" > "$OUT"
"$PYTHON" bench/webhooks_load.py "$SERVER" "$APPSTORE" "$LISTENER" "$WORK" | tee -a "$OUT"
echo "written: $OUT"
