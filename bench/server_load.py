"""Submits every receipt (64 keep-alive connections), then waits until all verifications settle.
Prints receipts fully processed per second, then GET /v1/users/{id} figures from wrk."""
import http.client
import json
import os
import subprocess
import sys
import time
import urllib.parse
import urllib.request

import receipt_load

server, appstore, bodies_file, engine, latency = sys.argv[1:6]
parsed = urllib.parse.urlparse(server)
admin = {"Authorization": "Bearer sk_admin_benchmark", "Content-Type": "application/json"}


def connection():
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)


def call(conn, method, path, body=None, headers=admin):
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    return response.status, (json.loads(data) if data else None)


setup = connection()
shared = json.loads(urllib.request.urlopen(appstore + "/admin/v1/apps/com.example.coins").read())["sharedSecret"]
call(setup, "POST", "/admin/v1/apps", {"id": "com.example.coins", "sharedSecret": shared})
call(setup, "PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF01", {"type": "consumable", "currency": "coins", "amount": 20, "price": "0.99", "priceCurrency": "USD"})
status, created = call(setup, "POST", "/admin/v1/apps/com.example.coins/keys")
key = created["apiKey"]
bodies = [line.strip().encode() for line in open(bodies_file) if line.strip()]

started = time.time()
failures = receipt_load.upload_all(parsed.hostname, parsed.port, key, bodies)
accepted = time.time() - started
counts = receipt_load.wait_settled(lambda method, path: call(setup, method, path))
elapsed = time.time() - started
verified = counts.get("verified", 0)
label = f"{engine:8} latency {latency:6}"
print(f"{label} receipts end to end: {len(bodies) / elapsed:8.0f}/s ({verified} verified, {len(failures)} refused uploads, "
      f"accepted at {len(bodies) / accepted:.0f}/s, {elapsed:.1f} s)")
if latency == "0":
    time.sleep(2)
    user = json.loads(bodies[0])["appUserId"]
    script = os.path.join(os.path.dirname(bodies_file), "user.lua")
    with open(script, "w") as out:
        out.write(f'wrk.headers["Authorization"] = "Bearer {key}"\n')
    result = subprocess.run(["wrk", "-t2", "-c64", "-d5s", "--latency", "-s", script, f"{server}/v1/users/{urllib.parse.quote(user)}"],
                            capture_output=True, text=True).stdout
    rps = next((line.split()[1] for line in result.splitlines() if line.startswith("Requests/sec")), "?")
    p50 = next((line.split()[1] for line in result.splitlines() if line.strip().startswith("50%")), "?")
    p99 = next((line.split()[1] for line in result.splitlines() if line.strip().startswith("99%")), "?")
    print(f"{label} GET /v1/users/{{id}}: {rps} req/s, p50 {p50}, p99 {p99}")
