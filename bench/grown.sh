#!/usr/bin/env bash
# A ledger that has grown (issue 14): GROWN_ROWS ledger rows (default ten million) over GROWN_USERS users (default one
# million) of the benchmark app, on SQLite and PostgreSQL. In one run, on an empty database and on the grown one:
# the steady state (distinct receipts offered at GROWN_RATE/s, bench/steady.py) and GET /v1/users/{id} (wrk, the median of three 5 s runs,
# p50/p99) for a user of the run and for a generated user; the revenue report over all time (its time, the server's
# memory), the user reads and the steady state while such reports run; the ratios grown/empty; the query plans of the hot
# statements on the grown database. The generated databases are kept (bench/cache/, git-ignored; a PostgreSQL
# database named after the generator) and reused while the generator is unchanged. The metrics rollup is left out of
# them (generate_ledger.py --no-rollup): this measures the ledger path.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${GROWN_ROWS:-10000000}
USERS=${GROWN_USERS:-1000000}
RATE=${GROWN_RATE:-800}
WARMUP=${BENCH_WARMUP:-10}
WINDOW=${BENCH_WINDOW:-30}
ENGINES=${BENCH_ENGINES:-"sqlite postgres"}
APP=com.example.coins
ADMIN=(-H "Authorization: Bearer sk_admin_benchmark" -H "Content-Type: application/json")
export STOREKEEPER_BENCH_BIN=${STOREKEEPER_BENCH_BIN:-.build/release/storekeeper-bench}
. bench/lib.sh

VERSION=$(cat bench/generate_ledger.py bench/ledger_to_postgres.py | sha256sum | cut -c1-12)
CACHE=bench/cache/grown-$ROWS-$USERS-$VERSION
STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/grown-$STAMP.txt
echo "# A grown ledger, $STAMP: $(machine); $ROWS ledger rows over $USERS users; offered $RATE receipts/s, warm-up $WARMUP s, window $WINDOW s" > "$OUT"

serve() {  # name, database arguments…: starts a server (against the emulator once it runs) and echoes its URL
  local name=$1; shift
  local emulator=()
  [ -n "${APPSTORE:-}" ] && emulator=(--appstore-url "$APPSTORE" --trust-emulator)
  start "$name" "$BIN" server serve "$@" --port 0 --quiet "${emulator[@]}" --admin-key sk_admin_benchmark
}
stop() { kill "$(cat "$WORK/$1.pid")"; wait "$(cat "$WORK/$1.pid")" 2>/dev/null || true; rm -f "$WORK/$1.pid"; }

if [ ! -f "$CACHE/ready" ]; then
  rm -rf bench/cache/grown-* && mkdir -p "$CACHE/sqlite" && chmod 700 "$CACHE/sqlite"
  SERVER=$(serve setup --data "$CACHE/sqlite")
  curl -sf "${ADMIN[@]}" -d "{\"id\": \"$APP\"}" "$SERVER/admin/v1/apps" >/dev/null
  stop setup
  echo "generating $ROWS ledger rows for $USERS users (SQLite)…"
  started=$(date +%s)
  "$PYTHON" bench/generate_ledger.py "$CACHE/sqlite/server.sqlite" "$APP" "$USERS" "$ROWS" 11 --no-rollup | tee -a "$OUT"
  echo "generator: $(( $(date +%s) - started )) s" | tee -a "$OUT"
  touch "$CACHE/ready"
fi

PG_URL=""
TEMPLATE=grown_$VERSION
if [[ " $ENGINES " == *" postgres "* ]]; then PG_URL=$(scripts/postgres.sh start 2>/dev/null || true); fi
pg() { psql "${PG_URL%/*}/$1" -qtAc "$2"; }
# Its secrets are sealed with the master key of $CACHE/postgres (kept with the SQLite copy).
if [ -n "$PG_URL" ] && { [ -z "$(pg postgres "SELECT 1 FROM pg_database WHERE datname = '$TEMPLATE'")" ] || [ ! -f "$CACHE/postgres/master-key" ]; }; then
  pg postgres "DROP DATABASE IF EXISTS $TEMPLATE" >/dev/null
  pg postgres "DROP DATABASE IF EXISTS loading_$VERSION" >/dev/null
  pg postgres "CREATE DATABASE loading_$VERSION" >/dev/null
  rm -rf "$CACHE/postgres" && mkdir -p "$CACHE/postgres" && chmod 700 "$CACHE/postgres"
  SERVER=$(serve setup-pg --data "$CACHE/postgres" --database "${PG_URL%/*}/loading_$VERSION")
  curl -sf "${ADMIN[@]}" -d "{\"id\": \"$APP\"}" "$SERVER/admin/v1/apps" >/dev/null
  stop setup-pg
  echo "copying the grown ledger to PostgreSQL…"
  "$PYTHON" bench/ledger_to_postgres.py "$CACHE/sqlite/server.sqlite" "${PG_URL%/*}/loading_$VERSION" | tee -a "$OUT"
  pg postgres "ALTER DATABASE loading_$VERSION RENAME TO $TEMPLATE" >/dev/null
fi

echo "sizes: SQLite $(du -h "$CACHE/sqlite/server.sqlite" | cut -f1)$([ -n "$PG_URL" ] && echo ", PostgreSQL $(pg postgres "SELECT pg_size_pretty(pg_database_size('$TEMPLATE'))")")" | tee -a "$OUT"

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
each=$(( RATE * (WARMUP + WINDOW) + 1000 ))
count=$(( 2 * each ))
echo "preparing $count distinct receipts on the emulator…"
"$PYTHON" bench/steady_prepare.py "$APPSTORE" "$WORK" "$count"
# The first half for the steady state alone, the second for the steady state while reports run.
tail -n +$(( each + 1 )) "$WORK/steady-receipts.txt" > "$WORK/steady-receipts-beside.txt"
head -n "$each" "$WORK/steady-receipts.txt" > "$WORK/steady-receipts-alone.txt"
shared=$(curl -s "$APPSTORE/admin/v1/apps/$APP" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["sharedSecret"])')
run_user=$(head -1 "$WORK/steady-receipts.txt" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["appUserId"])')

users() {  # server, key, user, label: GET /v1/users/{id} with wrk, three runs of 5 s; the median run's figures (by p99)
  echo "wrk.headers[\"Authorization\"] = \"Bearer $2\"" > "$WORK/user.lua"
  local path runs=()
  path=$("$PYTHON" -c 'import sys, urllib.parse; print(urllib.parse.quote(sys.argv[1]))' "$3")
  for _ in 1 2 3; do
    # One line per run: req/s, p50 ms, p99 ms (wrk prints us, ms or s).
    runs+=("$(wrk -t2 -c64 -d5s --latency -s "$WORK/user.lua" "$1/v1/users/$path" | awk '
      function ms(t) { if (t ~ /us$/) return t / 1000; if (t ~ /ms$/) return t + 0; if (t ~ /s$/) return t * 1000; return t }
      /Requests\/sec/ {rps=$2} $1=="50%" {p50=ms($2)} $1=="99%" {p99=ms($2)} END {printf "%s %.2f %.2f\n", rps, p50, p99}')")
  done
  printf '%s\n' "${runs[@]}" | sort -k3 -n | awk -v label="$4" '
    {p99s = p99s (NR > 1 ? ", " : "") $3} NR == 2 {rps=$1; p50=$2; p99=$3}
    END {printf "%-40s GET /v1/users/{id}: %s req/s, p50 %.2fms, p99 %.2fms (median of 3 runs by p99; p99s %s ms)\n", label, rps, p50, p99, p99s}'
}

report() {  # server, server pid, key, label: GET /v1/reports/revenue over all time (every ledger row; three requests, the median),
  # the server's peak memory after them against its memory before; then GET /v1/users/{id} while such reports run back to back
  local url="$1/v1/reports/revenue?from=2000-01-01&to=2100-01-01" times=() before peak loop
  before=$(awk '/^VmRSS/ {print int($2 / 1024)}' "/proc/$2/status")
  for _ in 1 2 3; do times+=("$(curl -s -o /dev/null -w '%{http_code} %{time_total}' -H "Authorization: Bearer $3" "$url")"); done
  peak=$(awk '/^VmHWM/ {print int($2 / 1024)}' "/proc/$2/status")
  printf '%s\n' "${times[@]}" | sort -k2 -n | awk -v label="$4" -v before="$before" -v peak="$peak" '
    {codes = codes (NR > 1 ? "," : "") $1} NR == 2 {median = $2 * 1000}
    END {printf "%-40s GET /v1/reports/revenue over all time: %.0f ms (median of 3, status %s); server memory %d MiB before, peak %d MiB after\n", label, median, codes, before, peak}'
  ( while :; do curl -s -o /dev/null -H "Authorization: Bearer $3" "$url"; done ) &
  loop=$!
  users "$1" "$3" "$run_user" "$4, reports running"
  kill "$loop" 2>/dev/null || true; wait "$loop" 2>/dev/null || true; pkill -f "curl .*/v1/reports/revenue" || true
}

plans() {  # engine, database: the plans of the hot statements
  local user=user-00000042
  local statements=(
    "SELECT transaction_id, purchase_date FROM ledger WHERE app_id = '$APP' AND (environment, original_transaction_id) IN (SELECT environment, original_transaction_id FROM ownership WHERE app_id = '$APP' AND app_user_id = '$user') UNION ALL SELECT transaction_id, purchase_date FROM ledger WHERE app_id = '$APP' AND app_user_id = '$user' AND product_type = 'consumable'"
    "SELECT transaction_id FROM ledger WHERE environment = 'Sandbox' AND transaction_id IN ('2000000000000001', '2000000000000002')"
    "SELECT original_transaction_id, app_user_id FROM ownership WHERE app_id = '$APP' AND environment = 'Sandbox' AND original_transaction_id IN ('2000000000000001', '2000000000000002') ORDER BY granted_at, app_user_id"
    "SELECT currency, amount FROM balances WHERE app_id = '$APP' AND app_user_id = '$user'"
    "SELECT purchase_date / 86400000 AS day, product_id, environment, currency, price, CASE WHEN cancellation_date IS NULL THEN 0 ELSE 1 END AS refunded, refund_percentage, COUNT(*) AS transactions, SUM(quantity) AS units FROM ledger WHERE purchase_date >= 946684800000 AND purchase_date < 4102444800000 AND app_id = '$APP' GROUP BY purchase_date / 86400000, product_id, environment, currency, price, CASE WHEN cancellation_date IS NULL THEN 0 ELSE 1 END, refund_percentage")
  for statement in "${statements[@]}"; do
    echo "plan ($1): ${statement:0:110}…"
    if [ "$1" = sqlite ]; then
      "$PYTHON" -c 'import sqlite3, sys; [print("   ", row[-1]) for row in sqlite3.connect(sys.argv[1]).execute("EXPLAIN QUERY PLAN " + sys.argv[2])]' "$2" "$statement"
    else
      psql "$2" -qtAc "EXPLAIN $statement" | sed 's/^/    /'
    fi
  done
}

for engine in $ENGINES; do
  [ "$engine" = postgres ] && [ -z "$PG_URL" ] && { echo "postgres: skipped (not available)" | tee -a "$OUT"; continue; }
  declare -A completed=() p99=()
  for size in empty grown; do
    name="server-$engine-$size"
    if [ "$engine" = sqlite ]; then
      # The grown copy brings its master key: the database's secrets are sealed with it.
      if [ "$size" = grown ]; then cp -r --reflink=auto "$CACHE/sqlite" "$WORK/$name"; else mkdir -p "$WORK/$name"; fi
      chmod 700 "$WORK/$name"
      DB_ARGS=(--data "$WORK/$name"); DB="sqlite:$WORK/$name/server.sqlite"
    else
      database="run_${size}_$$"
      pg postgres "DROP DATABASE IF EXISTS $database" >/dev/null
      if [ "$size" = grown ]; then pg postgres "CREATE DATABASE $database TEMPLATE $TEMPLATE" >/dev/null; else pg postgres "CREATE DATABASE $database" >/dev/null; fi
      # The grown database's secrets are sealed with the key the SQLite copy was made with.
      mkdir -p "$WORK/$name" && chmod 700 "$WORK/$name"
      if [ "$size" = grown ]; then cp "$CACHE/postgres/master-key" "$WORK/$name/master-key"; fi
      DB_ARGS=(--data "$WORK/$name" --database "${PG_URL%/*}/$database"); DB="postgres:${PG_URL%/*}/$database"
    fi
    SERVER=$(serve "$name" "${DB_ARGS[@]}")
    [ -n "$SERVER" ] || { cat "$WORK/$name.log"; exit 1; }
    # The grown database has the app already: it takes the emulator's shared secret.
    key=$(register_app "$SERVER" "$shared" "$([ "$size" = grown ] && echo existing)")
    export STEADY_APPSTORE_PID=$(cat "$WORK/appstore.pid") STEADY_DATABASE_PID=""
    [ "$engine" = postgres ] && STEADY_DATABASE_PID=$(scripts/postgres.sh pid)
    line=$("$PYTHON" bench/steady.py "$SERVER" "$(cat "$WORK/$name.pid")" "$key" "$WORK/steady-receipts-alone.txt" "$RATE" "$WARMUP" "$WINDOW" "$DB" \
      "$engine $size")
    echo "$line" | grep -v '^json ' | tee -a "$OUT"
    completed[$size]=$(echo "$line" | grep '^json ' | cut -c6- | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["completed_per_second"])')
    reads=$(users "$SERVER" "$key" "$run_user" "$engine $size, a user of the run")
    echo "$reads" | tee -a "$OUT"
    p99[$size]=$(echo "$reads" | sed -n 's/.*p99 \([0-9.]*\)\(ms\|us\|s\).*/\1 \2/p' | awk '{v=$1; if ($2=="us") v/=1000; if ($2=="s") v*=1000; print v}')
    report "$SERVER" "$(cat "$WORK/$name.pid")" "$key" "$engine $size" | tee -a "$OUT"
    # The steady state again while reports over all time run back to back: uploads must not wait for them.
    ( while :; do curl -s -o /dev/null -H "Authorization: Bearer $key" "$SERVER/v1/reports/revenue?from=2000-01-01&to=2100-01-01"; done ) &
    loop=$!
    "$PYTHON" bench/steady.py "$SERVER" "$(cat "$WORK/$name.pid")" "$key" "$WORK/steady-receipts-beside.txt" "$RATE" "$WARMUP" "$WINDOW" "$DB" \
      "$engine $size, reports running" | grep -v '^json ' | tee -a "$OUT"
    kill "$loop" 2>/dev/null || true; wait "$loop" 2>/dev/null || true; pkill -f "curl .*/v1/reports/revenue" || true
    if [ "$size" = grown ]; then
      users "$SERVER" "$key" user-00000042 "$engine grown, a generated user" | tee -a "$OUT"
      if [ "$engine" = sqlite ]; then plans sqlite "$WORK/$name/server.sqlite" | tee -a "$OUT"; else plans postgres "${PG_URL%/*}/$database" | tee -a "$OUT"; fi
    fi
    stop "$name"
    if [ "$engine" = sqlite ]; then rm -rf "$WORK/$name"; else pg postgres "DROP DATABASE $database" >/dev/null; fi
  done
  "$PYTHON" -c 'import sys; c = float(sys.argv[2]) / float(sys.argv[1]); r = float(sys.argv[4]) / float(sys.argv[3]); print(f"{sys.argv[5]}: grown/empty throughput {c:.2f} (aim >= 0.8), read p99 {r:.2f} (aim <= 1.5)")' \
    "${completed[empty]}" "${completed[grown]}" "${p99[empty]}" "${p99[grown]}" "$engine" | tee -a "$OUT"
done
[ -n "$PG_URL" ] && scripts/postgres.sh stop
echo "written: $OUT"
