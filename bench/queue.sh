#!/usr/bin/env bash
# A job queue that has grown (issue 14): what a scrape of GET /metrics and the admin job lists cost with QUEUE_JOBS
# settled jobs kept (default two million: a month at about 2,800 uploads an hour, or 33 minutes at 1,000/s), on
# SQLite and PostgreSQL, against the same server with QUEUE_SMALL jobs (default 1,000: every list still fills its
# 100 rows, so both answer the same amount). Each figure is the median of QUEUE_REPEATS requests; the ratios
# grown/small are printed. Jobs are never pruned, so these reads must cost what waits, not
# what was ever uploaded: the settled states are counted from running totals (state_totals) and lists read each
# state's latest jobs along the index on the state.
set -euo pipefail
cd "$(dirname "$0")/.."
JOBS=${QUEUE_JOBS:-2000000}
SMALL=${QUEUE_SMALL:-1000}
REPEATS=${QUEUE_REPEATS:-9}
ENGINES=${BENCH_ENGINES:-"sqlite postgres"}
. bench/lib.sh

STAMP=$(date -u +%Y-%m-%dT%H-%M-%SZ)
OUT=bench/results/queue-$STAMP.txt
echo "# A grown job queue, $STAMP: $(machine); $JOBS settled jobs (2% rejected, a few dead) against $SMALL; median of $REPEATS requests each" | tee "$OUT"

serve() {  # name, database arguments…: starts a server and echoes its URL
  local name=$1; shift
  start "$name" "$BIN" server serve "$@" --port 0 --quiet --admin-key sk_admin_benchmark
}
stop() { kill "$(cat "$WORK/$1.pid")"; wait "$(cat "$WORK/$1.pid")" 2>/dev/null || true; rm -f "$WORK/$1.pid"; }

# Settled jobs as the worker leaves them (a result each), written straight into the server's tables.
JOB_COLUMNS="id, app_id, app_user_id, kind, state, attempts, next_attempt_at, created_at, updated_at, settled_at, user_authenticated, receipt_size, environment, result"
RESULT='{"granted":[{"transactionId":"1000000000000000","productId":"Nada.JPYF01","quantity":1}],"alreadyOwned":[],"refused":[],"balances":{"coins":20}}'
grow_sqlite() {  # database file, jobs
  "$PYTHON" - "$1" "$2" "$RESULT" "$JOB_COLUMNS" <<'PY'
import sqlite3, sys
path, n, result, columns = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
db = sqlite3.connect(path)
def state(i): return "dead" if i % 1_000_000 == 7 or i == n - 1 else "rejected" if i % 50 == 0 else "verified"
rows = ((f"grown-{i:09d}", "com.example.coins", f"user-{i % 100000}", "purchase", state(i), 1, i, i, i, i, 1, 5000, "Sandbox", result)
        for i in range(n))
db.executemany(f"INSERT INTO verification_jobs ({columns}) VALUES ({', '.join('?' * 14)})", rows)
# What the server's totals would hold had it settled them (the migration counts jobs present when it runs; these came after).
db.execute("INSERT INTO state_totals (subject, state, shard, total) SELECT 'verification_jobs', state, 0, COUNT(*) FROM verification_jobs "
           "WHERE state IN ('verified', 'rejected') GROUP BY state ON CONFLICT DO UPDATE SET total = excluded.total")
db.commit()
PY
}
grow_postgres() {  # URL with its search_path, jobs
  psql "$1" -q -v ON_ERROR_STOP=1 <<SQL
INSERT INTO verification_jobs ($JOB_COLUMNS)
SELECT 'grown-' || lpad(i::text, 9, '0'), 'com.example.coins', 'user-' || (i % 100000), 'purchase',
       CASE WHEN i % 1000000 = 7 OR i = $2 - 1 THEN 'dead' WHEN i % 50 = 0 THEN 'rejected' ELSE 'verified' END, 1, i, i, i, i, 1, 5000, 'Sandbox', '$RESULT'
FROM generate_series(0, $2 - 1) AS i;
INSERT INTO state_totals (subject, state, shard, total)
SELECT 'verification_jobs', state, 0, COUNT(*) FROM verification_jobs WHERE state IN ('verified', 'rejected') GROUP BY state
ON CONFLICT (subject, state, shard) DO UPDATE SET total = excluded.total;
VACUUM ANALYZE verification_jobs;
SQL
}

# server URL, label: the medians of the reads, one line each, and the counts /metrics shows.
READS=("/metrics" "/admin/v1/jobs?limit=100" "/admin/v1/jobs?state=verified&limit=100" "/admin/v1/jobs?state=dead&limit=100"
       "/admin/v1/jobs?app=com.example.coins&limit=100")
measure() {
  "$PYTHON" - "$1" "$2" "$REPEATS" "${READS[@]}" <<'PY'
import statistics, sys, time, urllib.request
url, label, repeats, paths = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
def get(path):
    request = urllib.request.Request(url + path, headers={"Authorization": "Bearer sk_admin_benchmark"})
    start = time.perf_counter()
    with urllib.request.urlopen(request, timeout=600) as response:
        body = response.read()
    return (time.perf_counter() - start) * 1000, body
for path in paths:
    get(path)  # warm
    times = [get(path)[0] for _ in range(repeats)]
    print(f"{label}\t{path}\t{statistics.median(times):.2f}")
counts = [line for line in get("/metrics")[1].decode().splitlines() if line.startswith("storekeeper_verification_jobs{")]
print(f"{label}\tcounts\t{' '.join(line.split('state=')[1].replace('}', '=').replace(chr(34), '').replace(' ', '') for line in counts)}")
PY
}

for engine in $ENGINES; do
  for size in small grown; do
    count=$([ "$size" = grown ] && echo "$JOBS" || echo "$SMALL")
    name="$engine-$size"
    if [ "$engine" = sqlite ]; then
      mkdir -p "$WORK/$name" && chmod 700 "$WORK/$name"
      SERVER=$(serve "$name" --data "$WORK/$name"); stop "$name"
      grow_sqlite "$WORK/$name/server.sqlite" "$count"
      SERVER=$(serve "$name" --data "$WORK/$name")
    else
      PG_URL=${PG_URL:-$(scripts/postgres.sh start)}
      DB=$(new_schema "$PG_URL" queue)
      SERVER=$(serve "$name" --data "$WORK/$name" --database "$DB"); stop "$name"
      grow_postgres "$DB" "$count"
      SERVER=$(serve "$name" --data "$WORK/$name" --database "$DB")
    fi
    measure "$SERVER" "$name" >> "$WORK/figures.tsv"
    stop "$name"
    [ "$engine" = postgres ] && drop_schema "$DB"
  done
done

"$PYTHON" - "$WORK/figures.tsv" <<'PY' | tee -a "$OUT"
import collections, sys
times, counts = collections.defaultdict(dict), {}
for line in open(sys.argv[1]):
    label, path, value = line.rstrip("\n").split("\t")
    if path == "counts": counts[label] = value
    else: times[label][path] = float(value)
for engine in sorted({label.split("-")[0] for label in times}):
    small, grown = times[f"{engine}-small"], times[f"{engine}-grown"]
    print(f"{engine}: counts on the grown database: {counts.get(engine + '-grown', '?')}")
    for path in small:
        print(f"  {path:48s} small {small[path]:8.2f} ms   grown {grown[path]:8.2f} ms   grown/small {grown[path] / small[path]:6.2f}")
PY
echo "written to $OUT"
