#!/usr/bin/env bash
# StoreKit 2 benchmark: signed transactions verified per second by the purchase server's verifier (all
# cores) next to Apple's Python SignedDataVerifier on the same JWS, and App Store Server Notifications
# processed per second by a running server (verified, de-duplicated, recorded, settlement queued).
set -euo pipefail
cd "$(dirname "$0")/.."
NOTIFICATIONS=${BENCH_NOTIFICATIONS:-20000}
CONNECTIONS=${BENCH_NOTIFICATION_CONNECTIONS:-256}
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
echo "# StoreKit 2 benchmark, $STAMP ($(machine)); emulator and server on this machine" > "$OUT"
ours=$("$BIN" jws bench "$WORK/transaction.jws" --verify-with "$WORK/jws-root.pem" --seconds 5)
echo "signed transactions verified (Storekeeper, $(echo "$ours" | sed -n 's/.*"threads" : \([0-9]*\).*/\1/p') threads): $(echo "$ours" | sed -n 's/.*"perSecond" : \([0-9]*\).*/\1/p')/s" | tee -a "$OUT"
"$PYTHON" bench/storekit2_load.py "$SERVER" "$APPSTORE" "$WORK" "$NOTIFICATIONS" | tee -a "$OUT"
# All offered at once (a rate no server meets) over BENCH_NOTIFICATION_CONNECTIONS (256) connections, as Apple's many
# senders would: the figure is what the server completes. Each connection waits for its answer (the notification's
# commit), so too few leave the server idle between batches: 32 completed 3,657–3,964/s, 64 4,180–4,276/s, 128
# 4,299–4,430/s and 256 4,451–4,628/s with the same binary (bench/README.md, thirty-fourth round).
cpu() { awk '{print $14 + $15}' "/proc/$(cat "$WORK/server.pid")/stat"; }
before=$(cpu)
load=$(.build/release/storekeeper-bench load --url "$SERVER" --path /v1/notifications/apple --key none \
  --bodies "$WORK/notifications.jsonl" --rate 1000000 --seconds 1 --connections "$CONNECTIONS")
used=$(( $(cpu) - before ))
"$PYTHON" - "$load" "$used" "$(getconf CLK_TCK)" <<'PY' | tee -a "$OUT"
import json, sys
load, ticks, hz = json.loads(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
print(f"notifications processed (verified, de-duplicated, recorded, settlement queued): {load['accepted'] / load['seconds']:.0f}/s "
      f"({load['accepted']} answered 2xx of {load['requests']} in {load['seconds']:.1f} s over {load['connections']} connections, answer p99 {load['answer_p99_ms']:.0f} ms "
      f"from the start; server CPU {ticks / hz * 1e6 / max(load['requests'], 1):.0f} µs per notification)")
PY
echo "written: $OUT"
