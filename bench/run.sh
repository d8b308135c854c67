#!/usr/bin/env bash
# Benchmarks of the App Store emulator on this machine: verifyReceipt throughput and latency over keep-alive
# for receipts with 1, 100 and 1,000 purchases, every request a different receipt (10,000 testers' one-purchase
# receipts; 10,000 and 1,000 refreshed receipts of one tester with 100 and 1,000 purchases), against a bare
# libmicrohttpd handler measured in the same run; the cost of each extra purchase; whether reads wrote anything;
# purchases per second through the device API. Prints the figures and writes them under bench/results/.
set -euo pipefail
cd "$(dirname "$0")/.."
DURATION=${BENCH_DURATION:-10s}
CONNECTIONS=${BENCH_CONNECTIONS:-64}
SINGLES=${BENCH_SINGLE_RECEIPTS:-10000}
BENCH=${STOREKEEPER_BENCH_BIN:-.build/release/storekeeper-bench}
. bench/lib.sh

URL=$(start appstore "$BIN" appstore serve --data "$WORK/data" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$URL" ] || { cat "$WORK/appstore.log"; exit 1; }
BARE=$(start bare "$BENCH" bare --port 0 --threads 2)
[ -n "$BARE" ] || { cat "$WORK/bare.log"; exit 1; }
echo "preparing distinct receipts…"
"$PYTHON" bench/appstore_prepare.py "$URL" "$WORK" "$SINGLES"

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/appstore-$STAMP.txt
{
  echo "# App Store emulator benchmark, $STAMP"
  echo "# machine: $(machine); wrk -t2 -c$CONNECTIONS -d$DURATION over keep-alive; every request a different receipt"
} > "$OUT"

RPS=()
run_wrk() {  # name, url, lua script, bodies file
  local name=$1 url=$2 script=$3 bodies=$4
  BODIES_FILE=$bodies BODY_FILE=$bodies wrk -t2 -c"$CONNECTIONS" -d"$DURATION" --latency -s "$script" "$url" > "$WORK/wrk.out" 2>&1
  local rps p50 p99 errors
  rps=$(awk '/Requests\/sec/ {print $2}' "$WORK/wrk.out")
  p50=$(awk '$1 == "50%" {print $2}' "$WORK/wrk.out")
  p99=$(awk '$1 == "99%" {print $2}' "$WORK/wrk.out")
  errors=$(grep -E "Non-2xx|Socket errors|bad answers: [1-9]" "$WORK/wrk.out" | tr '\n' ' ' || true)
  printf "%-38s %10s req/s   p50 %8s   p99 %8s   %s\n" "$name" "$rps" "$p50" "$p99" "$errors" | tee -a "$OUT"
  RPS+=("$rps")
}

store_state() { cat "$WORK"/data/appstore.sqlite* 2>/dev/null | sha256sum | cut -c1-16; }
before=$(store_state)
# The bare handler just before and just after the one-purchase run: the host's speed drifts within minutes, and the
# ratio is taken against the mean of the two measurements around it.
run_wrk "bare libmicrohttpd handler" "$BARE" bench/verify_many.lua "$WORK/bare.json"
run_wrk "verifyReceipt (1 purchases)" "$URL" bench/verify_many.lua "$WORK/bodies-1.txt"
run_wrk "bare libmicrohttpd handler, again" "$BARE" bench/verify_many.lua "$WORK/bare.json"
for size in 100 1000; do
  run_wrk "verifyReceipt ($size purchases)" "$URL" bench/verify_many.lua "$WORK/bodies-$size.txt"
done
after=$(store_state)
awk -v bare="${RPS[0]}" -v one="${RPS[1]}" -v again="${RPS[2]}" 'BEGIN {
  printf "verifyReceipt (1 purchase) / bare handler: %.3f (bare %.0f and %.0f req/s around it)\n", one / ((bare + again) / 2), bare, again }' | tee -a "$OUT"
[ "$before" = "$after" ] && echo "reads wrote nothing: the emulator's store is byte for byte the same after the verifyReceipt runs" | tee -a "$OUT" \
  || echo "reads WROTE to the emulator's store during the verifyReceipt runs" | tee -a "$OUT"
"$PYTHON" bench/check.py "$URL" "$WORK" | tee -a "$OUT"
"$PYTHON" - "$URL" "$WORK" <<'PY'
import http.client, json, sys, urllib.parse
url, work = sys.argv[1], sys.argv[2]
parsed = urllib.parse.urlparse(url)
c = http.client.HTTPConnection(parsed.hostname, parsed.port)
c.request("POST", "/admin/v1/accounts", json.dumps({"email": "buyer@example.com"}), {"Content-Type": "application/json"}); c.getresponse().read()
c.request("POST", "/device/v1/devices", json.dumps({"account": "buyer@example.com"}), {"Content-Type": "application/json"})
device = json.loads(c.getresponse().read())["id"]
json.dump({"app": "com.example.coins", "device": device, "productId": "Nada.JPYF01"}, open(f"{work}/purchase.json", "w"))
PY
run_wrk "device API purchases" "$URL" bench/purchase.lua "$WORK/purchase.json"
echo "written: $OUT"
