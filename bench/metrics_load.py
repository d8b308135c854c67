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
