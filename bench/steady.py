"""Steady state of the purchase server: distinct receipts offered at a fixed rate (open loop, storekeeper-bench load)
for a warm-up and a measured window; what the server did in the window is read from its own job table afterwards.

usage: steady.py SERVER_URL SERVER_PID KEY BODIES RATE WARMUP WINDOW DB LABEL
DB is `sqlite:PATH` or `postgres:URL` (with its search_path). Several server processes on one database are given as
comma-separated URLs and pids: the load is spread over them, and CPU, memory and verifications in flight are summed.
Prints one line of figures and its JSON."""
import json
import os
import subprocess
import sys
import threading
import time
import urllib.request

servers, pids, key, bodies, rate, warmup, window, database, label = sys.argv[1:10]
servers, pids = servers.split(","), pids.split(",")
rate, warmup, window = float(rate), float(warmup), float(window)
BENCH = os.environ.get("STOREKEEPER_BENCH_BIN", ".build/release/storekeeper-bench")
# Connections the load generator keeps open (uploads in progress at once, as devices would): BENCH_CONNECTIONS.
CONNECTIONS = os.environ.get("BENCH_CONNECTIONS", "64")
TICKS = os.sysconf("SC_CLK_TCK")


def cpu_seconds():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / TICKS
    return total


def rss_kib():
    total = 0
    for pid in pids:
        with open(f"/proc/{pid}/status") as status:
            total += next(int(line.split()[1]) for line in status if line.startswith("VmRSS:"))
    return total


def in_flight():
    total = 0
    for server in servers:
        with urllib.request.urlopen(server + "/health", timeout=5) as response:
            total += int(json.loads(response.read())["inFlight"])
    return total


def query(sql):
    kind, _, target = database.partition(":")
    if kind == "sqlite":
        out = subprocess.run(["sqlite3", "-separator", " ", target, sql], capture_output=True, text=True, check=True).stdout
    else:
        out = subprocess.run(["psql", target, "-qAtF", " ", "-c", sql], capture_output=True, text=True, check=True).stdout
    return [line.split() for line in out.splitlines() if line.strip()]


samples = []  # (time, in flight, rss KiB, cpu seconds)
stop = threading.Event()


def sample():
    while not stop.is_set():
        try:
            samples.append((time.time(), in_flight(), rss_kib(), cpu_seconds()))
        except OSError:
            pass
        stop.wait(0.5)


baseline_rss = rss_kib()
sampler = threading.Thread(target=sample, daemon=True)
started = time.time()
sampler.start()
load = subprocess.run([BENCH, "load", "--url", ",".join(servers), "--key", key, "--bodies", bodies, "--rate", str(rate),
                       "--seconds", str(warmup + window), "--connections", CONNECTIONS], capture_output=True, text=True)
if load.returncode != 0:
    raise SystemExit(load.stderr)
offered = json.loads(load.stdout)
# Let what was accepted settle (up to a minute), so time to grant covers every job of the window.
deadline = time.time() + 60
while time.time() < deadline and int(query("SELECT count(*) FROM verification_jobs WHERE settled_at IS NULL")[0][0]) > 0:
    time.sleep(0.5)
stop.set()
sampler.join()

# The window is counted from when the generator began offering (it reads its bodies first).
begin_ms, end_ms = int((offered["start_unix"] + warmup) * 1000), int((offered["start_unix"] + warmup + window) * 1000)
settled_in_window = int(query(f"SELECT count(*) FROM verification_jobs WHERE settled_at >= {begin_ms} AND settled_at < {end_ms}")[0][0])
grants = sorted(float("inf") if row[1] == "" else int(row[1]) - int(row[0]) for row in
                ((r + [""])[:2] for r in query(f"SELECT created_at, settled_at FROM verification_jobs WHERE created_at >= {begin_ms} AND created_at < {end_ms}")))
unsettled = int(query(f"SELECT count(*) FROM verification_jobs WHERE created_at >= {begin_ms} AND created_at < {end_ms} AND settled_at IS NULL")[0][0])


def pick(fraction):
    if not grants:
        return float("nan")
    return grants[min(len(grants) - 1, int(len(grants) * fraction))]


steady = [s for s in samples if begin_ms / 1000 <= s[0] < end_ms / 1000]
cpu = (steady[-1][3] - steady[0][3]) if len(steady) > 1 else float("nan")
peak = max(steady, key=lambda s: s[1]) if steady else (0, 0, baseline_rss, 0)
result = {
    "label": label, "cores": os.cpu_count(), "offered_per_second": rate, "completed_per_second": settled_in_window / window,
    "accepted": offered["accepted"], "refused": offered["refused"], "upload_answer_p99_ms": round(offered["answer_p99_ms"], 1),
    "in_flight_mean": round(sum(s[1] for s in steady) / max(len(steady), 1)), "in_flight_max": max((s[1] for s in steady), default=0),
    "grant_p50_ms": pick(0.5), "grant_p99_ms": pick(0.99), "unsettled": unsettled,
    "server_cpu_ms_per_receipt": round(cpu * 1000 / max(settled_in_window, 1), 3),
    "rss_mib_peak": round(peak[2] / 1024, 1),
    "kib_per_verification_in_flight": round((peak[2] - baseline_rss) / peak[1], 1) if peak[1] > 100 else None,
}
print(f"{label:28} offered {rate:6.0f}/s  completed {result['completed_per_second']:7.0f}/s  in flight {result['in_flight_mean']:6} "
      f"(max {result['in_flight_max']})  grant p50 {result['grant_p50_ms']:.0f} ms p99 {result['grant_p99_ms']:.0f} ms  "
      f"cpu {result['server_cpu_ms_per_receipt']} ms/receipt  rss {result['rss_mib_peak']} MiB  "
      f"{result['kib_per_verification_in_flight']} KiB/in-flight  refused {result['refused']} unsettled {unsettled}")
print("json " + json.dumps(result, sort_keys=True))
