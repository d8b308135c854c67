"""Submits every receipt (64 keep-alive connections), then waits until all verifications settle.
Prints receipts fully processed per second, then GET /v1/users/{id} figures from wrk."""
import http.client
import json
import multiprocessing
import os
import re
import socket
import subprocess
import sys
import threading
import time
import urllib.parse

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


import urllib.request

setup = connection()
shared = json.loads(urllib.request.urlopen(appstore + "/admin/v1/apps/com.example.coins").read())["sharedSecret"]
call(setup, "POST", "/admin/v1/apps", {"id": "com.example.coins", "sharedSecret": shared})
call(setup, "PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF01", {"type": "consumable", "currency": "coins", "amount": 20, "price": "0.99", "priceCurrency": "USD"})
status, created = call(setup, "POST", "/admin/v1/apps/com.example.coins/keys")
key = created["apiKey"]
bodies = [line.strip().encode() for line in open(bodies_file) if line.strip()]
failures = []


def submit(chunk):
    """One process: eight keep-alive connections (threads) writing prepared request bytes on raw
    sockets (http.client would cost the load generator more CPU than the server spends); returns
    the statuses that were not 202."""
    bad = []
    head = (f"POST /v1/receipts HTTP/1.1\r\nHost: {parsed.hostname}:{parsed.port}\r\nAuthorization: Bearer {key}\r\n"
            "Content-Type: application/json\r\nContent-Length: %d\r\n\r\n").encode()
    length_pattern = re.compile(rb"(?i)\r\ncontent-length: *(\d+)")

    def run(part):
        sock = socket.create_connection((parsed.hostname, parsed.port))
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        buffer = b""
        for body in part:
            sock.sendall(head % len(body) + body)
            while True:
                end = buffer.find(b"\r\n\r\n")
                if end >= 0:
                    length = int(length_pattern.search(buffer, 0, end + 2).group(1))
                    if len(buffer) >= end + 4 + length:
                        break
                received = sock.recv(65536)
                if not received:
                    raise ConnectionError("server closed the connection")
                buffer += received
            status = int(buffer[9:12])
            buffer = buffer[end + 4 + length:]
            if status != 202:
                bad.append(status)
        sock.close()

    threads = [threading.Thread(target=run, args=(chunk[i::8],)) for i in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    return bad


started = time.time()
# Processes, not threads alone: one Python process cannot send requests as fast as the server takes them.
with multiprocessing.Pool(8) as pool:
    for bad in pool.map(submit, [bodies[i::8] for i in range(8)]):
        failures += bad
accepted = time.time() - started
while True:
    status, jobs = call(setup, "GET", "/admin/v1/jobs?limit=1")
    counts = jobs["counts"]
    if counts.get("pending", 0) + counts.get("verifying", 0) + counts.get("timed_out", 0) == 0:
        break
    time.sleep(0.05)
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
