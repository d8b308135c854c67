# Shared by the benchmark scripts: paths, a work directory removed at exit with every process started
# through `start`, and `start` itself. Source it after `set -euo pipefail` from the repository root.
BIN=${STOREKEEPER_BIN:-.build/release/storekeeper}
PYTHON=${PYTHON:-.venv/bin/python}
WORK=$(mktemp -d)
# BENCH_KEEP_LOGS=DIR keeps the servers' logs there.
cleanup() {
  for file in "$WORK"/*.pid; do [ -f "$file" ] && kill "$(cat "$file")" 2>/dev/null; done; wait 2>/dev/null || true
  if [ -n "${BENCH_KEEP_LOGS:-}" ]; then mkdir -p "$BENCH_KEEP_LOGS" && cp "$WORK"/*.log "$BENCH_KEEP_LOGS"/ 2>/dev/null || true; fi
  rm -rf "$WORK"
}
trap cleanup EXIT

start() {  # name, command...: starts a server and echoes its URL (the "listening on" line)
  local name=$1; shift
  "$@" > "$WORK/$name.log" 2>&1 &
  echo $! > "$WORK/$name.pid"
  for _ in $(seq 200); do grep -q "listening on" "$WORK/$name.log" 2>/dev/null && break; sleep 0.1; done
  sed -n 's/.*listening on //p' "$WORK/$name.log" | head -1
}

# server, shared secret, [existing]: registers com.example.coins on a purchase server (or, with `existing`, gives
# the app already there the emulator's shared secret), maps its 20-coin consumable, and echoes a new API key.
register_app() {
  local admin=(-H "Authorization: Bearer sk_admin_benchmark" -H "Content-Type: application/json")
  if [ "${3:-}" = existing ]; then
    curl -sf -X PUT "${admin[@]}" -d "{\"sharedSecret\":\"$2\"}" "$1/admin/v1/apps/com.example.coins" >/dev/null
  else
    curl -sf "${admin[@]}" -d "{\"id\":\"com.example.coins\",\"sharedSecret\":\"$2\"}" "$1/admin/v1/apps" >/dev/null
  fi
  curl -sf -X PUT "${admin[@]}" -d '{"type":"consumable","currency":"coins","amount":20,"price":"0.99","priceCurrency":"USD"}' \
    "$1/admin/v1/apps/com.example.coins/products/Nada.JPYF01" >/dev/null
  curl -s -X POST "${admin[@]}" "$1/admin/v1/apps/com.example.coins/keys" | "$PYTHON" -c 'import json,sys; print(json.load(sys.stdin)["apiKey"])'
}

# PostgreSQL URL, prefix: makes an empty schema for one run and echoes the URL whose search_path is that schema.
new_schema() {
  local schema="$2_$(date +%s%N)"
  psql "$1" -qc "CREATE SCHEMA $schema" >/dev/null
  echo "$1?options=-csearch_path%3D$schema"
}

# A URL from new_schema: drops its schema when its run ends, so autovacuum does not clean the run's tables during
# the next run, on its CPU.
drop_schema() {
  local schema=${1##*search_path%3D}
  psql "${1%%\?*}" -qc "SET client_min_messages = warning; DROP SCHEMA $schema CASCADE" >/dev/null
}

# The machine, for a results file's header: cores, CPU model, memory, and one core's P-256 signature verifications
# per second by OpenSSL's own `speed` (code this project does not change), so that figures from hosts of different
# speed can be told apart: the same container has run three times slower on one day than on another.
machine() {
  local model verify
  model=$(sed -n 's/^model name[[:space:]]*: //p' /proc/cpuinfo | head -1)
  verify=$(openssl speed -seconds 1 ecdsap256 2>/dev/null | awk '/nistp256/ {print $NF}' || true)
  echo "$(nproc) cores (${model:-unknown CPU}), $(awk '/MemTotal/ {printf "%.0f GiB", $2/1048576}' /proc/meminfo), one core verifies ${verify:-?} P-256 signatures/s"
}
