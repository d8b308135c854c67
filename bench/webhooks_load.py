"""Webhook delivery under load: receipts settled per second without and then with a webhook endpoint (the
cost of writing events with the change), events delivered per second to a local receiver while settling and
draining, and the delay from settlement (occurredAt) to arrival, p50 and p99."""
import http.client
import json
import sys
import time
import urllib.parse
import urllib.request

import receipt_load

server, appstore, listener, work = sys.argv[1:5]
parsed = urllib.parse.urlparse(server)
admin = {"Authorization": "Bearer sk_admin_benchmark", "Content-Type": "application/json"}
setup = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)


def call(method, path, body=None):
    setup.request(method, path, body=json.dumps(body) if body is not None else None, headers=admin)
    response = setup.getresponse()
    data = response.read()
    return response.status, (json.loads(data) if data else None)


shared = json.loads(urllib.request.urlopen(appstore + "/admin/v1/apps/com.example.coins").read())["sharedSecret"]
call("POST", "/admin/v1/apps", {"id": "com.example.coins", "sharedSecret": shared})
call("PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF01", {"type": "consumable", "currency": "coins", "amount": 20})
key = call("POST", "/admin/v1/apps/com.example.coins/keys")[1]["apiKey"]


def settle(name):
    bodies = [line.strip().encode() for line in open(f"{work}/receipts-{name}.txt") if line.strip()]
    started = time.time()
    failures = receipt_load.upload_all(parsed.hostname, parsed.port, key, bodies)
    receipt_load.wait_settled(call)
    return len(bodies), time.time() - started, failures


count, plain, _ = settle("fast")
status, created = call("POST", "/admin/v1/apps/com.example.coins/webhooks", {"url": listener})
assert status == 201, created
count, hooked, failures = settle("slow")
settled_at = time.time()
expected = 2 * count  # CONSUMABLE_PURCHASE and BALANCE_CHANGED per receipt
deadline = time.time() + 300
while True:
    stats = json.loads(urllib.request.urlopen(listener + "stats").read())
    if stats["unique"] >= expected or time.time() > deadline:
        break
    time.sleep(0.05)
span = max((stats["lastAt"] - stats["firstAt"]) / 1000, 0.001)
print(f"settlement without an endpoint: {count / plain:7.0f} receipts/s; with one: {count / hooked:7.0f} receipts/s "
      f"(ratio {plain / hooked:.2f}: events are written in the settlement's transaction)")
print(f"webhook events delivered: {stats['unique']} of {expected} ({stats['received'] - stats['unique']} duplicates, "
      f"{len(failures)} refused uploads) at {stats['unique'] / span:7.0f} events/s, "
      f"last one {max(0.0, stats['lastAt'] / 1000 - settled_at):.1f} s after the last settlement")
print(f"webhook delay from the change to arrival: p50 {stats['delayP50Ms']} ms, p99 {stats['delayP99Ms']} ms")
