#!/usr/bin/env bash
# Device benchmark: the time from "buy" to content delivered end to end (device → emulator → receipt →
# purchase server → entitlement → delivered and finished), p50/p99, with the emulator at zero latency
# and with 3–6 s on every verifyReceipt call; and the same with StoreKit 2 signed transactions.
set -euo pipefail
cd "$(dirname "$0")/.."
. bench/lib.sh
PURCHASES=${BENCH_SHOP_PURCHASES:-400}

"$BIN" up --data "$WORK/up" --appstore-port 0 --server-port 0 --quiet > "$WORK/up.log" 2>&1 &
echo $! > "$WORK/up.pid"
for _ in $(seq 200); do grep -q '"appstore"' "$WORK/up.log" 2>/dev/null && break; sleep 0.1; done
APPSTORE=$(head -1 "$WORK/up.log" | sed -n 's/.*"appstore":"\([^"]*\)".*/\1/p')
SERVER=$(head -1 "$WORK/up.log" | sed -n 's/.*"server":"\([^"]*\)".*/\1/p')
[ -n "$APPSTORE" ] && [ -n "$SERVER" ] || { cat "$WORK/up.log"; exit 1; }
run() {  # label, proof, purchases, concurrency
  result=$("$BIN" shop-bench --data "$WORK/up" --appstore "$APPSTORE" --server "$SERVER" --proof "$2" --purchases "$3" --concurrency "$4")
  p50=$(echo "$result" | sed -n 's/.*"p50_ms" : \([0-9]*\).*/\1/p'); p99=$(echo "$result" | sed -n 's/.*"p99_ms" : \([0-9]*\).*/\1/p')
  count=$(echo "$result" | sed -n 's/.*"delivered" : \([0-9]*\).*/\1/p')
  echo "$1: buy → delivered p50 ${p50} ms, p99 ${p99} ms ($count delivered, $4 devices)"
}

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/shop-$STAMP.txt
echo "# Device benchmark, $STAMP ($(machine)); storekeeper up (emulator + server) and the devices on this machine" > "$OUT"
"$BIN" appstore fault clear --url "$APPSTORE" > /dev/null
run "receipt, zero latency  " receipt "$PURCHASES" 16 | tee -a "$OUT"
run "signed JWS, zero latency" jws "$PURCHASES" 16 | tee -a "$OUT"
"$BIN" appstore fault add --url "$APPSTORE" --endpoint verifyReceipt --latency 3s-6s > /dev/null
run "receipt, 3–6 s latency " receipt 64 32 | tee -a "$OUT"
"$BIN" appstore fault clear --url "$APPSTORE" > /dev/null
echo "written: $OUT"
