#!/usr/bin/env bash
# Instructions, not seconds: the purchase server under valgrind's callgrind, which counts every instruction it runs
# whatever else the machine is doing, so two builds compare to a fraction of a percent where wall-clock runs on this
# shared host drift by a fifth. For each load it runs a fresh server twice, with SMALL and with LARGE items, and reports
# the difference per item (the start and the stop cancel out), with the functions that cost the most per item.
#   notifications: storekit2.sh's ONE_TIME_CHARGE notifications (each verified, recorded, settled);
#   receipts: steady.sh's one-purchase receipts uploaded to POST /v1/receipts, the App Store answering at once.
# The items are offered all at once over BENCH_CALLGRIND_CONNECTIONS connections and the run ends when every job has
# settled. valgrind runs the server's threads one at a time and about a hundred times slower, so its batches differ from a
# real run's: compare builds with this, and the machine's throughput with steady.sh and storekit2.sh. Crypto is
# counted without the CPU's SHA and wide-multiply instructions (OpenSSL takes its plain code under valgrind): read
# libcrypto's share as an upper bound.
#   BENCH_CALLGRIND_LOADS="notifications receipts"  BENCH_CALLGRIND_SMALL=300  BENCH_CALLGRIND_LARGE=1300
#   BENCH_CALLGRIND_TOP=30  BENCH_CALLGRIND_CONNECTIONS=32  STOREKEEPER_BIN=<binary to measure>
set -euo pipefail
cd "$(dirname "$0")/.."
LOADS=${BENCH_CALLGRIND_LOADS:-"notifications receipts"}
SMALL=${BENCH_CALLGRIND_SMALL:-300}
LARGE=${BENCH_CALLGRIND_LARGE:-1300}
TOP=${BENCH_CALLGRIND_TOP:-30}
CONNECTIONS=${BENCH_CALLGRIND_CONNECTIONS:-32}
. bench/lib.sh
command -v valgrind >/dev/null || { echo "valgrind is not installed (make callgrind installs it)"; exit 1; }
[ "$LARGE" -gt "$SMALL" ] || { echo "BENCH_CALLGRIND_LARGE ($LARGE) must be above BENCH_CALLGRIND_SMALL ($SMALL)"; exit 2; }
for load in $LOADS; do
  case $load in notifications|receipts) ;; *) echo "unknown load '$load' (notifications, receipts)"; exit 2 ;; esac
done

# Debian 12's valgrind (3.19) cannot read the DWARF 5 that Swift 6 writes: a copy without debug information keeps
# the symbol table, so functions are still named.
objcopy --strip-debug "$BIN" "$WORK/storekeeper"
cc -O2 -shared -fPIC bench/callgrind/main_queue.c -o "$WORK/main_queue.so"

APPSTORE=$(start appstore "$BIN" appstore serve --data "$WORK/appstore" --port 0 --quiet --tester bench@example.com \
  --catalog com.example.coins=examples/coins.storekit)
[ -n "$APPSTORE" ] || { cat "$WORK/appstore.log"; exit 1; }
shared=$(curl -s "$APPSTORE/admin/v1/apps/com.example.coins" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["sharedSecret"])')
if [[ " $LOADS " == *" receipts "* ]]; then
  "$PYTHON" bench/steady_prepare.py "$APPSTORE" "$WORK" "$LARGE" >/dev/null
fi
if [[ " $LOADS " == *" notifications "* ]]; then
  "$BIN" appstore buy --url "$APPSTORE" --app com.example.coins --product Nada.JPYF02 --account bench@example.com > "$WORK/buy.json"
  "$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))['signedTransaction'])" "$WORK/buy.json" > "$WORK/transaction.jws"
  "$BIN" appstore ca export --jws --url "$APPSTORE" --output "$WORK/jws-root.pem"
fi

# load, count, output file: one server under callgrind, COUNT items, stopped once every job has settled.
measure() {
  local load=$1 count=$2 out=$3 name="cg-$1-$2" url key
  rm -rf "$WORK/$name"; mkdir -p "$WORK/$name"
  LD_PRELOAD="$WORK/main_queue.so" valgrind --tool=callgrind --callgrind-out-file="$out" "$WORK/storekeeper" server serve \
    --data "$WORK/$name" --port 0 --quiet --appstore-url "$APPSTORE" --trust-emulator --admin-key sk_admin_benchmark \
    > "$WORK/$name.log" 2>&1 &
  local pid=$!
  echo $pid > "$WORK/$name.pid"
  for _ in $(seq 1200); do grep -q "listening on" "$WORK/$name.log" && break; sleep 0.1; done
  url=$(sed -n 's/.*listening on //p' "$WORK/$name.log" | head -1)
  [ -n "$url" ] || { cat "$WORK/$name.log"; exit 1; }
  if [ "$load" = notifications ]; then
    BENCH_VERIFIER_SECONDS=0 "$PYTHON" bench/storekit2_load.py "$url" "$APPSTORE" "$WORK" "$count" > /dev/null
    .build/release/storekeeper-bench load --url "$url" --path /v1/notifications/apple --key none --bodies "$WORK/notifications.jsonl" \
      --rate 1000000 --seconds 1 --connections "$CONNECTIONS" > "$WORK/$name.load.json" 2>/dev/null
  else
    key=$(register_app "$url" "$shared")
    head -n "$count" "$WORK/steady-receipts.txt" > "$WORK/$name.bodies"
    .build/release/storekeeper-bench load --url "$url" --key "$key" --bodies "$WORK/$name.bodies" \
      --rate 1000000 --seconds 1 --connections "$CONNECTIONS" > "$WORK/$name.load.json" 2>/dev/null
  fi
  # Every job settled, read from the database beside the server (a request would be counted too).
  "$PYTHON" - "$WORK/$name/server.sqlite" "$WORK/$name.load.json" "$count" <<'PY'
import json, sqlite3, sys, time
load = json.load(open(sys.argv[2]))
if load["accepted"] != int(sys.argv[3]):
    raise SystemExit(f"only {load['accepted']} of {sys.argv[3]} accepted: {load}")
database = sqlite3.connect(f"file:{sys.argv[1]}?mode=ro", uri=True)
deadline = time.time() + 600
while database.execute("SELECT count(*) FROM verification_jobs WHERE settled_at IS NULL").fetchone()[0] > 0:
    if time.time() > deadline:
        raise SystemExit("jobs still unsettled after 10 minutes")
    time.sleep(0.5)
PY
  # Stopped by SIGTERM (callgrind writes its counts as the process exits); killed if it has not stopped in two minutes.
  kill -TERM "$pid" 2>/dev/null || true
  for _ in $(seq 1200); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL "$pid" 2>/dev/null || true
  local status=0
  wait "$pid" || status=$?
  rm -f "$WORK/$name.pid"
  [ "$status" = 0 ] || { echo "the server under callgrind ended with status $status:"; tail -20 "$WORK/$name.log"; exit 1; }
}

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/callgrind-$STAMP.txt
{
  echo "# Purchase server instructions per item under callgrind ($(valgrind --version)), $STAMP: $(machine);"
  echo "# $BIN ($(git describe --always --dirty 2>/dev/null || echo unknown)), $SMALL and $LARGE items, $CONNECTIONS connections"
} > "$OUT"
for load in $LOADS; do
  measure "$load" "$SMALL" "$WORK/$load-small.out"
  measure "$load" "$LARGE" "$WORK/$load-large.out"
  "$PYTHON" bench/callgrind_report.py "$load" "$WORK/$load-small.out" "$WORK/$load-large.out" "$SMALL" "$LARGE" "$TOP" | tee -a "$OUT"
  [ -n "${BENCH_CALLGRIND_KEEP:-}" ] && cp "$WORK/$load-small.out" "$WORK/$load-large.out" "$BENCH_CALLGRIND_KEEP"/
done
echo "written: $OUT"
