"""The device API's StoreKit 2 calls, their JWS verified by Apple's SignedDataVerifier."""
import base64
import hashlib
import json
import ssl
import uuid

from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier

from test_server_api import new_tester


def verifier(jws_root_pem, bundle):
    return SignedDataVerifier([ssl.PEM_cert_to_DER_cert(jws_root_pem.read_text())], False, Environment.SANDBOX, bundle, None)


def device_for(emulator, account):
    status, body = emulator.request("POST", "/device/v1/devices", {"account": account})
    assert status == 201
    return json.loads(body)["id"]


def get(emulator, path):
    status, body = emulator.request("GET", path)
    assert status == 200, body
    return json.loads(body)


def test_purchase_with_app_account_token_and_current_entitlements(emulator, jws_root_pem):
    tester = new_tester(emulator)
    device = device_for(emulator, tester)
    token = str(uuid.uuid4())
    status, body = emulator.request("POST", "/device/v1/payments", {"app": "com.example.football", "device": device, "productId": "GoldenGlobe",
                                                                   "appAccountToken": token})
    assert status == 201
    purchase = json.loads(body)
    check = verifier(jws_root_pem, "com.example.football")
    signed = check.verify_and_decode_signed_transaction(purchase["signedTransaction"])
    assert signed.appAccountToken == token and signed.productId == "GoldenGlobe"
    emulator.request("POST", "/device/v1/payments", {"app": "com.example.football", "device": device, "productId": "EnergyBottle"})
    entitlements = get(emulator, f"/device/v2/entitlements?app=com.example.football&device={device}")["signedTransactions"]
    assert [check.verify_and_decode_signed_transaction(s).productId for s in entitlements] == ["GoldenGlobe"]  # consumables are not entitlements
    unfinished = get(emulator, f"/device/v2/transactions/unfinished?app=com.example.football&device={device}")["signedTransactions"]
    assert sorted(check.verify_and_decode_signed_transaction(s).productId for s in unfinished) == ["EnergyBottle", "GoldenGlobe"]
    status, _ = emulator.request("POST", "/device/v1/payments", {"app": "com.example.football", "device": device, "productId": "GoldenGlobe",
                                                                "appAccountToken": "not-a-uuid"})
    assert status == 400


def test_updates_report_refunds_and_entitlements_drop_them(emulator, jws_root_pem):
    tester = new_tester(emulator)
    device = device_for(emulator, tester)
    first = get(emulator, f"/device/v2/transactions/updates?app=com.example.football&device={device}")
    status, body = emulator.request("POST", "/device/v1/payments", {"app": "com.example.football", "device": device, "productId": "ProtectiveGloves"})
    bought = json.loads(body)
    emulator.request("POST", f"/admin/v1/transactions/{bought['transactionIdentifier']}/refund")
    updates = get(emulator, f"/device/v2/transactions/updates?app=com.example.football&device={device}&since={first['next']}")
    check = verifier(jws_root_pem, "com.example.football")
    decoded = [check.verify_and_decode_signed_transaction(s) for s in updates["signedTransactions"]]
    assert [d.transactionId for d in decoded] == [bought["transactionIdentifier"]] and decoded[0].revocationDate is not None
    assert get(emulator, f"/device/v2/entitlements?app=com.example.football&device={device}")["signedTransactions"] == []


def test_app_transaction_device_verification_and_subscription_status(emulator, jws_root_pem):
    tester = new_tester(emulator)
    device = device_for(emulator, tester)
    nonce = str(uuid.uuid4())
    signed = get(emulator, f"/device/v2/app-transaction?app=com.example.magazine&device={device}&nonce={nonce}")["signedAppTransaction"]
    app = verifier(jws_root_pem, "com.example.magazine").verify_and_decode_app_transaction(signed)
    assert app.bundleId == "com.example.magazine" and app.receiptType == Environment.SANDBOX
    expected = base64.b64encode(hashlib.sha384((nonce.lower() + device.lower()).encode()).digest()).decode()
    assert app.deviceVerification == expected and app.deviceVerificationNonce == nonce
    emulator.request("POST", "/device/v1/payments", {"app": "com.example.magazine", "device": device, "productId": "com.example.magazine.yearly"})
    statuses = get(emulator, f"/device/v2/subscriptions/status?app=com.example.magazine&device={device}")["statuses"]
    assert len(statuses) == 1 and statuses[0]["state"] == 1
    renewal = verifier(jws_root_pem, "com.example.magazine").verify_and_decode_renewal_info(statuses[0]["signedRenewalInfo"])
    assert renewal.productId == "com.example.magazine.yearly"
    status, body = emulator.request("POST", "/device/v2/sync", {"app": "com.example.magazine", "device": device})
    synced = json.loads(body)
    assert status == 200 and synced["receipt"] and len(synced["signedTransactions"]) == 1


def test_promotional_offer_signed_with_apples_library(emulator, jws_root_pem):
    import time
    from appstoreserverlibrary.promotional_offer import PromotionalOfferSignatureCreator
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.magazine").stdout)
    creator = PromotionalOfferSignatureCreator(key["privateKey"].encode(), key["keyId"], "com.example.magazine")
    tester = new_tester(emulator)
    device = device_for(emulator, tester)
    token = str(uuid.uuid4())

    def offer(nonce=None, timestamp=None, offer_id="comeback50", username=token):
        nonce = nonce or uuid.uuid4()
        timestamp = timestamp or int(time.time() * 1000)
        signature = creator.create_signature("com.example.magazine.monthly", offer_id, username, nonce, timestamp)
        return {"offerId": offer_id, "keyId": key["keyId"], "nonce": str(nonce), "timestamp": timestamp, "signature": signature}

    def pay(promotional):
        status, body = emulator.request("POST", "/device/v1/payments", {"app": "com.example.magazine", "device": device,
                                                                       "productId": "com.example.magazine.monthly", "appAccountToken": token,
                                                                       "promotionalOffer": promotional})
        return status, json.loads(body)

    status, body = pay(offer())
    assert status == 403 and body["error"]["skError"] == "ineligibleForOffer"  # never subscribed in the group
    status, yearly = emulator.request("POST", "/device/v1/payments", {"app": "com.example.magazine", "device": device, "productId": "com.example.magazine.yearly"})
    emulator.cli("appstore", "subscription", "expire", json.loads(yearly)["transactionIdentifier"])  # a lapsed subscriber comes back
    status, body = pay(offer(username="someone-else"))
    assert status == 400 and body["error"]["skError"] == "invalidSignature"
    status, body = pay(offer(timestamp=int(time.time() * 1000) - 25 * 3_600_000))
    assert status == 400 and body["error"]["skError"] == "invalidSignature"
    status, body = pay(offer(offer_id="no-such-offer"))
    assert status == 400 and body["error"]["skError"] == "invalidOfferIdentifier"
    status, body = pay(offer())
    assert status == 201, body
    signed = verifier(jws_root_pem, "com.example.magazine").verify_and_decode_signed_transaction(body["signedTransaction"])
    assert signed.offerType.value == 2 and signed.offerIdentifier == "comeback50" and signed.price == 2490
