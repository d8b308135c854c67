"""Times GET /admin/v1/apps/{app}/metrics over a year, by day, week and month, on the server given.

usage: metrics_load.py SERVER_URL APP [REQUESTS]
"""
import http.client
import json
import statistics
import sys
import time
import urllib.parse

server, app = sys.argv[1], sys.argv[2]
requests = int(sys.argv[3]) if len(sys.argv) > 3 else 30
url = urllib.parse.urlparse(server)
connection = http.client.HTTPConnection(url.hostname, url.port)
headers = {"Authorization": "Bearer sk_admin_benchmark"}
now = time.time()
year_ago = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(now - 365 * 86400))
today = time.strftime("%Y-%m-%dT00:00:00Z", time.gmtime(now + 86400))

def ask(interval):
    started = time.perf_counter()
    connection.request("GET", f"/admin/v1/apps/{app}/metrics?from={year_ago}&to={today}&interval={interval}", headers=headers)
    response = connection.getresponse()
    body = response.read()
    return response.status, time.perf_counter() - started, body

for interval in ["day", "week", "month"]:
    times = []
    for _ in range(requests):
        status, elapsed, body = ask(interval)
        if status != 200:
            sys.exit(f"metrics answered {status}: {body[:300]!r}")
        times.append(elapsed * 1000)
    answer = json.loads(body)
    intervals = answer.get("intervals", answer) if isinstance(answer, dict) else answer
    last = intervals[-1]
    times.sort()
    p99 = times[min(len(times) - 1, int(len(times) * 0.99))]
    print(f"metrics for a year by {interval} ({len(intervals)} intervals): p50 {statistics.median(times):.1f} ms, p99 {p99:.1f} ms, "
          f"max {times[-1]:.1f} ms over {requests} requests (active now {last['activeSubscriptions']:,}, MRR {last['mrr']})")

# The console's pages on the same ledger, signed in as an operator (created by metrics.sh), each asked 10 times.
email, password = "bench@example.com", "benchmark-password"
body = urllib.parse.urlencode({"email": email, "password": password})
connection.request("POST", "/console/login", body=body, headers={"Content-Type": "application/x-www-form-urlencoded"})
response = connection.getresponse()
response.read()
cookie = (response.getheader("Set-Cookie") or "").split(";")[0]
if response.status != 303 or not cookie:
    sys.exit(f"console sign-in answered {response.status}")
pages = [("overview", "/console"), ("customers search", "/console/customers?query=user-0000004"),
         ("customer", f"/console/customers/{app}/user-00000042"), ("transactions", "/console/transactions"),
         ("metrics by day", "/console/metrics?interval=day"), ("metrics by month", "/console/metrics?interval=month"),
         ("jobs", "/console/jobs"), ("webhooks", "/console/webhooks"), ("settings", "/console/settings")]
for name, path in pages:
    times = []
    for _ in range(10):
        started = time.perf_counter()
        connection.request("GET", path, headers={"Cookie": cookie})
        response = connection.getresponse()
        page = response.read()
        times.append((time.perf_counter() - started) * 1000)
        if response.status != 200:
            sys.exit(f"{path} answered {response.status}: {page[:200]!r}")
    times.sort()
    print(f"console {name}: p50 {statistics.median(times):.1f} ms, max {times[-1]:.1f} ms ({len(page):,} bytes)")
