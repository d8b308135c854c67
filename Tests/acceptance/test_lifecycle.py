"""The subscription lifecycle on the emulator's clock: billing retry with grace, recovery, expiry,
refund reversal — as notifications, Server API statuses and verifyReceipt's pending_renewal_info show it."""
import json
import time

import pytest
from appstoreserverlibrary.models.Status import Status

from test_notifications import Receiver, verifier
from test_server_api import api_client, new_tester


def notified(receiver, check, original):
    found = []
    for body in receiver.bodies:
        n = check.verify_and_decode_notification(body["signedPayload"])
        if n.data and n.data.signedTransactionInfo and check.verify_and_decode_signed_transaction(n.data.signedTransactionInfo).originalTransactionId == original:
            found.append((n.notificationType.value, n.subtype.value if n.subtype else None))
    return found


def wait_for(receiver, check, original, expected, timeout=10):
    deadline = time.time() + timeout
    while time.time() < deadline and expected not in notified(receiver, check, original):
        time.sleep(0.05)
    return notified(receiver, check, original)


@pytest.fixture
def magazine(emulator):
    receiver = Receiver()
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine", "--sandbox-url", receiver.url)
    emulator.cli("appstore", "grace-period", "--app", "com.example.magazine", "--days", "16")
    yield receiver
    emulator.cli("appstore", "grace-period", "--app", "com.example.magazine", "--days", "none")
    emulator.cli("appstore", "notifications", "set", "--app", "com.example.magazine")
    receiver.close()


def test_billing_retry_with_grace_then_recovery(emulator, jws_root_pem, magazine):
    client, _ = api_client(emulator, "com.example.magazine")
    check = verifier(jws_root_pem, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    original = bought["original_transaction_id"]
    emulator.cli("appstore", "subscription", "fail-billing", original)
    emulator.cli("appstore", "time", "advance", "61m")  # a sandbox year is an hour: the renewal charge fails
    assert ("DID_FAIL_TO_RENEW", "GRACE_PERIOD") in wait_for(magazine, check, original, ("DID_FAIL_TO_RENEW", "GRACE_PERIOD"))
    status = client.get_all_subscription_statuses(original).data[0].lastTransactions[0]
    assert status.status == Status.BILLING_GRACE_PERIOD
    renewal = check.verify_and_decode_renewal_info(status.signedRenewalInfo)
    assert renewal.isInBillingRetryPeriod is True and renewal.gracePeriodExpiresDate is not None
    answer = emulator.verify(bought["receipt"], password=emulator.shared_secret("com.example.magazine"))
    pending = next(p for p in answer["pending_renewal_info"] if p["original_transaction_id"] == original)
    assert pending["is_in_billing_retry_period"] == "1" and pending["expiration_intent"] == "2" and "grace_period_expires_date_ms" in pending

    emulator.cli("appstore", "time", "advance", "3m")  # 16 days of a 5-minute month is 160 s: grace is over, retry goes on
    assert ("GRACE_PERIOD_EXPIRED", None) in wait_for(magazine, check, original, ("GRACE_PERIOD_EXPIRED", None))
    assert client.get_all_subscription_statuses(original).data[0].lastTransactions[0].status == Status.BILLING_RETRY

    emulator.cli("appstore", "subscription", "resolve-billing", original)
    assert ("DID_RENEW", "BILLING_RECOVERY") in wait_for(magazine, check, original, ("DID_RENEW", "BILLING_RECOVERY"))
    assert client.get_all_subscription_statuses(original).data[0].lastTransactions[0].status == Status.ACTIVE


def test_billing_retry_ends_in_expiry_and_controls_renew_and_expire(emulator, jws_root_pem, magazine):
    check = verifier(jws_root_pem, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    original = bought["original_transaction_id"]
    emulator.cli("appstore", "subscription", "renew", original)
    assert ("DID_RENEW", None) in wait_for(magazine, check, original, ("DID_RENEW", None))
    emulator.cli("appstore", "subscription", "fail-billing", original)
    emulator.cli("appstore", "time", "advance", "61m")
    emulator.cli("appstore", "time", "advance", "11m")  # 60 days of retry at a 5-minute month is 10 minutes
    emulator.cli("appstore", "time", "show")
    assert ("EXPIRED", "BILLING_RETRY") in wait_for(magazine, check, original, ("EXPIRED", "BILLING_RETRY"))

    other = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    emulator.cli("appstore", "subscription", "expire", other["original_transaction_id"])
    assert ("EXPIRED", "VOLUNTARY") in wait_for(magazine, check, other["original_transaction_id"], ("EXPIRED", "VOLUNTARY"))


def test_refund_reversal(emulator, jws_root_pem, magazine):
    check = verifier(jws_root_pem, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.weekpass", account=new_tester(emulator))
    emulator.cli("appstore", "refund", bought["transaction_id"], "--reason", "1")
    emulator.cli("appstore", "refund", bought["transaction_id"], "--reverse")
    original = bought["original_transaction_id"]
    kinds = wait_for(magazine, check, original, ("REFUND_REVERSED", None))
    assert ("REFUND", None) in kinds and ("REFUND_REVERSED", None) in kinds
    answer = emulator.verify(bought["receipt"], password=emulator.shared_secret("com.example.magazine"))
    entry = next(e for e in answer["receipt"]["in_app"] if e["transaction_id"] == bought["transaction_id"])
    assert "cancellation_date" not in entry
    result = emulator.cli("appstore", "refund", bought["transaction_id"], "--reverse", check=False)
    assert result.returncode != 0


def test_price_increase_needs_consent_or_the_subscription_lapses(emulator, jws_root_pem, magazine):
    check = verifier(jws_root_pem, "com.example.magazine")
    client, _ = api_client(emulator, "com.example.magazine")
    agreed = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    refused = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    for bought in (agreed, refused):
        emulator.cli("appstore", "subscription", "price-increase", bought["original_transaction_id"], "--price", "59.99")
    emulator.cli("appstore", "subscription", "consent-price-increase", agreed["original_transaction_id"])
    pending = check.verify_and_decode_renewal_info(client.get_all_subscription_statuses(refused["original_transaction_id"]).data[0].lastTransactions[0].signedRenewalInfo)
    assert pending.priceIncreaseStatus.value == 0 and pending.renewalPrice == 59990
    emulator.cli("appstore", "time", "advance", "61m")
    kinds = wait_for(magazine, check, agreed["original_transaction_id"], ("DID_RENEW", None))
    assert ("PRICE_INCREASE", "PENDING") in kinds and ("PRICE_INCREASE", "ACCEPTED") in kinds and ("DID_RENEW", None) in kinds
    renewed = client.get_all_subscription_statuses(agreed["original_transaction_id"]).data[0].lastTransactions[0]
    assert renewed.status == Status.ACTIVE and check.verify_and_decode_signed_transaction(renewed.signedTransactionInfo).price == 59990
    assert ("EXPIRED", "PRICE_INCREASE") in wait_for(magazine, check, refused["original_transaction_id"], ("EXPIRED", "PRICE_INCREASE"))


def test_mass_extension_sends_a_summary_notification(emulator, jws_root_pem, magazine):
    from appstoreserverlibrary.models.ExtendReasonCode import ExtendReasonCode
    from appstoreserverlibrary.models.MassExtendRenewalDateRequest import MassExtendRenewalDateRequest
    import uuid as uuidlib
    client, _ = api_client(emulator, "com.example.magazine")
    emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    request_id = str(uuidlib.uuid4())
    client.extend_renewal_date_for_all_active_subscribers(MassExtendRenewalDateRequest(
        extendByDays=3, extendReasonCode=ExtendReasonCode.OTHER, requestIdentifier=request_id, productId="com.example.magazine.yearly"))
    check = verifier(jws_root_pem, "com.example.magazine")
    deadline = time.time() + 10
    summary = None
    while time.time() < deadline and summary is None:
        for body in magazine.bodies:
            n = check.verify_and_decode_notification(body["signedPayload"])
            if n.summary and n.summary.requestIdentifier == request_id:
                summary = n
        time.sleep(0.05)
    assert summary.notificationType.value == "RENEWAL_EXTENSION" and summary.subtype.value == "SUMMARY"
    assert summary.summary.succeededCount >= 1 and summary.summary.productId == "com.example.magazine.yearly"


def test_offer_codes_start_or_change_a_subscription(emulator, jws_root_pem, magazine):
    check = verifier(jws_root_pem, "com.example.magazine")
    tester = new_tester(emulator)
    redeemed = json.loads(emulator.cli("appstore", "redeem-code", "--app", "com.example.magazine", "--account", tester,
                                       "--product", "com.example.magazine.monthly", "--offer", "SPRING3FREE").stdout)
    signed = check.verify_and_decode_signed_transaction(redeemed["signedTransaction"])
    assert signed.offerType.value == 3 and signed.offerIdentifier == "SPRING3FREE" and signed.price == 0
    assert ("SUBSCRIBED", "INITIAL_BUY") in wait_for(magazine, check, signed.originalTransactionId, ("SUBSCRIBED", "INITIAL_BUY"))
    yearly = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    email = json.loads(emulator.request("GET", f"/admin/v1/transactions/{yearly['transaction_id']}")[1])["accountEmail"]
    # SPRING3FREE is for new and lapsed subscribers (its eligibility): refused to an active one, taken once lapsed.
    refused = emulator.cli("appstore", "redeem-code", "--app", "com.example.magazine", "--account", email,
                           "--product", "com.example.magazine.monthly", "--offer", "SPRING3FREE", check=False)
    assert refused.returncode != 0 and "this customer is existing" in refused.stdout + refused.stderr, refused.stderr
    emulator.cli("appstore", "subscription", "expire", yearly["original_transaction_id"])
    changed = json.loads(emulator.cli("appstore", "redeem-code", "--app", "com.example.magazine", "--account", email,
                                      "--product", "com.example.magazine.monthly", "--offer", "SPRING3FREE").stdout)
    lapsed = check.verify_and_decode_signed_transaction(changed["signedTransaction"])
    assert lapsed.offerIdentifier == "SPRING3FREE" and lapsed.originalTransactionId == yearly["original_transaction_id"]
    bad = emulator.cli("appstore", "redeem-code", "--app", "com.example.magazine", "--account", tester, "--product", "com.example.magazine.monthly",
                       "--offer", "NOSUCHCODE", check=False)
    assert bad.returncode != 0
