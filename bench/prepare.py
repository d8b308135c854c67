"""Creates testers and receipts with 1, 100 and 1,000 purchases for the benchmark."""
import http.client
import json
import sys
import urllib.parse

url, work = sys.argv[1], sys.argv[2]
parsed = urllib.parse.urlparse(url)
connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)


def call(method, path, body=None):
    connection.request(method, path, body=json.dumps(body) if body is not None else None, headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{method} {path}: {response.status} {data[:200]!r}")
    return json.loads(data) if data else None


for size in (1, 100, 1000):
    email = f"bench{size}@example.com"
    call("POST", "/admin/v1/accounts", {"email": email})
    device = call("POST", "/device/v1/devices", {"account": email})["id"]
    for index in range(size):
        call("POST", "/device/v1/payments", {"app": "com.example.coins", "device": device, "productId": f"Nada.JPYF0{index % 5 + 1}"})
    receipt = call("GET", f"/device/v1/receipt?app=com.example.coins&device={device}")["receipt"]
    with open(f"{work}/verify-{size}.json", "w") as out:
        json.dump({"receipt-data": receipt}, out)
    answer = call("POST", "/sandbox/verifyReceipt", {"receipt-data": receipt})
    assert answer["status"] == 0 and len(answer["receipt"]["in_app"]) == size, answer.get("status")

call("POST", "/admin/v1/accounts", {"email": "buyer@example.com"})
device = call("POST", "/device/v1/devices", {"account": "buyer@example.com"})["id"]
with open(f"{work}/purchase.json", "w") as out:
    json.dump({"app": "com.example.coins", "device": device, "productId": "Nada.JPYF01"}, out)
