#!/usr/bin/env bash
# Two emulator binaries compared side by side (bench/emulator_ab.py): the emulator's own CPU per one-purchase and
# per 1,000-purchase verification, and per extra purchase, with the ratios B/A. `make bench-ab BASE=<revision>` builds
# the revision and compares it (A) with the working tree's release build (B).
#   bench/emulator_ab.sh BIN_A BIN_B   (BENCH_AB_ROUNDS=20 rounds of 400 one-purchase and 15 thousand-purchase calls each)
set -euo pipefail
cd "$(dirname "$0")/.."
[ $# -eq 2 ] || { echo "usage: bench/emulator_ab.sh BIN_A BIN_B" >&2; exit 2; }
A=$1 B=$2
ROUNDS=${BENCH_AB_ROUNDS:-20}
. bench/lib.sh

PREPARE=$(start prepare "$A" appstore serve --data "$WORK/data" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$PREPARE" ] || { cat "$WORK/prepare.log"; exit 1; }
echo "preparing receipts…"
"$PYTHON" bench/appstore_prepare.py "$PREPARE" "$WORK" 1000 8  # the 100-purchase receipts are not used here
# Stopped, and gone (its store closed) before the copies are taken.
pid=$(cat "$WORK/prepare.pid"); kill "$pid"
for _ in $(seq 300); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
if kill -0 "$pid" 2>/dev/null; then echo "the preparing emulator did not stop within 30 s" >&2; exit 1; fi
rm "$WORK/prepare.pid"
cp -r "$WORK/data" "$WORK/data-a"; cp -r "$WORK/data" "$WORK/data-b"
URL_A=$(start a "$A" appstore serve --data "$WORK/data-a" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
URL_B=$(start b "$B" appstore serve --data "$WORK/data-b" --port 0 --quiet --catalog com.example.coins=examples/coins.storekit)
[ -n "$URL_A" ] && [ -n "$URL_B" ] || { cat "$WORK/a.log" "$WORK/b.log"; exit 1; }

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/emulator-ab-$STAMP.txt
{
  echo "# Two emulators side by side, $STAMP: $(machine)"
  echo "# A: $A ($(sha256sum "$A" | cut -c1-12)$( [ -n "${BENCH_AB_A_LABEL:-}" ] && echo ", $BENCH_AB_A_LABEL"))"
  echo "# B: $B ($(sha256sum "$B" | cut -c1-12)$( [ -n "${BENCH_AB_B_LABEL:-}" ] && echo ", $BENCH_AB_B_LABEL"))"
  echo "# $ROUNDS rounds of 400 one-purchase and 15 thousand-purchase verifications each, on one connection per emulator"
} > "$OUT"
"$PYTHON" bench/emulator_ab.py "$URL_A" "$(cat "$WORK/a.pid")" "$URL_B" "$(cat "$WORK/b.pid")" "$WORK" "$ROUNDS" | tee -a "$OUT"
echo "written: $OUT"
