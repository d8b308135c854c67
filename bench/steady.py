"""Steady state of the purchase server: distinct receipts offered at a fixed rate (open loop, storekeeper-bench load)
for a warm-up and a measured window; what the server did in the window is read from its own job table afterwards.

usage: steady.py SERVER_URL SERVER_PID KEY BODIES RATE WARMUP WINDOW DB LABEL
DB is `sqlite:PATH` or `postgres:URL` (with its search_path). Several server processes on one database are given as
comma-separated URLs and pids: the load is spread over them, and CPU, memory and verifications in flight are summed.
Prints one line of figures and its JSON.

Where the machine's CPU went in the window, per settled receipt: the server, the database (STEADY_DATABASE_PID, the
PostgreSQL postmaster, with every process it started while they run), the emulator (STEADY_APPSTORE_PID), the load
generator, and the whole machine's busy time (steal excluded); the machine's busy and stolen cores. A part whose pid is
not given is left out; the machine's busy time counts everything.

Uploads accepted in the window are counted too. Where they outrun the settlements (the offer is past what the server
settles, and the rest waits in its queue), every part's CPU per settled receipt includes the uploads of receipts not yet
settled, and reads high by up to accepted / completed."""
import json
import math
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
TICKS = os.sysconf("SC_CLK_TCK")
# Connections the load generator keeps open (uploads in progress at once, as devices would): BENCH_CONNECTIONS, else
# one per 20/s offered and at least 64. An open-loop offer must not wait for a free connection: a connection sends its
# next upload only once the last is answered, so C connections offer at most C / (answer time). At 5,000/s an SQLite
# upload's answer took about 13 ms, and 64 connections (at most about 4,900/s) held the offer to 4,389–4,906/s accepted
# (bench/README.md, thirty-fourth round); one per 20/s lets each upload take 50 ms before the offer falls short.
CONNECTIONS = os.environ.get("BENCH_CONNECTIONS") or str(max(64, math.ceil(rate / 20)))


def cpu_by_process(process_ids):
    """User and system CPU seconds of each of these processes that is still running."""
    seconds = {}
    for pid in process_ids:
        try:
            with open(f"/proc/{pid}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        seconds[pid] = (int(fields[11]) + int(fields[12])) / TICKS
    return seconds


def cpu_of(process_ids):
    return sum(cpu_by_process(process_ids).values())


def cpu_seconds():
    return cpu_of(pids)


def children_of(parent):
    """The processes `parent` started (PostgreSQL's backends, its autovacuum workers), and itself."""
    found = [parent]
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as stat:
                    if stat.read().rsplit(")", 1)[1].split()[1] == parent:
                        found.append(entry)
            except OSError:
                pass
    return found


def machine_ticks():
    """Busy and stolen ticks of the whole machine (/proc/stat: user, nice, system, irq, softirq; steal)."""
    with open("/proc/stat") as stat:
        fields = [int(value) for value in stat.readline().split()[1:]]
    return fields[0] + fields[1] + fields[2] + fields[5] + fields[6], fields[7]


# The other processes whose CPU is accounted for, by part.
DATABASE_PID = os.environ.get("STEADY_DATABASE_PID", "")
APPSTORE_PID = os.environ.get("STEADY_APPSTORE_PID", "")
generator = []  # the load generator's pid, once started


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


samples = []  # (time, in flight, rss KiB, cpu seconds, {part: cpu seconds}, (machine busy, steal) ticks)
stop = threading.Event()


def sample():
    while not stop.is_set():
        try:
            # The database by process: its autovacuum workers come and go within a window.
            parts = {"emulator": cpu_of([APPSTORE_PID]) if APPSTORE_PID else None,
                     "database": cpu_by_process(children_of(DATABASE_PID)) if DATABASE_PID else None,
                     "load_generator": cpu_of(generator)}
            samples.append((time.time(), in_flight(), rss_kib(), cpu_seconds(), parts, machine_ticks()))
        except OSError:
            pass
        stop.wait(0.5)


baseline_rss = rss_kib()
sampler = threading.Thread(target=sample, daemon=True)
started = time.time()
sampler.start()
load = subprocess.Popen([BENCH, "load", "--url", ",".join(servers), "--key", key, "--bodies", bodies, "--rate", str(rate),
                         "--seconds", str(warmup + window), "--connections", CONNECTIONS], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
generator.append(str(load.pid))
load_out, load_err = load.communicate()
if load.returncode != 0:
    raise SystemExit(load_err)
offered = json.loads(load_out)
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
accepted_in_window = len(grants)


def pick(fraction):
    if not grants:
        return float("nan")
    return grants[min(len(grants) - 1, int(len(grants) * fraction))]


steady = [s for s in samples if begin_ms / 1000 <= s[0] < end_ms / 1000]
cpu = (steady[-1][3] - steady[0][3]) if len(steady) > 1 else float("nan")
peak = max(steady, key=lambda s: s[1]) if steady else (0, 0, baseline_rss, 0)


def per_receipt(seconds):
    return round(seconds * 1000 / max(settled_in_window, 1), 3)


def database_seconds():
    """The database's CPU between the window's first and last samples: each process from its first sample in the
    window (or its start, when it started inside it) to its last (a process that ended counts up to its last sample)."""
    first, last = steady[0][4]["database"], {}
    for sample in steady:
        last.update(sample[4]["database"])
    return sum(seconds - first.get(pid, 0) for pid, seconds in last.items())


# Where the machine's CPU went in the window, per receipt settled in it (ms), and the machine's busy and stolen cores.
# Every part is measured between the window's first and last samples (up to a second shorter than the window) and
# divided by the receipts settled in the whole window, so each reads up to a few percent low, all alike.
accounting = {"server": per_receipt(cpu) if len(steady) > 1 else None}
accounting["database"] = per_receipt(database_seconds()) if len(steady) > 1 and DATABASE_PID else None
for part in ("emulator", "load_generator"):
    values = [s[4][part] for s in (steady[0], steady[-1])] if len(steady) > 1 else [None]
    accounting[part] = per_receipt(values[-1] - values[0]) if None not in values else None
if len(steady) > 1:
    elapsed = steady[-1][0] - steady[0][0]
    busy, steal = (steady[-1][5][i] - steady[0][5][i] for i in (0, 1))
    accounting["machine"] = per_receipt(busy / TICKS)
    accounting["machine_busy_cores"] = round(busy / TICKS / elapsed, 2)
    accounting["steal_cores"] = round(steal / TICKS / elapsed, 2)
result = {
    "label": label, "cores": os.cpu_count(), "offered_per_second": rate, "completed_per_second": settled_in_window / window,
    "accepted_per_second": accepted_in_window / window,
    "accepted": offered["accepted"], "refused": offered["refused"], "upload_answer_p50_ms": round(offered["answer_p50_ms"], 1), "upload_answer_p99_ms": round(offered["answer_p99_ms"], 1),
    "in_flight_mean": round(sum(s[1] for s in steady) / max(len(steady), 1)), "in_flight_max": max((s[1] for s in steady), default=0),
    "grant_p50_ms": pick(0.5), "grant_p99_ms": pick(0.99), "unsettled": unsettled,
    "server_cpu_ms_per_receipt": round(cpu * 1000 / max(settled_in_window, 1), 3),
    "rss_mib_peak": round(peak[2] / 1024, 1),
    "kib_per_verification_in_flight": round((peak[2] - baseline_rss) / peak[1], 1) if peak[1] > 100 else None,
    "cpu_ms_per_receipt": accounting, "connections": int(CONNECTIONS),
}
shares = "  ".join(f"{name.replace('_', ' ')} {accounting[name]}" for name in ("server", "database", "emulator", "load_generator", "machine")
                   if accounting.get(name) is not None)
print(f"{label:28} offered {rate:6.0f}/s  accepted {result['accepted_per_second']:6.0f}/s  completed {result['completed_per_second']:7.0f}/s  in flight {result['in_flight_mean']:6} "
      f"(max {result['in_flight_max']})  grant p50 {result['grant_p50_ms']:.0f} ms p99 {result['grant_p99_ms']:.0f} ms  "
      f"cpu {result['server_cpu_ms_per_receipt']} ms/receipt  rss {result['rss_mib_peak']} MiB  "
      f"{result['kib_per_verification_in_flight']} KiB/in-flight  refused {result['refused']} unsettled {unsettled}  "
      f"upload answer p50 {result['upload_answer_p50_ms']:.0f} ms p99 {result['upload_answer_p99_ms']:.0f} ms over {CONNECTIONS} connections\n{'':28} cpu ms per receipt: {shares}  "
      f"(machine busy {accounting.get('machine_busy_cores')} of {os.cpu_count()} cores, steal {accounting.get('steal_cores')})")
print("json " + json.dumps(result, sort_keys=True))
