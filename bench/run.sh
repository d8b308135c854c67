#!/usr/bin/env bash
# Benchmarks of the App Store emulator on this machine: verifyReceipt throughput and latency over
# keep-alive for receipts with 1, 100 and 1,000 purchases, and purchases per second through the
# device API. Prints the figures and writes them under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
BIN=${STOREKEEPER_BIN:-.build/release/storekeeper}
PYTHON=${PYTHON:-.venv/bin/python}
DURATION=${BENCH_DURATION:-10s}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
WORK=$(mktemp -d)
trap 'kill $SERVER 2>/dev/null || true; wait $SERVER 2>/dev/null || true; rm -rf "$WORK"' EXIT

"$BIN" appstore serve --data "$WORK/data" --port 0 --quiet \
    --catalog com.example.coins=examples/coins.storekit > "$WORK/server.log" 2>&1 &
SERVER=$!
for _ in $(seq 100); do grep -q "listening on" "$WORK/server.log" 2>/dev/null && break; sleep 0.1; done
URL=$(sed -n 's/.*listening on //p' "$WORK/server.log" | head -1)
[ -n "$URL" ] || { cat "$WORK/server.log"; exit 1; }

"$PYTHON" bench/prepare.py "$URL" "$WORK"

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/appstore-$STAMP.txt
{
  echo "# App Store emulator benchmark, $STAMP"
  echo "# machine: $(nproc) cores, $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo); wrk -t2 -c$CONNECTIONS -d$DURATION over keep-alive"
} > "$OUT"

run_wrk() {  # name, lua script, body file
  local name=$1 script=$2 body=$3
  BODY_FILE=$body wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$script" "$URL" > "$WORK/$name.wrk" 2>&1
  local rps p50 p99 errors
  rps=$(awk '/Requests\/sec/ {print $2}' "$WORK/$name.wrk")
  p50=$(awk '$1 == "50%" {print $2}' "$WORK/$name.wrk")
  p99=$(awk '$1 == "99%" {print $2}' "$WORK/$name.wrk")
  errors=$(grep -E "Non-2xx|Socket errors" "$WORK/$name.wrk" | tr '\n' ' ' || true)
  printf "%-34s %10s req/s   p50 %8s   p99 %8s   %s\n" "$name" "$rps" "$p50" "$p99" "$errors" | tee -a "$OUT"
}

for size in 1 100 1000; do
  run_wrk "verifyReceipt ($size purchases)" bench/verify.lua "$WORK/verify-$size.json"
done
run_wrk "device API purchases" bench/purchase.lua "$WORK/purchase.json"
"$PYTHON" bench/check.py "$URL" "$WORK" | tee -a "$OUT"
echo "written: $OUT"
