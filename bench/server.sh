#!/usr/bin/env bash
# Purchase server benchmark: receipts fully processed per second (accepted, verified against the
# emulator, ledgered, granted, durable) on SQLite and PostgreSQL, with a zero-latency emulator and
# with 3–6 s of latency on every verifyReceipt call; GET /v1/users/{id} requests per second and p99.
set -euo pipefail
cd "$(dirname "$0")/.."
RECEIPTS=${BENCH_RECEIPTS:-10000}
SLOW_RECEIPTS=${BENCH_SLOW_RECEIPTS:-6000}
. bench/lib.sh

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
echo "preparing $RECEIPTS + $SLOW_RECEIPTS receipts on the emulator…"
"$PYTHON" bench/server_prepare.py "$APPSTORE" "$WORK" "$RECEIPTS" "$SLOW_RECEIPTS"

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/server-$STAMP.txt
echo "# Purchase server benchmark, $STAMP ($(machine)); emulator and server on this machine" > "$OUT"

PG_URL=""
if [ -x scripts/postgres.sh ] && PG_URL=$(scripts/postgres.sh start 2>/dev/null); then :; else PG_URL=""; fi

for engine in sqlite postgres; do
  [ "$engine" = postgres ] && [ -z "$PG_URL" ] && { echo "postgres: skipped (not available)" | tee -a "$OUT"; continue; }
  for latency in 0 3s-6s; do
    DB_ARGS=(--data "$WORK/server-$engine-$latency")
    if [ "$engine" = postgres ]; then
      schema="bench_$(date +%s%N)"
      psql "$PG_URL" -qc "CREATE SCHEMA $schema" >/dev/null
      DB_ARGS+=(--database "$PG_URL?options=-csearch_path%3D$schema")
    fi
    SERVER=$(start "server-$engine-$latency" "$BIN" server serve "${DB_ARGS[@]}" --port 0 --quiet --appstore-url "$APPSTORE" \
      --trust-emulator --admin-key sk_admin_benchmark --concurrency 6000 --call-timeout 20)
    [ -n "$SERVER" ] || { cat "$WORK/server-$engine-$latency.log"; exit 1; }
    "$BIN" appstore fault clear --url "$APPSTORE" >/dev/null
    count=$RECEIPTS
    bodies="$WORK/receipts-fast.txt"
    if [ "$latency" != 0 ]; then
      "$BIN" appstore fault add --url "$APPSTORE" --endpoint verifyReceipt --latency "$latency" >/dev/null
      count=$SLOW_RECEIPTS
      bodies="$WORK/receipts-slow.txt"
    fi
    "$PYTHON" bench/server_load.py "$SERVER" "$APPSTORE" "$bodies" "$engine" "$latency" | tee -a "$OUT"
    kill "$(cat "$WORK/server-$engine-$latency.pid")"; rm -f "$WORK/server-$engine-$latency.pid"; sleep 1
  done
done
"$BIN" appstore fault clear --url "$APPSTORE" >/dev/null
[ -n "$PG_URL" ] && scripts/postgres.sh stop
echo "written: $OUT"
