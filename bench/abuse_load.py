"""Abuse for bench/abuse.sh: measures GET /v1/users/{id} with wrk unloaded, then under 500 slow-header
connections and 50 junk posters (half junk receipts with a valid key, half notifications whose x5c holds
5,000 entries), then uploads real receipts under the same abuse and times them end to end."""
import base64
import http.client
import json
import multiprocessing
import os
import socket
import subprocess
import sys
import threading
import time
import urllib.parse
import urllib.request

server, appstore, bodies_file, abused_file = sys.argv[1:5]
parsed = urllib.parse.urlparse(server)
admin = {"Authorization": "Bearer sk_admin_benchmark", "Content-Type": "application/json"}


def call(method, path, body=None, headers=admin):
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    conn.request(method, path, body=json.dumps(body) if body is not None else None, headers=headers)
    response = conn.getresponse()
    data = response.read()
    conn.close()
    return response.status, (json.loads(data) if data else None)


shared = json.loads(urllib.request.urlopen(appstore + "/admin/v1/apps/com.example.coins").read())["sharedSecret"]
call("POST", "/admin/v1/apps", {"id": "com.example.coins", "sharedSecret": shared})
call("PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF01", {"type": "consumable", "currency": "coins", "amount": 20})
key = call("POST", "/admin/v1/apps/com.example.coins/keys")[1]["apiKey"]
bodies = [line.strip() for line in open(bodies_file) if line.strip()]
abused_bodies = [line.strip() for line in open(abused_file) if line.strip()]
user = json.loads(bodies[0])["appUserId"]
script = os.path.join(os.path.dirname(bodies_file), "user.lua")
with open(script, "w") as out:
    out.write(f'wrk.headers["Authorization"] = "Bearer {key}"\n')


def reads(label):
    result = subprocess.run(["wrk", "-t1", "-c16", "-d8s", "--latency", "-s", script, f"{server}/v1/users/{urllib.parse.quote(user)}"],
                            capture_output=True, text=True).stdout
    rps = float(next(line.split()[1] for line in result.splitlines() if line.startswith("Requests/sec")))
    p99 = next(line.split()[1] for line in result.splitlines() if line.strip().startswith("99%"))
    millis = float(p99[:-2]) if p99.endswith("ms") else float(p99[:-2]) / 1000 if p99.endswith("us") else float(p99[:-1]) * 1000
    print(f"{label:28} GET /v1/users/{{id}}: {rps:8.0f} req/s, p99 {millis:.2f} ms", flush=True)
    return millis


def slow_headers(count, stop):
    """Connections that send a request line, then one header byte every 5 s (under the 15 s idle timeout)."""
    sockets = []
    for _ in range(count):
        try:
            sock = socket.create_connection((parsed.hostname, parsed.port), timeout=5)
            sock.sendall(b"GET /v1/users/x HTTP/1.1\r\nHost: x\r\n")
            sockets.append(sock)
        except OSError:
            pass
    while not stop.is_set():
        for sock in list(sockets):
            try:
                sock.sendall(b"X")
            except OSError:
                sockets.remove(sock)
                try:
                    sockets.append(socket.create_connection((parsed.hostname, parsed.port), timeout=5))
                    sockets[-1].sendall(b"GET /v1/users/x HTTP/1.1\r\nHost: x\r\n")
                except OSError:
                    pass
        stop.wait(5)
    for sock in sockets:
        sock.close()


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


JUNK_RECEIPT = json.dumps({"appUserId": "junk", "receiptData": base64.b64encode(os.urandom(3000)).decode()}).encode()
FLOOD_HEADER = b64url(json.dumps({"alg": "ES256", "x5c": ["MIIBkTCB+wIJAO"] * 5000}).encode())
NOTIFICATION = json.dumps({"signedPayload": FLOOD_HEADER + "." + b64url(b'{"notificationUUID":"x","notificationType":"TEST","signedDate":1}') + ".AAAA"}).encode()


def junk_poster(kind, stop_at, counter):
    """One client posting junk as fast as the server answers it, on a kept-alive connection."""
    path, body, headers = (("/v1/receipts", JUNK_RECEIPT, {"Authorization": "Bearer " + key, "Content-Type": "application/json"}) if kind == "receipt"
                           else ("/v1/notifications/apple", NOTIFICATION, {"Content-Type": "application/json"}))
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)
    while time.time() < stop_at:
        try:
            conn.request("POST", path, body=body, headers=headers)
            conn.getresponse().read()
            with counter.get_lock():
                counter.value += 1
        except (OSError, http.client.HTTPException):
            conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=30)


def posters(count, seconds, counter):
    stop_at = time.time() + seconds
    threads = [threading.Thread(target=junk_poster, args=(os.environ.get("ABUSE_KIND") or ("receipt" if i % 2 == 0 else "notification"), stop_at, counter)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()


def upload_all(bodies):
    """Uploads on one kept-alive connection and waits until every verification settled; returns the seconds."""
    started = time.time()
    conn = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)
    headers = {"Authorization": "Bearer " + key, "Content-Type": "application/json"}
    for body in bodies:
        conn.request("POST", "/v1/receipts", body=body, headers=headers)
        conn.getresponse().read()
    while True:
        _, jobs = call("GET", "/admin/v1/jobs?limit=1&app=com.example.coins")
        counts = jobs["counts"]
        if counts.get("pending", 0) + counts.get("verifying", 0) + counts.get("timed_out", 0) == 0:
            break
        time.sleep(0.05)
    return time.time() - started


quiet = reads("unloaded")
quiet_elapsed = upload_all(bodies)
print(f"{'unloaded':28} receipts end to end: {len(bodies) / quiet_elapsed:8.0f}/s ({len(bodies)} receipts, one connection)", flush=True)
stop = threading.Event()
slow = threading.Thread(target=slow_headers, args=(int(os.environ.get("ABUSE_SLOW", "500")), stop))
slow.start()
time.sleep(2)
counter = multiprocessing.Value("i", 0)
abuse_seconds = 60
posters_per_process = int(os.environ.get("ABUSE_POSTERS", "50")) // 2
processes = [multiprocessing.Process(target=posters, args=(posters_per_process, abuse_seconds, counter)) for _ in range(2)]
for process in processes:
    process.start()
time.sleep(2)
loaded = reads("500 slow + 50 junk posters")
elapsed = upload_all(abused_bodies)
junk_rate = counter.value
for process in processes:
    process.terminate()
stop.set()
slow.join()
print(f"{'under abuse':28} p99 ratio to unloaded: {loaded / quiet:.2f}× (aim ≤ 2×)")
print(f"{'under abuse':28} receipts end to end: {len(abused_bodies) / elapsed:8.0f}/s ({len(abused_bodies)} receipts, {elapsed:.1f} s; "
      f"{len(abused_bodies) / elapsed / (len(bodies) / quiet_elapsed):.2f}× unloaded); junk answered: {junk_rate} requests")
