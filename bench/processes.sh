#!/usr/bin/env bash
# Several purchase server processes on one PostgreSQL (issue 14): distinct receipts offered at PROCESSES_RATE/s
# (default 1,200) to one process, then spread over PROCESSES (default 3) processes sharing one database, each on
# its default settings; completions per second in the window (bench/steady.py, CPU and memory summed over the
# processes) and the ratio many/one. On this machine the processes, PostgreSQL, the emulator and the load
# generator share the cores: the ratio shows what contention costs, not what more machines would add.
set -euo pipefail
cd "$(dirname "$0")/.."
RATE=${PROCESSES_RATE:-1200}
COUNT=${PROCESSES:-3}
WARMUP=${BENCH_WARMUP:-10}
WINDOW=${BENCH_WINDOW:-30}
APP=com.example.coins
export STOREKEEPER_BENCH_BIN=${STOREKEEPER_BENCH_BIN:-.build/release/storekeeper-bench}
. bench/lib.sh

PG_URL=$(scripts/postgres.sh start 2>/dev/null || true)
[ -n "$PG_URL" ] || { echo "processes: skipped (PostgreSQL not available)"; exit 0; }
STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/processes-$STAMP.txt
echo "# Server processes on one PostgreSQL, $STAMP: $(machine); offered $RATE receipts/s, warm-up $WARMUP s, window $WINDOW s" > "$OUT"

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
count=$(( RATE * (WARMUP + WINDOW) + 1000 ))
echo "preparing $count distinct receipts on the emulator…"
"$PYTHON" bench/steady_prepare.py "$APPSTORE" "$WORK" "$count"
shared=$(curl -s "$APPSTORE/admin/v1/apps/$APP" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["sharedSecret"])')

declare -A completed=()
for processes in 1 "$COUNT"; do
  DATABASE=$(new_schema "$PG_URL" processes)
  urls=(); pids=(); names=()
  for index in $(seq "$processes"); do
    name="server-$processes-$index"
    mkdir -p "$WORK/$name" && chmod 700 "$WORK/$name"
    # One database, one master key: every process seals and opens the same secrets.
    [ "$index" -gt 1 ] && cp "$WORK/server-$processes-1/master-key" "$WORK/$name/master-key"
    url=$(start "$name" "$BIN" server serve --data "$WORK/$name" --database "$DATABASE" --port 0 --quiet --appstore-url "$APPSTORE" \
      --trust-emulator --admin-key sk_admin_benchmark)
    [ -n "$url" ] || { cat "$WORK/$name.log"; exit 1; }
    urls+=("$url"); pids+=("$(cat "$WORK/$name.pid")"); names+=("$name")
  done
  key=$(register_app "${urls[0]}" "$shared")
  # A key made on the first process reaches the others at their next reload of the keys (within a second): until
  # then they refuse it (401), which the load would count as refused.
  for url in "${urls[@]}"; do
    taken=""
    for _ in $(seq 50); do
      [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer $key" "$url/v1/users/key-probe")" != 401 ] && { taken=1; break; }
      sleep 0.1
    done
    [ -n "$taken" ] || echo "warning: $url still refuses the new key after 5 s; its uploads count as refused" >&2
  done
  export STEADY_APPSTORE_PID=$(cat "$WORK/appstore.pid") STEADY_DATABASE_PID=$(scripts/postgres.sh pid)
  line=$("$PYTHON" bench/steady.py "$(IFS=,; echo "${urls[*]}")" "$(IFS=,; echo "${pids[*]}")" "$key" "$WORK/steady-receipts.txt" "$RATE" \
    "$WARMUP" "$WINDOW" "postgres:$DATABASE" "postgres, $processes process(es)")
  echo "$line" | grep -v '^json ' | tee -a "$OUT"
  completed[$processes]=$(echo "$line" | grep '^json ' | cut -c6- | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["completed_per_second"])')
  for name in "${names[@]}"; do kill "$(cat "$WORK/$name.pid")"; rm -f "$WORK/$name.pid"; done
  drop_schema "$DATABASE"
  sleep 1
done
"$PYTHON" -c 'import sys; print(f"{sys.argv[3]} processes / one: {float(sys.argv[2]) / float(sys.argv[1]):.2f} (aim >= 1.0)")' \
  "${completed[1]}" "${completed[$COUNT]}" "$COUNT" | tee -a "$OUT"
scripts/postgres.sh stop
echo "written: $OUT"
