"""Per-receipt cost by size on one connection, each request a different receipt: the cost of each extra purchase."""
import http.client
import sys
import time
import urllib.parse

url, work = sys.argv[1], sys.argv[2]
parsed = urllib.parse.urlparse(url)
connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
costs = {}
for size in (1, 100, 1000):
    bodies = [line for line in open(f"{work}/bodies-{size}.txt").read().splitlines() if line]
    rounds = min(len(bodies), 400 if size < 1000 else 100)
    started = time.perf_counter()
    for body in bodies[:rounds]:
        connection.request("POST", "/sandbox/verifyReceipt", body=body, headers={"Content-Type": "application/json"})
        connection.getresponse().read()
    costs[size] = (time.perf_counter() - started) / rounds * 1000
print("single-connection time per receipt: " + ", ".join(f"{size} purchases {cost:.2f} ms" for size, cost in costs.items()))
print(f"per extra purchase: {(costs[1000] - costs[1]) / 999 * 1000:.1f} µs (1→1000), "
      f"{(costs[1000] - costs[100]) / 900 * 1000:.1f} µs (100→1000)")
