#!/usr/bin/env bash
# Subscription metrics on a grown ledger (SQLite): METRICS_ROWS ledger rows (default ten million) over METRICS_USERS
# users (default one million), written by bench/generate_ledger.py; how long the server takes to build the daily
# rollup from it, and how long a year's metrics take by day, week and month. The generated database is kept
# under bench/cache/ (git-ignored) and reused while the schema and the generator are unchanged.
set -euo pipefail
cd "$(dirname "$0")/.."
ROWS=${METRICS_ROWS:-10000000}
USERS=${METRICS_USERS:-1000000}
APP=com.example.magazine
. bench/lib.sh

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/metrics-$STAMP.txt
echo "# Metrics benchmark, $STAMP ($(machine)); server and client on this machine" > "$OUT"
# Keyed by the generator only: the server migrates an older database forward when it starts.
VERSION=$(sha256sum bench/generate_ledger.py | cut -c1-12)
CACHE=bench/cache/metrics-$ROWS-$USERS-$VERSION
serve() { start "server-$1" "$BIN" server serve --data "$CACHE" --port 0 --quiet --admin-key sk_admin_benchmark; }
stop() { kill "$(cat "$WORK/server-$1.pid")"; wait "$(cat "$WORK/server-$1.pid")" 2>/dev/null || true; }

if [ ! -f "$CACHE/ready" ]; then
  rm -rf bench/cache/metrics-"$ROWS"-"$USERS"-* && mkdir -p "$CACHE"
  SERVER=$(serve setup)
  [ -n "$SERVER" ] || { cat "$WORK/server-setup.log"; exit 1; }
  curl -sf -H "Authorization: Bearer sk_admin_benchmark" -H "Content-Type: application/json" -d "{\"id\": \"$APP\"}" "$SERVER/admin/v1/apps" >/dev/null
  stop setup
  echo "generating $ROWS ledger rows for $USERS users…"
  started=$(date +%s.%N)
  "$PYTHON" bench/generate_ledger.py "$CACHE/server.sqlite" "$APP" "$USERS" "$ROWS" | tee -a "$OUT"
  echo "generator: $(echo "$(date +%s.%N) - $started" | bc | xargs printf '%.0f') s" | tee -a "$OUT"
  started=$(date +%s.%N)
  SERVER=$(serve build)
  # The worker builds the rollup; metrics answer 503 metrics_rebuilding until it is nearly done.
  until [ "$(curl -s -o /dev/null -w '%{http_code}' -H "Authorization: Bearer sk_admin_benchmark" \
      "$SERVER/admin/v1/apps/$APP/metrics?from=2026-01-01T00:00:00Z&to=2026-01-02T00:00:00Z")" = 200 ]; do sleep 2; done
  seconds=$(echo "$(date +%s.%N) - $started" | bc)
  chains=$("$PYTHON" -c "import sqlite3, sys; print(sqlite3.connect(sys.argv[1]).execute('SELECT COUNT(*) FROM metrics_chains').fetchone()[0])" \
    "$CACHE/server.sqlite")
  printf 'rollup built from the ledger in %.0f s (%.0f chains/s)\n' "$seconds" "$(echo "$chains / $seconds" | bc -l)" | tee -a "$OUT"
  stop build
  touch "$CACHE/ready"
else
  echo "reusing the generated ledger in $CACHE ($ROWS rows)" | tee -a "$OUT"
fi
echo "database: $(du -sh "$CACHE/server.sqlite" | cut -f1)" | tee -a "$OUT"
SERVER=$(serve read)
[ -n "$SERVER" ] || { cat "$WORK/server-read.log"; exit 1; }
echo benchmark-password | "$BIN" server operator add bench@example.com --role admin --password-stdin --url "$SERVER" \
  --admin-key sk_admin_benchmark >/dev/null
"$PYTHON" bench/metrics_load.py "$SERVER" "$APP" 30 | tee -a "$OUT"
stop read
echo "written: $OUT"
