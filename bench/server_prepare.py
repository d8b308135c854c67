"""Makes one-purchase receipts for distinct testers: the fast and the slow benchmark sets."""
import http.client
import json
import sys
import urllib.parse

url, work, fast, slow = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
parsed = urllib.parse.urlparse(url)
connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)


def call(method, path, body):
    connection.request(method, path, body=json.dumps(body), headers={"Content-Type": "application/json"})
    response = connection.getresponse()
    data = response.read()
    if response.status >= 300:
        raise SystemExit(f"{path}: {response.status} {data[:200]!r}")
    return json.loads(data)


for name, count in (("fast", fast), ("slow", slow)):
    with open(f"{work}/receipts-{name}.txt", "w") as out:
        for index in range(count):
            email = f"{name}{index}@bench.example.com"
            call("POST", "/admin/v1/accounts", {"email": email})
            bought = call("POST", "/admin/v1/purchases", {"app": "com.example.coins", "product": "Nada.JPYF01", "account": email})
            out.write(json.dumps({"appUserId": email, "receiptData": bought["receipt"]}) + "\n")
