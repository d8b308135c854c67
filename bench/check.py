"""Per-receipt cost by size on one connection, each request a different receipt: the cost of each extra purchase.

Two figures: the wall time a client waits (which includes this Python client writing half a megabyte of request and
reading the answer), and the emulator's own CPU time (user and system, from /proc), which is the emulator's cost alone."""
import http.client
import os
import sys
import time
import urllib.parse

url, work = sys.argv[1], sys.argv[2]
parsed = urllib.parse.urlparse(url)
connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
pid = open(f"{work}/appstore.pid").read().strip()
ticks = os.sysconf("SC_CLK_TCK")


def emulator_cpu():
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


# The wrk run before this one may leave requests in flight: wait until the emulator's CPU time stops moving.
settle_deadline = time.monotonic() + 10
previous = emulator_cpu()
while time.monotonic() < settle_deadline:
    time.sleep(0.3)
    current = emulator_cpu()
    if current == previous:
        break
    previous = current

walls, cpus = {}, {}
for size in (1, 100, 1000):
    bodies = [line for line in open(f"{work}/bodies-{size}.txt").read().splitlines() if line]
    rounds = min(len(bodies), 400 if size < 1000 else 100)
    started, cpu_before = time.perf_counter(), emulator_cpu()
    for body in bodies[:rounds]:
        connection.request("POST", "/sandbox/verifyReceipt", body=body, headers={"Content-Type": "application/json"})
        connection.getresponse().read()
    walls[size] = (time.perf_counter() - started) / rounds * 1000
    cpus[size] = (emulator_cpu() - cpu_before) / rounds * 1000
print("single-connection time per receipt: " + ", ".join(f"{size} purchases {cost:.2f} ms" for size, cost in walls.items()))
print("emulator CPU per receipt: " + ", ".join(f"{size} purchases {cost:.2f} ms" for size, cost in cpus.items()))
print(f"per extra purchase: {(walls[1000] - walls[1]) / 999 * 1000:.1f} µs (1→1000), "
      f"{(walls[1000] - walls[100]) / 900 * 1000:.1f} µs (100→1000); "
      f"emulator CPU {(cpus[1000] - cpus[1]) / 999 * 1000:.1f} µs (1→1000), {(cpus[1000] - cpus[100]) / 900 * 1000:.1f} µs (100→1000)")
