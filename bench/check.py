"""Per-receipt cost by size, measured sequentially (one connection), to show linear growth."""
import http.client
import json
import sys
import time
import urllib.parse

url, work = sys.argv[1], sys.argv[2]
parsed = urllib.parse.urlparse(url)
connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
costs = {}
for size in (1, 100, 1000):
    body = open(f"{work}/verify-{size}.json").read()
    rounds = 200 if size < 1000 else 50
    started = time.perf_counter()
    for _ in range(rounds):
        connection.request("POST", "/sandbox/verifyReceipt", body=body, headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        response.read()
    costs[size] = (time.perf_counter() - started) / rounds * 1000
print("single-connection time per receipt: " + ", ".join(f"{size} purchases {cost:.2f} ms" for size, cost in costs.items()))
print(f"per-purchase growth: 100→1000 adds {(costs[1000] - costs[100]) / 900 * 1000:.1f} µs per purchase "
      f"(1→100: {(costs[100] - costs[1]) / 99 * 1000:.1f} µs)")
