"""Two emulators side by side, one per binary, on copies of the same data: batches of verifyReceipt calls alternate
between them (the order flipped every round), and each process's own CPU time is read from /proc around its batches.
The host's speed drifts within minutes, so runs of one binary after the other do not compare; batches a second apart do.

usage: emulator_ab.py URL_A PID_A URL_B PID_B WORK ROUNDS
Prints the emulator CPU per one-purchase and per 1,000-purchase verification of each, the cost per extra purchase and
the ratios B/A."""
import http.client
import os
import sys
import urllib.parse

url_a, pid_a, url_b, pid_b, work, rounds = sys.argv[1:7]
rounds = int(rounds)
ticks = os.sysconf("SC_CLK_TCK")
pids = (pid_a, pid_b)


def connect(url):
    parsed = urllib.parse.urlparse(url)
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)


connections = (connect(url_a), connect(url_b))


def cpu(pid):
    fields = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / ticks


def verify(side, body):
    connections[side].request("POST", "/sandbox/verifyReceipt", body=body, headers={"Content-Type": "application/json"})
    answer = connections[side].getresponse().read()
    if b'"status":0' not in answer:
        raise SystemExit(f"{'AB'[side]}: verifyReceipt did not answer 0: {answer[:200]!r}")


costs = {}
# Batches of about 150 ms of the emulator's CPU each: /proc counts it in 10 ms ticks.
for size, batch in ((1, 400), (1000, 15)):
    bodies = [line for line in open(f"{work}/bodies-{size}.txt").read().splitlines() if line]
    for side in (0, 1):
        for body in bodies[:5]:
            verify(side, body)  # warm-up
    used, count, position = [0.0, 0.0], [0, 0], 5
    for round in range(rounds):
        for side in ((0, 1) if round % 2 == 0 else (1, 0)):
            before = cpu(pids[side])
            for body in bodies[position:position + batch]:
                verify(side, body)
            used[side] += cpu(pids[side]) - before
            count[side] += batch
        position = 5 + (position + batch - 5) % (len(bodies) - batch - 5)
    costs[size] = [used[side] / count[side] * 1e6 for side in (0, 1)]

extra = [(costs[1000][side] - costs[1][side]) / 999 for side in (0, 1)]
for side, name in enumerate("AB"):
    print(f"{name}: emulator CPU per verification: 1 purchase {costs[1][side]:.0f} µs, 1000 purchases {costs[1000][side]:.0f} µs; "
          f"per extra purchase {extra[side]:.2f} µs")
print(f"B/A: 1 purchase {costs[1][1] / costs[1][0]:.3f}, 1000 purchases {costs[1000][1] / costs[1000][0]:.3f}, "
      f"per extra purchase {extra[1] / extra[0]:.3f}")
