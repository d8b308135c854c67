"""The attack suite: one test per attack class of peers-and-attacks.md §4 and per hardening finding,
against the real binaries. Each attack is refused with a clear code, nothing is granted, and the
processes are alive afterwards and after a restart."""
import base64
import datetime
import hashlib
import hmac
import json
import os
import socket
import stat
import tempfile
import time
import urllib.parse
import uuid

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, utils
from cryptography.x509.oid import NameOID, ObjectIdentifier

from server_support import Server, emulator_buy

USER_TOKEN_SECRET = "attack-suite-user-token-secret-0123456789"


def b64url(data):
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def user_token(user, secret=USER_TOKEN_SECRET, lifetime=3600, now=None):
    """A user token as a developer's backend mints it (HS256, sub, exp)."""
    header = b64url(json.dumps({"alg": "HS256", "typ": "JWT"}).encode())
    claims = b64url(json.dumps({"sub": user, "exp": int((now or time.time()) + lifetime)}).encode())
    signature = hmac.new(secret.encode(), f"{header}.{claims}".encode(), hashlib.sha256).digest()
    return f"{header}.{claims}.{b64url(signature)}"


def code(body):
    return (body or {}).get("error", {}).get("code")


def new_tester(emulator):
    email = f"attack{uuid.uuid4().hex[:10]}@example.com"
    status, _ = emulator.request("POST", "/admin/v1/accounts", {"email": email})
    assert status == 201
    return email


class World:
    """A purchase server with two apps: coins requires user tokens (public and secret keys);
    football keeps optional user auth with an App Review allow-list for the sandbox."""

    def __init__(self, emulator, data_dir):
        self.emulator = emulator
        self.data_dir = data_dir
        self.server = Server(emulator, data_dir)
        self.secret = self.server.setup_app("com.example.coins")
        self.server.request("PUT", "/admin/v1/apps/com.example.coins", {"userTokenSecret": USER_TOKEN_SECRET},
                            headers={"Authorization": "Bearer " + self.server.admin_key})
        self.public = self.server.cli("server", "key", "create", "com.example.coins", "--public")["apiKey"]
        self.football = self.server.setup_app("com.example.football", sandbox_policy="allow_list", sandbox_user=["app-review"])
        self.server.request("PUT", "/admin/v1/apps/com.example.football", {"userAuth": "optional"},
                            headers={"Authorization": "Bearer " + self.server.admin_key})
        self.football_public = self.server.cli("server", "key", "create", "com.example.football", "--public")["apiKey"]
        self.comics = self.server.setup_app("com.example.comics")

    def alive(self):
        status, body = self.server.request("GET", "/health")
        assert status == 200 and body["status"] == "ok"
        status, _ = self.emulator.request("GET", "/health")
        assert status == 200


@pytest.fixture(scope="module")
def world(emulator):
    with tempfile.TemporaryDirectory() as data_dir:
        running = World(emulator, data_dir)
        try:
            yield running
        finally:
            running.server.stop()


def raw_exchange(url, payload, read_timeout=5):
    """Sends raw bytes to a server and returns what it answered (at most 64 KiB) and the seconds it took."""
    parsed = urllib.parse.urlparse(url)
    started = time.time()
    with socket.create_connection((parsed.hostname, parsed.port), timeout=read_timeout) as sock:
        sock.sendall(payload)
        data = b""
        try:
            while len(data) < 65536:
                chunk = sock.recv(65536)
                if not chunk:
                    break
                data += chunk
                if b"\r\n\r\n" in data and b"}" in data:
                    break
        except (socket.timeout, ConnectionResetError):
            pass
    return data, time.time() - started


def der(tag, content):
    length = len(content)
    if length < 0x80:
        encoded = bytes([length])
    else:
        digits = length.to_bytes((length.bit_length() + 7) // 8, "big")
        encoded = bytes([0x80 | len(digits)]) + digits
    return bytes([tag]) + encoded + content


def nested_octet_receipt(depth=100_000):
    """A PKCS#7 ContentInfo whose content is `depth` nested constructed OCTET STRINGs (indefinite lengths)."""
    inner = b"\x24\x80" * depth + b"\x04\x01a" + b"\x00\x00" * depth
    signed_data_oid = der(0x06, bytes([0x2A, 0x86, 0x48, 0x86, 0xF7, 0x0D, 1, 7, 2]))
    return base64.b64encode(b"\x30\x80" + signed_data_oid + b"\xa0\x80" + inner + b"\x00\x00\x00\x00").decode()


def forged_chain():
    """Three certificates shaped like Apple's (marker OIDs included) under a root we made: not Apple's, not the emulator's."""
    def cert(subject, issuer, key, issuer_key, ca, oid):
        builder = (x509.CertificateBuilder().subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
                   .issuer_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, issuer)])).public_key(key.public_key())
                   .serial_number(x509.random_serial_number())
                   .not_valid_before(datetime.datetime(2020, 1, 1)).not_valid_after(datetime.datetime(2040, 1, 1))
                   .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True))
        if oid:
            builder = builder.add_extension(x509.UnrecognizedExtension(ObjectIdentifier(oid), b"\x05\x00"), critical=False)
        return builder.sign(issuer_key, hashes.SHA256())
    root_key, mid_key, leaf_key = (ec.generate_private_key(ec.SECP256R1()) for _ in range(3))
    root = cert("Apple Root CA - G3", "Apple Root CA - G3", root_key, root_key, True, None)
    mid = cert("Apple Worldwide Developer Relations Certification Authority", "Apple Root CA - G3", mid_key, root_key, True, "1.2.840.113635.100.6.2.1")
    leaf = cert("Prod ECC Mac App Store and iTunes Store Receipt Signing", mid.subject.rfc4514_string(), leaf_key, mid_key, False,
                "1.2.840.113635.100.6.11.1")
    return leaf_key, [base64.b64encode(c.public_bytes(serialization.Encoding.DER)).decode() for c in (leaf, mid, root)]


def forged_jws(payload):
    key, x5c = forged_chain()
    header = b64url(json.dumps({"alg": "ES256", "x5c": x5c}).encode())
    body = b64url(json.dumps(payload).encode())
    r, s = utils.decode_dss_signature(key.sign(f"{header}.{body}".encode(), ec.ECDSA(hashes.SHA256())))
    return f"{header}.{body}.{b64url(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"


# ── §4 attack classes ────────────────────────────────────────────────────────────────────────────

def test_1_fake_transaction_ids_and_unverifiable_receipts_grant_nothing(world):
    """A jailbreak tweak's receipt: not signed by Apple. Refused; the user owns nothing."""
    fake = base64.b64encode(b"\x30\x82\x01\x00" + os.urandom(256)).decode()
    body = world.server.upload(world.secret, "cracker", fake)
    assert body["state"] == "rejected"
    assert world.server.user(world.secret, "cracker")["balances"] == {}


def test_4_forged_chain_with_apple_names_and_oids_is_refused(world):
    now = int(time.time() * 1000)
    forged = forged_jws({"transactionId": "2000000000000001", "originalTransactionId": "2000000000000001", "bundleId": "com.example.coins",
                         "productId": "Nada.JPYF03", "purchaseDate": now, "originalPurchaseDate": now, "signedDate": now, "quantity": 1,
                         "type": "Consumable", "environment": "Sandbox", "inAppOwnershipType": "PURCHASED"})
    status, body = world.server.request("POST", "/v1/transactions", {"appUserId": "forger", "signedTransaction": forged}, key=world.secret)
    assert status in (200, 202) and body["state"] == "rejected", body
    assert world.server.user(world.secret, "forger")["balances"] == {}


def test_5_receipt_of_another_app_is_refused(world, emulator):
    tester = new_tester(emulator)
    football = emulator_buy(emulator, "com.example.football", "EnergyBottle", tester)
    body = world.server.upload(world.secret, "swapper", football["receipt"])
    assert body["state"] == "rejected"
    assert world.server.user(world.secret, "swapper")["balances"] == {}


def test_6_replay_across_accounts_is_refused(world, emulator):
    tester = new_tester(emulator)
    comic = emulator_buy(emulator, "com.example.comics", "com.raywenderlich.inapprage.nightlyrage", tester)
    assert world.server.upload(world.comics, "owner", comic["receipt"])["state"] == "verified"
    replay = world.server.upload(world.comics, "replayer", comic["receipt"])
    assert replay["state"] == "rejected"
    assert "bound to another user" in replay["reason"]
    assert not any(e["active"] for e in world.server.user(world.comics, "replayer")["entitlements"])


def test_7_the_same_consumable_twice_credits_once(world, emulator):
    tester = new_tester(emulator)
    coins = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", tester)
    for _ in range(3):
        world.server.upload(world.secret, "double", coins["receipt"])
    assert world.server.user(world.secret, "double")["balances"] == {"coins": 100}


def test_8_a_public_key_cannot_name_itself_app_review(world, emulator):
    """Sandbox purchases go to the allow-list only; a public key alone (optional user auth) never matches it."""
    tester = new_tester(emulator)
    bottle = emulator_buy(emulator, "com.example.football", "EnergyBottle", tester)
    status, body = world.server.request("POST", "/v1/receipts?wait=30", {"appUserId": "app-review", "receiptData": bottle["receipt"]},
                                        key=world.football_public)
    assert status == 200 and body["state"] == "rejected" and "allow-list" in body["reason"]
    # The developer's backend (secret key) vouches for App Review: granted.
    assert world.server.upload(world.football, "app-review", bottle["receipt"])["state"] == "verified"


def test_10_spoofed_notifications_are_refused(world):
    now = int(time.time() * 1000)
    forged = forged_jws({"notificationType": "REFUND", "notificationUUID": str(uuid.uuid4()), "signedDate": now,
                         "data": {"bundleId": "com.example.coins", "environment": "Sandbox"}})
    status, body = world.server.request("POST", "/v1/notifications/apple", {"signedPayload": forged})
    assert status == 400 and code(body) == "invalid_signature"
    # Thousands of x5c entries are counted, not parsed: refused at once.
    header = b64url(json.dumps({"alg": "ES256", "x5c": ["MIIB"] * 5000}).encode())
    started = time.time()
    status, body = world.server.request("POST", "/v1/notifications/apple", {"signedPayload": header + "." + b64url(b"{}") + ".AAAA"})
    assert status == 400 and time.time() - started < 4.5  # answered, not parsed for long (generous for a loaded machine)


# ── the findings of issue 9 ──────────────────────────────────────────────────────────────────────

def test_nested_octet_string_receipt_does_not_kill_either_process(world, emulator):
    bomb = nested_octet_receipt()
    body = world.server.upload(world.secret, "bomber", bomb)
    assert body["state"] == "rejected"
    assert emulator.verify(bomb)["status"] == 21002
    world.alive()


def test_numbers_that_used_to_trap_are_400(world):
    status, body = world.server.request("GET", "/v1/reports/revenue?from=9223372036854775807", key=world.secret)
    assert status == 400 and code(body) == "invalid_date"
    status, body = world.server.request("PUT", "/admin/v1/apps/com.example.coins/products/Nada.JPYF01",
                                        {"type": "nonRenewing", "entitlement": "pass", "durationDays": 200_000_000_000},
                                        headers={"Authorization": "Bearer " + world.server.admin_key})
    assert status == 400
    status, _ = world.server.request("GET", "/health%3F=")
    world.alive()


def test_a_public_key_acts_only_for_its_user(world, emulator):
    tester = new_tester(emulator)
    coins = emulator_buy(emulator, "com.example.coins", "Nada.JPYF01", tester)
    alice = {"Storekeeper-User-Token": user_token("alice")}
    status, body = world.server.request("POST", "/v1/receipts?wait=30", {"appUserId": "alice", "receiptData": coins["receipt"]}, key=world.public)
    assert status == 401 and code(body) == "missing_user_token"
    status, body = world.server.request("POST", "/v1/receipts?wait=30", {"appUserId": "alice", "receiptData": coins["receipt"]},
                                        key=world.public, headers=alice)
    assert status == 200 and body["state"] == "verified"
    assert world.server.request("GET", "/v1/users/alice", key=world.public, headers=alice)[1]["balances"] == {"coins": 20}
    status, body = world.server.request("GET", "/v1/users/bob", key=world.public, headers=alice)
    assert status == 403 and code(body) == "user_mismatch"
    status, _ = world.server.request("POST", "/v1/users/bob/balances/coins/spend", {"amount": 1},
                                     key=world.public, headers={**alice, "Idempotency-Key": "x"})
    assert status == 403
    status, body = world.server.request("GET", "/v1/reports/revenue", key=world.public, headers=alice)
    assert status == 403 and code(body) == "secret_key_required"
    status, body = world.server.request("GET", "/v1/users/alice", key=world.public,
                                        headers={"Storekeeper-User-Token": user_token("alice", secret="guessed-secret-guessed-secret")})
    assert status == 401 and code(body) == "invalid_user_token"


def test_limits_answer_before_the_body(world):
    huge = (b"POST /v1/receipts HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer " + world.secret.encode() +
            b"\r\nContent-Type: application/json\r\nContent-Length: 100000000000\r\n\r\n")
    # Answered before the body: a server waiting for it would send nothing within the read timeout (10 s).
    answer, seconds = raw_exchange(world.server.url, huge, read_timeout=10)
    assert b" 413 " in answer.split(b"\r\n")[0] and seconds < 4.5
    unauthenticated = b"POST /v1/receipts HTTP/1.1\r\nHost: x\r\nContent-Length: 50000000\r\n\r\n"
    answer, seconds = raw_exchange(world.server.url, unauthenticated, read_timeout=10)
    assert b" 401 " in answer.split(b"\r\n")[0] and seconds < 4.5
    world.alive()


def test_user_ids_with_nul_are_refused_not_truncated(world, emulator):
    tester = new_tester(emulator)
    coins = emulator_buy(emulator, "com.example.coins", "Nada.JPYF01", tester)
    status, body = world.server.request("POST", "/v1/receipts", {"appUserId": "victim\u0000evil", "receiptData": coins["receipt"]}, key=world.secret)
    assert status == 400 and code(body) == "invalid_user_id"
    assert world.server.user(world.secret, "victim")["balances"] == {}


def test_revoked_keys_are_refused(world):
    key = world.server.cli("server", "key", "create", "com.example.coins", "--label", "leaked")
    assert world.server.request("GET", "/v1/users/someone", key=key["apiKey"])[0] == 200
    world.server.cli("server", "key", "revoke", "com.example.coins", key["id"])
    status, body = world.server.request("GET", "/v1/users/someone", key=key["apiKey"])
    assert status == 401 and code(body) == "invalid_api_key"
    listed = world.server.cli("server", "key", "list", "com.example.coins")
    assert any(entry["id"] == key["id"] and entry.get("revokedAt") for entry in listed)
    assert not any(key["apiKey"] in json.dumps(entry) for entry in listed)


def test_secrets_at_rest_are_private(world):
    for name in ("admin-key", "master-key", "server.sqlite"):
        path = os.path.join(world.data_dir, name)
        if os.path.exists(path):
            assert stat.S_IMODE(os.stat(path).st_mode) == 0o600, name
    assert os.path.exists(os.path.join(world.data_dir, "master-key"))
    # The shared secret is sealed in the database, not stored as given.
    secret = world.emulator.shared_secret("com.example.coins")
    with open(os.path.join(world.data_dir, "server.sqlite"), "rb") as database:
        assert secret.encode() not in database.read()


def test_emulator_admin_api_refuses_cross_site_requests(emulator):
    status, body = emulator.request("POST", "/admin/v1/accounts", raw=json.dumps({"email": "csrf@example.com"}).encode(),
                                    headers={"Content-Type": "text/plain"})
    assert status == 415 and json.loads(body)["error"]["code"] == "unsupported_media_type"
    status, body = emulator.request("POST", "/admin/v1/accounts", {"email": "csrf@example.com"}, headers={"Origin": "https://evil.example"})
    assert status == 403 and json.loads(body)["error"]["code"] == "foreign_origin"
    status, body = emulator.request("GET", "/admin/v1/apps/com.example.coins", headers={"Host": "evil.example"})
    assert status == 403 and json.loads(body)["error"]["code"] == "foreign_host"


def test_extra_slashes_do_not_sidestep_the_guards(world, emulator):
    """//admin, ///admin and trailing slashes meet the same checks as the canonical path."""
    status, body = emulator.request("POST", "//admin/v1/accounts", {"email": "slash@example.com"}, headers={"Origin": "https://evil.example"})
    assert status == 403 and json.loads(body)["error"]["code"] == "foreign_origin"
    status, body = emulator.request("GET", "///admin/v1/apps/com.example.coins", headers={"Host": "evil.example"})
    assert status == 403
    status, body = world.server.request("GET", "//admin/v1/apps", headers={"Authorization": "Bearer "})
    assert status == 401
    status, body = world.server.request("POST", "/v1/receipts/", {"appUserId": "a", "receiptData": "AAAA"})
    assert status == 401 and code(body) == "missing_api_key"


def test_an_empty_admin_key_is_refused_at_start(emulator):
    import subprocess
    from conftest import BIN, ROOT
    with tempfile.TemporaryDirectory() as data_dir:
        result = subprocess.run([BIN, "server", "serve", "--data", data_dir, "--port", "0", "--admin-key", "short"],
                                cwd=ROOT, capture_output=True, text=True, timeout=30)
        assert result.returncode != 0 and "at least 16" in result.stderr


def test_poison_job_is_dead_after_three_crashes(emulator):
    """The server is killed three times while it holds a job (Apple never answers, so the job stays claimed):
    the fourth claim finds it poison, dead with the reason, and it is not run again until replayed."""
    with tempfile.TemporaryDirectory() as data_dir:
        server = Server(emulator, data_dir, extra=["--call-timeout", "60"])
        admin = {"Authorization": "Bearer " + server.admin_key}

        def job_state(job):
            _, listed = server.request("GET", "/admin/v1/jobs?limit=50", headers=admin)
            return next((j for j in listed["jobs"] if j["verificationId"] == job), None)

        def wait_until(job, predicate, timeout=30):
            deadline = time.time() + timeout
            while time.time() < deadline:
                state = job_state(job)
                if state and predicate(state):
                    return state
                time.sleep(0.2)
            raise AssertionError(f"job {job}: {job_state(job)}")

        try:
            key = server.setup_app("com.example.coins")
            coins = emulator_buy(emulator, "com.example.coins", "Nada.JPYF01", new_tester(emulator))
            emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--hang")
            _, body = server.request("POST", "/v1/receipts", {"appUserId": "poisoned", "receiptData": coins["receipt"]}, key=key)
            job = body["verificationId"]
            for attempt in range(1, 4):
                wait_until(job, lambda j: j["state"] == "verifying" and j["attempts"] == attempt)
                server.kill()
                server.start()
                # The dead process's lease (121 s) lapses on the shared, emulated clock.
                emulator.cli("appstore", "time", "advance", "130s")
            dead = wait_until(job, lambda j: j["state"] == "dead")
            assert dead["reason"].startswith("poison"), dead
            time.sleep(1)
            assert job_state(job)["state"] == "dead"
            server.request("GET", "/health")
            assert server.process.poll() is None
        finally:
            emulator.cli("appstore", "fault", "clear")
            server.stop()


def test_after_every_attack_the_server_restarts_and_keeps_what_it_granted(world):
    world.server.stop()
    world.server.start()
    world.alive()
    assert world.server.user(world.secret, "double")["balances"] == {"coins": 100}


def test_a_process_with_another_master_key_refuses_to_start(emulator):
    with tempfile.TemporaryDirectory() as first:
        server = Server(emulator, first, master_key=os.urandom(32).hex())
        server.stop()
        server.master_key = os.urandom(32).hex()
        with pytest.raises(RuntimeError, match="master_key_mismatch"):
            server.start()
