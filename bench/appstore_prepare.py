"""Distinct verifyReceipt bodies for the emulator benchmark: one purchase each from 10,000 testers, and refreshed
receipts (a new opaque value, hash and signature each time) of one tester with 100 and one with 1,000 purchases.
Writes WORK/bodies-{1,100,1000}.txt (one JSON body per line) and WORK/bare.json (a one-purchase body).
usage: appstore_prepare.py URL WORK [ONE_PURCHASE_COUNT [HUNDRED_PURCHASE_COUNT]] (10,000 each by default)"""
import http.client
import json
import multiprocessing
import sys
import urllib.parse

url, work = sys.argv[1], sys.argv[2]
counts = {1: int(sys.argv[3]) if len(sys.argv) > 3 else 10_000, 100: int(sys.argv[4]) if len(sys.argv) > 4 else 10_000, 1000: 1_000}
parsed = urllib.parse.urlparse(url)


def connect():
    return http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120)


def call(connection, method, path, body=None):
    connection.request(method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data) if data else None


def one_purchase(indices):
    connection, lines = connect(), []
    for index in indices:
        email = f"single{index}@bench.example.com"
        call(connection, "POST", "/admin/v1/accounts", {"email": email})
        bought = call(connection, "POST", "/admin/v1/purchases", {"app": "com.example.coins", "product": "Nada.JPYF01", "account": email})
        lines.append(json.dumps({"receipt-data": bought["receipt"]}))
    return lines


def refreshed(args):
    device, count = args
    connection = connect()
    return [json.dumps({"receipt-data": call(connection, "GET", f"/device/v1/receipt?app=com.example.coins&device={device}&refresh=true")["receipt"]})
            for _ in range(count)]


with multiprocessing.Pool(8) as pool:
    single = [line for part in pool.map(one_purchase, [range(i, counts[1], 8) for i in range(8)]) for line in part]
    with open(f"{work}/bodies-1.txt", "w") as out:
        out.write("\n".join(single) + "\n")
    with open(f"{work}/bare.json", "w") as out:
        out.write(single[0])
    setup = connect()
    for size in (100, 1000):
        email = f"many{size}@bench.example.com"
        call(setup, "POST", "/admin/v1/accounts", {"email": email})
        device = call(setup, "POST", "/device/v1/devices", {"account": email})["id"]
        for index in range(size):
            call(setup, "POST", "/device/v1/payments", {"app": "com.example.coins", "device": device, "productId": f"Nada.JPYF0{index % 5 + 1}"})
        parts = pool.map(refreshed, [(device, counts[size] // 8)] * 8)
        bodies = [line for part in parts for line in part]
        assert len(set(bodies)) == len(bodies), "refreshed receipts must differ"
        setup = connect()  # the emulator closes connections left idle while the pool worked
        answer = call(setup, "POST", "/sandbox/verifyReceipt", json.loads(bodies[0]))
        assert answer["status"] == 0 and len(answer["receipt"]["in_app"]) == size, answer.get("status")
        with open(f"{work}/bodies-{size}.txt", "w") as out:
            out.write("\n".join(bodies) + "\n")
print(f"prepared {len(single)} one-purchase receipts and {counts[100]} + {counts[1000]} refreshed ones")
