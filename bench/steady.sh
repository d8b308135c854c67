#!/usr/bin/env bash
# Steady state of the purchase server (issue 14): distinct receipts offered at fixed rates (open loop) for a warm-up
# and a measured window, on SQLite and PostgreSQL, with an instant App Store and with 3–6 s on every verifyReceipt
# call, the server on its default settings. For each it reports completions per second in the window, verifications
# in flight, upload-to-grant p50/p99, server CPU per receipt and memory per verification in flight, and the highest
# offered rate it sustained (completions ≥ 95% of the offer, grant p99 under 1 s instant, 10 s with latency).
#   BENCH_RATES="1000 2000 3000"  BENCH_SLOW_RATES="1000 2000"  BENCH_WARMUP=10  BENCH_WINDOW=60  BENCH_ENGINES="sqlite postgres"
#   BENCH_CONNECTIONS=C (the load generator's connections, uploads in progress at once; default one per 20/s offered, at
#   least 64, and with latency one per 7.5/s)
set -euo pipefail
cd "$(dirname "$0")/.."
RATES=${BENCH_RATES:-"1000 2000 3000 4000 5000"}
SLOW_RATES=${BENCH_SLOW_RATES:-"1000 2000 3000"}
WARMUP=${BENCH_WARMUP:-10}
WINDOW=${BENCH_WINDOW:-60}
ENGINES=${BENCH_ENGINES:-"sqlite postgres"}
export STOREKEEPER_BENCH_BIN=${STOREKEEPER_BENCH_BIN:-.build/release/storekeeper-bench}
. bench/lib.sh

max_rate=$(echo $RATES $SLOW_RATES | tr ' ' '\n' | sort -n | tail -1)
count=$(( max_rate * (WARMUP + WINDOW) + 1000 ))
APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
echo "preparing $count distinct receipts on the emulator…"
started=$(date +%s)
"$PYTHON" bench/steady_prepare.py "$APPSTORE" "$WORK" "$count"
echo "  ($(( $(date +%s) - started )) s)"
shared=$(curl -s "$APPSTORE/admin/v1/apps/com.example.coins" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["sharedSecret"])')

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/steady-$STAMP.txt
{
  echo "# Purchase server at steady state, $STAMP: $(machine);"
  echo "# emulator, server and load generator on this machine; warm-up ${WARMUP} s, window ${WINDOW} s; server defaults"
} > "$OUT"

PG_URL=""
if [[ " $ENGINES " == *" postgres "* ]]; then PG_URL=$(scripts/postgres.sh start 2>/dev/null || true); fi

for engine in $ENGINES; do
  [ "$engine" = postgres ] && [ -z "$PG_URL" ] && { echo "postgres: skipped (not available)" | tee -a "$OUT"; continue; }
  for latency in 0 3s-6s; do
    rates=$RATES; [ "$latency" != 0 ] && rates=$SLOW_RATES
    "$BIN" appstore fault clear --url "$APPSTORE" >/dev/null
    [ "$latency" != 0 ] && "$BIN" appstore fault add --url "$APPSTORE" --endpoint verifyReceipt --latency "$latency" >/dev/null
    best=0
    for rate in $rates; do
      name="server-$engine-$latency-$rate"
      DB_ARGS=(--data "$WORK/$name"); DB="sqlite:$WORK/$name/server.sqlite"
      export STEADY_APPSTORE_PID=$(cat "$WORK/appstore.pid") STEADY_DATABASE_PID=""
      if [ "$engine" = postgres ]; then
        STEADY_DATABASE_PID=$(scripts/postgres.sh pid)
        run_url=$(new_schema "$PG_URL" steady)
        DB_ARGS+=(--database "$run_url")
        DB="postgres:$run_url"
      fi
      SERVER=$(start "$name" "$BIN" server serve "${DB_ARGS[@]}" --port 0 --quiet --appstore-url "$APPSTORE" --trust-emulator \
        --admin-key sk_admin_benchmark)
      [ -n "$SERVER" ] || { cat "$WORK/$name.log"; exit 1; }
      key=$(register_app "$SERVER" "$shared")
      # With Apple's latency the server answers uploads slower, so one connection per 20/s offered (150 at 3,000/s)
      # let 2,347–2,722/s be accepted over four runs; 400 let 2,901–2,991/s through over six (bench/README.md,
      # thirty-fifth round). Latency runs keep one per 7.5/s offered unless told.
      connections=${BENCH_CONNECTIONS:-}
      [ "$latency" != 0 ] && [ -z "$connections" ] && connections=$(( rate * 2 / 15 > 64 ? rate * 2 / 15 : 64 ))
      line=$(BENCH_CONNECTIONS=$connections "$PYTHON" bench/steady.py "$SERVER" "$(cat "$WORK/$name.pid")" "$key" "$WORK/steady-receipts.txt" \
        "$rate" "$WARMUP" "$WINDOW" "$DB" "$engine latency $latency")
      echo "$line" | grep -v '^json ' | tee -a "$OUT"
      echo "$line" | grep '^json ' >> "$OUT"
      limit=1000; [ "$latency" != 0 ] && limit=10000
      if echo "$line" | grep '^json ' | cut -c6- | "$PYTHON" -c "import json,sys; r=json.load(sys.stdin); sys.exit(0 if r['completed_per_second'] >= 0.95*r['offered_per_second'] and r['grant_p99_ms'] < $limit and r['unsettled'] == 0 else 1)"; then
        best=$rate
      fi
      kill "$(cat "$WORK/$name.pid")"; rm -f "$WORK/$name.pid"
      [ "$engine" = postgres ] && drop_schema "$run_url"
      sleep 1
    done
    echo "$engine latency $latency: highest offered rate sustained $best/s" | tee -a "$OUT"
  done
done
"$BIN" appstore fault clear --url "$APPSTORE" >/dev/null
[ -n "$PG_URL" ] && scripts/postgres.sh stop
echo "written: $OUT"
