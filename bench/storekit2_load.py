"""Apple's SignedDataVerifier on the same signed transaction (one process), then the notifications for the
purchase server: ONE_TIME_CHARGE notifications, each unique, signed with the emulator's JWS key (read from its
data directory, as only a benchmark may), one request body per line in WORK/notifications.jsonl for
`storekeeper-bench load` (a Python sender would measure Python). Each nests a purchase of its own, as Apple's do
(new transaction and original transaction ids), signed under the notification's own header, as Apple signs them;
its appAccountToken is the benchmark user's id, a UUID, so the server finds its owner and grants it."""
import base64
import json
import os
import ssl
import sys
import time
import urllib.request
import uuid

from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature

server, appstore, work, count = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])
transaction = open(f"{work}/transaction.jws").read().strip()
root = ssl.PEM_cert_to_DER_cert(open(f"{work}/jws-root.pem").read())

# BENCH_VERIFIER_SECONDS=0 (bench/callgrind.sh) skips timing Apple's verifier.
seconds = float(os.environ.get("BENCH_VERIFIER_SECONDS", "5"))
if seconds > 0:
    verifier = SignedDataVerifier([root], False, Environment.SANDBOX, "com.example.coins", None)
    verifier.verify_and_decode_signed_transaction(transaction)
    started, done = time.time(), 0
    while time.time() - started < seconds:
        verifier.verify_and_decode_signed_transaction(transaction)
        done += 1
    print(f"signed transactions verified (Apple's Python SignedDataVerifier, 1 process): {done / (time.time() - started):.0f}/s")


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


key = serialization.load_pem_private_key(open(f"{work}/appstore/ca/jws/leaf-key.pem", "rb").read(), password=None)
chain = [ssl.PEM_cert_to_DER_cert(open(f"{work}/appstore/ca/jws/{name}.pem").read()) for name in ("leaf", "intermediate", "root")]
header = b64url(json.dumps({"alg": "ES256", "x5c": [base64.b64encode(der).decode() for der in chain]}).encode())
payload = json.loads(base64.urlsafe_b64decode(transaction.split(".")[1] + "=="))


def sign(body):
    signing_input = header + "." + b64url(json.dumps(body).encode())
    r, s = decode_dss_signature(key.sign(signing_input.encode(), ec.ECDSA(hashes.SHA256())))
    return signing_input + "." + b64url(r.to_bytes(32, "big") + s.to_bytes(32, "big"))


user = "6b3f1d2e-4c5a-4e8f-9a7b-0c1d2e3f4a5b"  # a UUID, so a purchase's appAccountToken names this user
bodies = []
for index in range(count):
    # Ids far above the emulator's, so no notification's purchase is one the server has seen.
    purchase_id = str(9_000_000_000_000_000 + index)
    purchase = sign(dict(payload, transactionId=purchase_id, originalTransactionId=purchase_id, appAccountToken=user))
    notification = {"notificationType": "ONE_TIME_CHARGE", "notificationUUID": str(uuid.uuid4()), "version": "2.0", "signedDate": payload["signedDate"],
                    "data": {"bundleId": "com.example.coins", "environment": "Sandbox", "signedTransactionInfo": purchase}}
    bodies.append(json.dumps({"signedPayload": sign(notification)}).encode())

# The server knows the app and the benchmark user (made by the upload), so every notification queues a settlement.
admin = {"Authorization": "Bearer sk_admin_benchmark", "Content-Type": "application/json"}
secret = json.loads(urllib.request.urlopen(appstore + "/admin/v1/apps/com.example.coins").read())["sharedSecret"]
for method, path, body in [("POST", "/admin/v1/apps", {"id": "com.example.coins", "sharedSecret": secret}),
                           ("PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF02", {"type": "consumable", "currency": "coins", "amount": 100})]:
    urllib.request.urlopen(urllib.request.Request(server + path, data=json.dumps(body).encode(), method=method, headers=admin))
api_key = json.loads(urllib.request.urlopen(urllib.request.Request(server + "/admin/v1/apps/com.example.coins/keys", data=b"{}", method="POST",
                                                                   headers=admin)).read())["apiKey"]
upload = urllib.request.Request(server + "/v1/transactions", data=json.dumps({"appUserId": user, "signedTransaction": transaction}).encode(),
                                method="POST", headers={"Authorization": "Bearer " + api_key, "Content-Type": "application/json"})
assert json.loads(urllib.request.urlopen(upload).read())["state"] == "verified"

with open(f"{work}/notifications.jsonl", "wb") as out:
    for body in bodies:
        out.write(body + b"\n")
