#!/usr/bin/env bash
# StoreKit 2 benchmark: signed transactions verified per second by the purchase server's verifier (all
# cores) next to Apple's Python SignedDataVerifier on the same JWS, and App Store Server Notifications
# processed per second by a running server (verified, de-duplicated, recorded, settlement queued).
set -euo pipefail
cd "$(dirname "$0")/.."
NOTIFICATIONS=${BENCH_NOTIFICATIONS:-4000}
. bench/lib.sh

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --tester bench@example.com \
  --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
SERVER=$(start server "$BIN" server serve --data "$WORK/server" --port 0 --quiet --appstore-url "$APPSTORE" --trust-emulator \
  --admin-key sk_admin_benchmark)
[ -n "$SERVER" ] || { cat "$WORK/server.log"; exit 1; }

"$BIN" appstore buy --url "$APPSTORE" --app com.example.coins --product Nada.JPYF02 --account bench@example.com > "$WORK/buy.json"
"$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['signedTransaction'])" "$WORK/buy.json" > "$WORK/transaction.jws"
"$BIN" appstore ca export --jws --url "$APPSTORE" --output "$WORK/jws-root.pem"

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/storekit2-$STAMP.txt
echo "# StoreKit 2 benchmark, $STAMP ($(nproc) cores); emulator and server on this machine" > "$OUT"
ours=$("$BIN" jws bench "$WORK/transaction.jws" --verify-with "$WORK/jws-root.pem" --seconds 5)
echo "signed transactions verified (Storekeeper, $(echo "$ours" | sed -n 's/.*"threads" : \([0-9]*\).*/\1/p') threads): $(echo "$ours" | sed -n 's/.*"perSecond" : \([0-9]*\).*/\1/p')/s" | tee -a "$OUT"
"$PYTHON" bench/storekit2_load.py "$SERVER" "$APPSTORE" "$WORK" "$NOTIFICATIONS" | tee -a "$OUT"
echo "written: $OUT"
