"""App Store Server Notifications V2 from the emulator, read with Apple's SignedDataVerifier and API client."""
import http.server
import json
import ssl
import threading
import time
import uuid

import pytest
from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.models.NotificationHistoryRequest import NotificationHistoryRequest
from appstoreserverlibrary.models.NotificationTypeV2 import NotificationTypeV2
from appstoreserverlibrary.models.SendAttemptResult import SendAttemptResult
from appstoreserverlibrary.models.Subtype import Subtype
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier

from test_server_api import api_client, new_tester


class Receiver:
    """A local HTTP endpoint that records notification bodies and answers with `status`."""

    def __init__(self, status=200):
        self.bodies = []
        self.status = status
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                length = int(self.headers.get("Content-Length", 0))
                receiver.bodies.append(json.loads(self.rfile.read(length)))
                self.send_response(receiver.status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/notifications"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def wait_for(self, count, timeout=10):
        deadline = time.time() + timeout
        while len(self.bodies) < count and time.time() < deadline:
            time.sleep(0.05)
        return self.bodies

    def close(self):
        self.server.shutdown()


@pytest.fixture
def receiver():
    running = Receiver()
    yield running
    running.close()


def verifier(jws_root_pem, bundle):
    return SignedDataVerifier([ssl.PEM_cert_to_DER_cert(jws_root_pem.read_text())], False, Environment.SANDBOX, bundle, None)


def test_purchases_and_refunds_are_notified_with_payloads_apple_accepts(emulator, jws_root_pem, receiver):
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.football", "--sandbox-url", receiver.url)
    tester = new_tester(emulator)
    bought = emulator.buy("com.example.football", "GoldenGlobe", account=tester)
    status, _ = emulator.request("POST", f"/admin/v1/transactions/{bought['transaction_id']}/refund")
    assert status == 200
    bodies = receiver.wait_for(2)
    check = verifier(jws_root_pem, "com.example.football")
    decoded = [check.verify_and_decode_notification(body["signedPayload"]) for body in bodies]
    mine = [d for d in decoded if check.verify_and_decode_signed_transaction(d.data.signedTransactionInfo).transactionId == bought["transaction_id"]]
    # Apple does not promise order (receivers sort by signedDate), and neither do we.
    assert sorted(d.notificationType.value for d in mine) == ["ONE_TIME_CHARGE", "REFUND"]
    refund = next(d for d in mine if d.notificationType == NotificationTypeV2.REFUND)
    assert check.verify_and_decode_signed_transaction(refund.data.signedTransactionInfo).revocationDate is not None
    assert refund.data.bundleId == "com.example.football"
    assert len({d.notificationUUID for d in mine}) == 2 and all(d.version == "2.0" for d in mine)


def test_subscription_lifecycle_notifications(emulator, jws_root_pem, receiver):
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine", "--sandbox-url", receiver.url)
    tester = new_tester(emulator)
    bought = emulator.buy("com.example.magazine", "com.example.magazine.monthly", account=tester)
    original = bought["original_transaction_id"]
    status, _ = emulator.request("POST", f"/admin/v1/subscriptions/{original}/auto-renew?enabled=false")
    assert status == 200
    check = verifier(jws_root_pem, "com.example.magazine")

    def mine():
        result = []
        for body in receiver.bodies:
            n = check.verify_and_decode_notification(body["signedPayload"])
            if n.data and n.data.signedTransactionInfo:
                t = check.verify_and_decode_signed_transaction(n.data.signedTransactionInfo)
                if t.originalTransactionId == original:
                    result.append((n.notificationType, n.subtype, n))
        return result

    deadline = time.time() + 10
    while len(mine()) < 2 and time.time() < deadline:
        time.sleep(0.05)
    kinds = {(t, s): n for t, s, n in mine()}
    assert set(kinds) == {(NotificationTypeV2.SUBSCRIBED, Subtype.INITIAL_BUY), (NotificationTypeV2.DID_CHANGE_RENEWAL_STATUS, Subtype.AUTO_RENEW_DISABLED)}
    renewal = check.verify_and_decode_renewal_info(kinds[(NotificationTypeV2.DID_CHANGE_RENEWAL_STATUS, Subtype.AUTO_RENEW_DISABLED)].data.signedRenewalInfo)
    assert renewal.autoRenewStatus.value == 0


def test_test_notification_status_and_history_with_failures(emulator, jws_root_pem):
    failing = Receiver(status=500)
    try:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.comics", "--sandbox-url", failing.url)
        client, _ = api_client(emulator, "com.example.comics")
        token = client.request_test_notification().testNotificationToken
        failing.wait_for(1)
        deadline = time.time() + 10
        while time.time() < deadline:
            status = client.get_test_notification_status(token)
            if status.sendAttempts:
                break
            time.sleep(0.05)
        assert [a.sendAttemptResult for a in status.sendAttempts] == [SendAttemptResult.UNSUCCESSFUL_HTTP_RESPONSE_CODE]
        test = verifier(jws_root_pem, "com.example.comics").verify_and_decode_notification(status.signedPayload)
        assert test.notificationType == NotificationTypeV2.TEST and test.notificationUUID == token.split("_")[0]
        time.sleep(0.5)
        assert len(failing.bodies) == 1  # sandbox sends once
        now = int(json.loads(emulator.request("GET", "/admin/v1/time")[1])["now_ms"])  # the emulator's clock, which tests move
        history = client.get_notification_history(None, NotificationHistoryRequest(startDate=now - 86_400_000 * 30, endDate=now + 1000, onlyFailures=True))
        payloads = [item.signedPayload for item in history.notificationHistory]
        assert status.signedPayload in payloads
    finally:
        failing.close()


def test_production_retries_on_apples_schedule_by_the_emulator_clock(emulator, jws_root_pem):
    failing = Receiver(status=503)
    try:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins", "--production-url", failing.url)
        email = f"retry{uuid.uuid4().hex[:8]}@example.com"
        emulator.cli("appstore", "tester", "add", email, "--production")
        bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=email)
        assert len(failing.wait_for(1)) == 1
        time.sleep(0.5)
        assert len(failing.bodies) == 1  # nothing more until an hour has passed
        emulator.cli("appstore", "time", "advance", "61m")
        assert len(failing.wait_for(2)) == 2
        failing.status = 200
        emulator.cli("appstore", "time", "advance", "12h1m")
        assert len(failing.wait_for(3)) == 3
        emulator.cli("appstore", "time", "advance", "25h")
        time.sleep(0.5)
        assert len(failing.bodies) == 3  # delivered: no more attempts
        assert all(body == failing.bodies[0] for body in failing.bodies)
        client, _ = api_client(emulator, "com.example.coins", environment="production")
        now = int(json.loads(emulator.request("GET", "/admin/v1/time")[1])["now_ms"])
        history = client.get_notification_history(None, NotificationHistoryRequest(startDate=now - 86_400_000 * 3, endDate=now + 1000,
                                                                                   transactionId=bought["transaction_id"]))
        attempts = history.notificationHistory[0].sendAttempts
        assert [a.sendAttemptResult for a in attempts] == [SendAttemptResult.UNSUCCESSFUL_HTTP_RESPONSE_CODE,
                                                          SendAttemptResult.UNSUCCESSFUL_HTTP_RESPONSE_CODE, SendAttemptResult.SUCCESS]
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins")
        failing.close()
