"""Distinct one-purchase receipts for the steady-state benchmark: COUNT testers buy one consumable each.
Writes WORK/steady-receipts.txt, one upload body ({"appUserId", "receiptData"}) per line.

Each customer's app user id is a UUID made from the tester's email, as an app that names its users by UUID (or sets
appAccountToken to its user id) sends: ids in no order, so the customers uploading in the same second are spread over
every index keyed by user. Ids numbered in upload order (they were `steadyN@bench.example.com`) put each second's new
customers side by side in those indexes, a page written for dozens of them: SQLite's figures with them were 1.5 to 1.7
times these instantly and 1.2 times with 3-6 s (bench/README.md, forty-fifth round). Ids in no order are the common case
and the harder one; an app whose new customers buy in the order of their ids gets the easier figures."""
import http.client
import json
import multiprocessing
import sys
import urllib.parse
import uuid

url, work, count = sys.argv[1], sys.argv[2], int(sys.argv[3])
parsed = urllib.parse.urlparse(url)


def make(indices):
    connection, lines = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=120), []

    def call(path, body):
        connection.request("POST", path, body=json.dumps(body), headers={"Content-Type": "application/json"})
        response = connection.getresponse()
        data = response.read()
        if response.status >= 300:
            raise SystemExit(f"{path}: {response.status} {data[:200]!r}")
        return json.loads(data)

    for index in indices:
        email = f"steady{index}@bench.example.com"
        call("/admin/v1/accounts", {"email": email})
        bought = call("/admin/v1/purchases", {"app": "com.example.coins", "product": "Nada.JPYF01", "account": email})
        user = str(uuid.uuid5(uuid.NAMESPACE_URL, email))
        lines.append(json.dumps({"appUserId": user, "receiptData": bought["receipt"]}))
    return lines


with multiprocessing.Pool(8) as pool:
    parts = pool.map(make, [range(i, count, 8) for i in range(8)])
# Interleaved back into creation order, so any prefix of the file is a set of distinct customers.
lines = [line for group in zip(*parts) for line in group] + [line for part in parts for line in part[len(parts[-1]):]]
with open(f"{work}/steady-receipts.txt", "w") as out:
    out.write("\n".join(lines[:count]) + "\n")
print(f"prepared {count} receipts")
