"""The purchase server end to end through HTTP, against the running emulator, on SQLite and PostgreSQL."""
import json
import subprocess
import tempfile
import threading

import pytest

from conftest import BIN, ROOT, TESTER, Emulator
from server_support import ENGINES, Server, emulator_buy, fresh_postgres_url


@pytest.fixture(scope="module")
def emulator():
    """A fresh emulator for these flows: other suites move the shared emulator's clock."""
    with tempfile.TemporaryDirectory() as data_dir:
        running = Emulator(data_dir)
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(params=ENGINES)
def server(request, emulator):
    with tempfile.TemporaryDirectory() as data_dir:
        running = Server(emulator, data_dir, database=fresh_postgres_url() if request.param == "postgres" else None)
        try:
            yield running
        finally:
            running.stop()


def new_tester(emulator):
    import uuid
    email = f"t{uuid.uuid4().hex[:10]}@example.com"
    emulator.cli("appstore", "tester", "add", email)
    return email


def test_coins_are_counted_once(emulator, server):
    key = server.setup_app("com.example.coins")
    tester = new_tester(emulator)
    first = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", tester)
    assert server.upload(key, "alice", first["receipt"])["state"] == "verified"
    second = emulator_buy(emulator, "com.example.coins", "Nada.JPYF01", tester, quantity=3)
    for _ in range(3):
        assert server.upload(key, "alice", second["receipt"])["state"] == "verified"
    assert server.user(key, "alice")["balances"] == {"coins": 160}


def test_football_store_and_restore_on_new_device(emulator, server):
    key = server.setup_app("com.example.football")
    tester = new_tester(emulator)
    for product in ["ProtectiveGloves", "EnergyBottle", "EnergyBottle"]:
        emulator_buy(emulator, "com.example.football", product, tester)
    last = emulator_buy(emulator, "com.example.football", "GoldenGlobe", tester)
    assert server.upload(key, "player", last["receipt"])["state"] == "verified"
    player = server.user(key, "player")
    assert {e["id"] for e in player["entitlements"] if e["active"]} == {"protective_gloves", "golden_globe"}
    assert all(e["expiresDate"] is None and e["source"] == "non-consumable" for e in player["entitlements"])
    assert player["balances"] == {"energy_bottles": 2}
    # A new device: restore completed transactions, refresh the receipt, upload it as a restore.
    restored = json.loads(emulator.cli("appstore", "restore", "--app", "com.example.football", "--account", tester,
                                       "--device", "9A1B2C3D-0000-4000-8000-000000000001").stdout)
    assert {t["productIdentifier"] for t in restored["transactions"]} == {"ProtectiveGloves", "GoldenGlobe"}
    status, data = emulator.request("POST", "/device/v1/receipt/refresh", {"app": "com.example.football", "device": restored["device"]})
    receipt = json.loads(data)["receipt"]
    status, body = server.request("POST", "/v1/users/player/restore?wait=30", {"receiptData": receipt}, key=key)
    assert status == 200 and body["state"] == "verified"
    after = server.user(key, "player")
    assert {e["id"] for e in after["entitlements"] if e["active"]} == {"protective_gloves", "golden_globe"}
    assert after["balances"] == {"energy_bottles": 2}


def test_comics_and_magazine(emulator, server):
    comics = server.setup_app("com.example.comics")
    magazine = server.setup_app("com.example.magazine")
    tester = new_tester(emulator)
    comic = emulator_buy(emulator, "com.example.comics", "com.raywenderlich.inapprage.nightlyrage", tester)
    assert server.upload(comics, "reader", comic["receipt"])["state"] == "verified"
    assert [e["id"] for e in server.user(comics, "reader")["entitlements"]] == ["nightlyrage"]
    subscription = emulator_buy(emulator, "com.example.magazine", "com.example.magazine.monthly", tester)
    assert server.upload(magazine, "reader", subscription["receipt"])["state"] == "verified"
    reader = server.user(magazine, "reader")
    assert reader["entitlements"][0]["id"] == "magazine" and reader["entitlements"][0]["active"]
    assert reader["subscriptions"][0]["state"] == "active"


def test_replay_duplicates_forgeries_and_sandbox_allow_list(emulator, server, tmp_path):
    key = server.setup_app("com.example.football", sandbox_policy="allow_list", sandbox_user=["owner", "thief", "reviewer"])
    tester = new_tester(emulator)
    bought = emulator_buy(emulator, "com.example.football", "GoldenGlobe", tester)
    # Concurrent duplicates grant once.
    results = []
    threads = [threading.Thread(target=lambda: results.append(Server.upload(server_copy(server), key, "owner", bought["receipt"])))
               for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert all(result["state"] == "verified" for result in results)
    assert sum(len(result["result"]["granted"]) for result in results) == 1
    # Replay by another user is refused.
    stolen = server.upload(key, "thief", bought["receipt"])
    assert stolen["state"] == "rejected" and "bound to another user" in stolen["reason"]
    # Sandbox purchases for users off the allow-list are refused.
    outsider = server.upload(key, "customer", bought["receipt"])
    assert outsider["state"] == "rejected" and "allow-list" in outsider["reason"]
    # Forgeries: another app's receipt, a tampered payload, garbage.
    comic = emulator_buy(emulator, "com.example.comics", "com.raywenderlich.inapprage.nightlyrage", tester)
    other = server.upload(key, "owner", comic["receipt"])
    assert other["state"] == "rejected" and "bundle id" in other["reason"]
    import base64
    raw = bytearray(base64.b64decode(bought["receipt"]))
    index = raw.index(b"GoldenGlobe")
    raw[index] = ord("X")
    tampered = server.upload(key, "owner", base64.b64encode(bytes(raw)).decode())
    assert tampered["state"] == "rejected" and "signature" in tampered["reason"]
    assert server.upload(key, "owner", "!!!")["state"] == "rejected"
    assert {e["id"] for e in server.user(key, "thief")["entitlements"]} == set()


def server_copy(server):
    """A second client connection to the same server (http.client connections are not thread-safe)."""
    copy = object.__new__(Server)
    copy.__dict__.update(server.__dict__)
    copy.connection = None
    return copy


def test_report_and_cli(emulator, server):
    key = server.setup_app("com.example.coins")
    tester = new_tester(emulator)
    purchase = emulator_buy(emulator, "com.example.coins", "Nada.JPYF03", tester, quantity=2)
    assert server.upload(key, "buyer", purchase["receipt"])["state"] == "verified"
    report = server.cli("server", "report", "--app", "com.example.coins", "--from", "2000-01-01", "--to", "2100-01-01",
                        "--group", "product,currency", "--format", "json")
    assert report["rows"][0]["units"] == 2 and report["rows"][0]["gross"] == "1.98"
    csv = server.cli("server", "report", "--app", "com.example.coins", "--from", "2000-01-01", "--to", "2100-01-01", "--format", "csv")
    assert csv.splitlines()[0].startswith("day,productId,currency,environment")
    shown = server.cli("server", "user", "show", "buyer", "--app", "com.example.coins")
    assert shown["balances"] == {"coins": 1200}
    assert any(event["kind"] == "balance_credited" for event in shown["audit"])
    jobs = server.cli("server", "jobs", "list", "--state", "verified")
    assert jobs["counts"]["verified"] >= 1
    # A list's limit is at least one: SQLite reads a negative LIMIT as none at all.
    admin = {"Authorization": "Bearer " + server.admin_key}
    assert server.upload(key, "buyer", purchase["receipt"])["state"] == "verified"
    status, listed = server.request("GET", "/admin/v1/jobs?limit=-1", headers=admin)
    assert status == 200 and len(listed["jobs"]) == 1 and listed["counts"]["verified"] >= 2, listed
    recounted = server.cli("server", "jobs", "recount")
    assert recounted["verificationJobs"] == listed["counts"], recounted


def test_up_runs_everything_wired_together(tmp_path):
    process = subprocess.Popen([BIN, "up", "--data", str(tmp_path), "--appstore-port", "0", "--server-port", "0", "--quiet"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        summary = json.loads(process.stdout.readline())
        assert {app["bundleId"] for app in summary["apps"]} == {"com.example.coins", "com.example.football", "com.example.comics", "com.example.magazine"}
        keys = {app["bundleId"]: app["apiKey"] for app in summary["apps"]}
        buy = subprocess.run([BIN, "appstore", "buy", "--url", summary["appstore"], "--app", "com.example.coins", "--product", "Nada.JPYF02",
                              "--account", "sandbox@example.com"], capture_output=True, text=True, check=True)
        receipt = json.loads(buy.stdout)["receipt"]
        import urllib.request
        request = urllib.request.Request(summary["server"] + "/v1/receipts?wait=10", method="POST",
                                         data=json.dumps({"appUserId": "alice", "receiptData": receipt}).encode(),
                                         headers={"Authorization": "Bearer " + keys["com.example.coins"]})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["state"] == "verified"
        request = urllib.request.Request(summary["server"] + "/v1/users/alice", headers={"Authorization": "Bearer " + keys["com.example.coins"]})
        with urllib.request.urlopen(request, timeout=30) as response:
            assert json.loads(response.read())["balances"] == {"coins": 100}
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_storekit2_signed_transactions_are_granted_once_and_forgeries_refused(emulator, server):
    """A device on StoreKit 2 sends its signed transaction: the server checks it locally (no verifyReceipt)
    and grants through the same ledger, so the same purchase's receipt grants nothing more."""
    key = server.setup_app("com.example.football")
    tester = new_tester(emulator)
    bought = emulator_buy(emulator, "com.example.football", "EnergyBottle", tester, quantity=3)
    status, first = server.request("POST", "/v1/transactions", {"appUserId": "sk2-user", "signedTransaction": bought["signedTransaction"]}, key=key)
    assert status == 200 and first["state"] == "verified", first
    assert first["result"]["granted"] == [bought["transaction_id"]]
    status, again = server.request("POST", "/v1/transactions", {"appUserId": "sk2-user", "signedTransaction": bought["signedTransaction"]}, key=key)
    assert again["state"] == "verified" and again["result"]["granted"] == []
    assert server.upload(key, "sk2-user", bought["receipt"])["result"]["granted"] == []
    assert server.user(key, "sk2-user")["balances"] == {"energy_bottles": 3}
    header, payload, signature = bought["signedTransaction"].split(".")
    status, forged = server.request("POST", "/v1/transactions", {"appUserId": "sk2-user", "signedTransaction": f"{header}.{payload}x.{signature}"}, key=key)
    assert forged["state"] == "rejected" and forged["reason"]
    assert server.user(key, "sk2-user")["balances"] == {"energy_bottles": 3}


def test_notifications_from_the_emulator_reach_the_server_and_refunds_claw_back(emulator, server):
    """The emulator POSTs Server Notifications V2 to the server, as Apple would: a refund claws back coins."""
    import time
    key = server.setup_app("com.example.coins")
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins", "--sandbox-url", server.url + "/v1/notifications/apple")
    tester = new_tester(emulator)
    bought = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", tester)
    assert server.upload(key, "refunded-user", bought["receipt"])["state"] == "verified"
    assert server.user(key, "refunded-user")["balances"] == {"coins": 100}
    status, _ = emulator.request("POST", f"/admin/v1/transactions/{bought['transaction_id']}/refund")
    assert status == 200
    deadline = time.time() + 20
    while time.time() < deadline and server.user(key, "refunded-user")["balances"] != {"coins": 0}:
        time.sleep(0.1)
    assert server.user(key, "refunded-user")["balances"] == {"coins": 0}
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins")


def test_consumption_requests_are_answered_through_the_server_api(emulator, server, tmp_path):
    """A refund request makes Apple ask for consumption data; an app that opted in answers with what the
    ledger knows: delivered, and half of the 100 coins spent."""
    import time
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.coins").stdout)
    pem = tmp_path / "iap-key.p8"
    pem.write_text(key["privateKey"])
    api_key = server.setup_app("com.example.coins", consumption_policy="send", server_api_key_id=key["keyId"],
                               server_api_issuer=key["issuerId"], server_api_private_key=str(pem))
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins", "--sandbox-url", server.url + "/v1/notifications/apple")
    try:
        bought = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", new_tester(emulator))
        assert server.upload(api_key, "consumer", bought["receipt"])["state"] == "verified"
        status, _ = server.request("POST", "/v1/users/consumer/balances/coins/spend", {"amount": 50, "idempotencyKey": "spend-1"}, key=api_key)
        assert status == 200
        emulator.cli("appstore", "refund", bought["transaction_id"], "--request", "UNSATISFIED_WITH_PURCHASE")
        deadline = time.time() + 20
        info = None
        while time.time() < deadline and not info:
            info = json.loads(emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}")[1]).get("consumptionInfo")
            time.sleep(0.1)
        assert info and info["deliveryStatus"] == "DELIVERED" and info["customerConsented"] == "true" and info["consumptionPercentage"] == "50000"
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins")


def test_reconciler_catches_missed_notifications_and_new_transactions(emulator, server, tmp_path):
    """Apple's notifications never reach the server (a dead URL, or none at all): a reconciliation pass finds
    the refund in Notification History (onlyFailures) and the renewal in Transaction History."""
    import base64
    import time
    from appstoreserverlibrary.api_client import AppStoreServerAPIClient
    from appstoreserverlibrary.models.Environment import Environment
    from appstoreserverlibrary.models.NotificationHistoryRequest import NotificationHistoryRequest
    pems, keys = {}, {}
    for bundle in ("com.example.coins", "com.example.magazine"):
        key = keys[bundle] = json.loads(emulator.cli("appstore", "key", "create", "--app", bundle).stdout)
        pem = tmp_path / f"{bundle}.p8"
        pem.write_text(key["privateKey"])
        pems[bundle] = server.setup_app(bundle, server_api_key_id=key["keyId"], server_api_issuer=key["issuerId"], server_api_private_key=str(pem))
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins", "--sandbox-url", "http://127.0.0.1:9/nobody-listens")
    try:
        coins = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", new_tester(emulator))
        refunded_at = int(json.loads(emulator.request("GET", "/admin/v1/time")[1])["now_ms"])
        assert server.upload(pems["com.example.coins"], "missed", coins["receipt"])["state"] == "verified"
        emulator.request("POST", f"/admin/v1/transactions/{coins['transaction_id']}/refund")
        magazine = emulator_buy(emulator, "com.example.magazine", "com.example.magazine.yearly", new_tester(emulator))
        assert server.upload(pems["com.example.magazine"], "reader", magazine["receipt"])["state"] == "verified"
        before = server.user(pems["com.example.magazine"], "reader")["entitlements"][0]["expiresDate"]
        emulator.cli("appstore", "time", "advance", "61m")  # a sandbox year: the subscription renews
        emulator.cli("appstore", "time", "show")
        # The failed delivery of the refund lands in the history a moment later: waited for, as Apple's API shows it.
        history = AppStoreServerAPIClient(keys["com.example.coins"]["privateKey"].encode(), keys["com.example.coins"]["keyId"],
                                          keys["com.example.coins"]["issuerId"], "com.example.coins", Environment.SANDBOX)
        history._base_url = f"{emulator.url}/sandbox"  # the library only knows Apple's hosts
        failures = NotificationHistoryRequest(startDate=refunded_at, endDate=refunded_at + 2 * 86_400_000, onlyFailures=True)

        def payload(jws):
            part = jws.split(".")[1]
            return json.loads(base64.urlsafe_b64decode(part + "=" * (-len(part) % 4)))

        def refund_attempted():  # the refund's notification, tried at least once, in the failures
            for item in history.get_notification_history(None, failures).notificationHistory:
                body = payload(item.signedPayload)
                if (body.get("notificationType") == "REFUND" and item.sendAttempts
                        and payload(body["data"]["signedTransactionInfo"]).get("transactionId") == coins["transaction_id"]):
                    return True
            return False
        deadline = time.time() + 20
        while time.time() < deadline and not refund_attempted():
            time.sleep(0.1)
        assert refund_attempted()
        report = server.cli("server", "reconcile")
        assert report["apps"] == 2 and report["missedNotifications"] >= 1 and report["transactionsQueued"] >= 1, report
        deadline = time.time() + 20
        while time.time() < deadline and (server.user(pems["com.example.coins"], "missed")["balances"] != {"coins": 0}
                                          or server.user(pems["com.example.magazine"], "reader")["entitlements"][0]["expiresDate"] == before):
            time.sleep(0.1)
        assert server.user(pems["com.example.coins"], "missed")["balances"] == {"coins": 0}
        assert server.user(pems["com.example.magazine"], "reader")["entitlements"][0]["expiresDate"] > before
        again = server.cli("server", "reconcile")
        assert again["missedNotifications"] == 0  # applied once
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins")


def test_subscription_scenario_emulator_server_api_and_server_agree(emulator, server, tmp_path):
    """A StoreKit 2 subscription through billing retry with grace, recovery and a refund: at each step the
    Server API's status and the purchase server's view (fed only by notifications) agree."""
    import time
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.magazine").stdout)
    api_key = server.setup_app("com.example.magazine")
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine", "--sandbox-url", server.url + "/v1/notifications/apple")
    emulator.cli("appstore", "grace-period", "--app", "com.example.magazine", "--days", "16")
    try:
        from appstoreserverlibrary.api_client import AppStoreServerAPIClient
        from appstoreserverlibrary.models.Environment import Environment
        client = AppStoreServerAPIClient(key["privateKey"].encode(), key["keyId"], key["issuerId"], "com.example.magazine", Environment.SANDBOX)
        client._base_url = emulator.url + "/sandbox"
        bought = emulator_buy(emulator, "com.example.magazine", "com.example.magazine.yearly", new_tester(emulator))
        original = bought["original_transaction_id"]
        status, body = server.request("POST", "/v1/transactions", {"appUserId": "subscriber", "signedTransaction": bought["signedTransaction"]}, key=api_key)
        assert body["state"] == "verified"

        def step(expected_apple, expected_state, expected_access):
            deadline = time.time() + 20
            while time.time() < deadline:
                user = server.user(api_key, "subscriber")
                states = [s["state"] for s in user["subscriptions"] if s["originalTransactionId"] == original]
                if states == [expected_state] and (user["entitlementIds"] if "entitlementIds" in user else
                                                  [e["id"] for e in user["entitlements"] if e["active"]]) == (["magazine"] if expected_access else []):
                    break
                time.sleep(0.1)
            apple = client.get_all_subscription_statuses(original).data[0].lastTransactions[0].status.value
            assert apple == expected_apple, (apple, expected_apple)
            assert states == [expected_state], (states, expected_state)
            active = [e["id"] for e in user["entitlements"] if e["active"]]
            assert active == (["magazine"] if expected_access else []), user["entitlements"]

        emulator.cli("appstore", "subscription", "fail-billing", original)
        emulator.cli("appstore", "time", "advance", "61m")
        emulator.cli("appstore", "time", "show")
        step(4, "grace_period", True)
        emulator.cli("appstore", "time", "advance", "3m")
        emulator.cli("appstore", "time", "show")
        step(3, "billing_retry", False)
        emulator.cli("appstore", "subscription", "resolve-billing", original)
        step(1, "active", True)
        latest = client.get_all_subscription_statuses(original).data[0].lastTransactions[0]
        import base64 as b64
        latest_id = json.loads(b64.urlsafe_b64decode(latest.signedTransactionInfo.split(".")[1] + "=="))["transactionId"]
        emulator.cli("appstore", "refund", latest_id)
        step(5, "revoked", False)
    finally:
        emulator.cli("appstore", "grace-period", "--app", "com.example.magazine", "--days", "none")
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine")
