"""The 2025 JWS forms of developer-signed purchase options, made by Apple's own library
(PromotionalOfferV2SignatureCreator, IntroductoryOfferEligibilitySignatureCreator), honoured by the emulator's device API."""
import json
import uuid

from appstoreserverlibrary.jws_signature_creator import IntroductoryOfferEligibilitySignatureCreator, PromotionalOfferV2SignatureCreator

APP, PRODUCT = "com.example.magazine", "com.example.magazine.monthly"


def pay(emulator, device, **options):
    return emulator.request("POST", "/device/v1/payments", {"app": APP, "device": device, "productId": PRODUCT, **options})


def test_apples_signature_creators_make_offers_the_emulator_honours(emulator):
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", APP).stdout)
    tester = f"jws{uuid.uuid4().hex[:8]}@example.com"
    emulator.cli("appstore", "tester", "add", tester)
    first = emulator.buy(APP, PRODUCT, account=tester)
    device = first["device"]
    emulator.cli("appstore", "subscription", "expire", first["original_transaction_id"])
    promotional = PromotionalOfferV2SignatureCreator(key["privateKey"].encode(), key["keyId"], key["issuerId"], APP)
    status, body = pay(emulator, device, promotionalOfferJWS=promotional.create_signature(PRODUCT, "comeback50", first["transaction_id"]))
    assert status == 201, body
    redeemed = json.loads(body)
    assert redeemed["transactionState"] == "purchased"
    # An offer the product does not have, and a signature by another app's key, are refused with StoreKit's codes.
    status, body = pay(emulator, device, promotionalOfferJWS=promotional.create_signature(PRODUCT, "no-such-offer", None))
    assert status == 400 and json.loads(body)["error"]["skError"] == "invalidOfferIdentifier"
    other = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.coins").stdout)
    foreign = PromotionalOfferV2SignatureCreator(other["privateKey"].encode(), other["keyId"], other["issuerId"], APP)
    status, body = pay(emulator, device, promotionalOfferJWS=foreign.create_signature(PRODUCT, "comeback50", None))
    assert status == 400 and json.loads(body)["error"]["skError"] == "invalidSignature"
    # The developer allows the returning customer the free trial again.
    emulator.cli("appstore", "subscription", "expire", first["original_transaction_id"])
    eligibility = IntroductoryOfferEligibilitySignatureCreator(key["privateKey"].encode(), key["keyId"], key["issuerId"], APP)
    status, body = pay(emulator, device, introductoryOfferEligibilityJWS=eligibility.create_signature(PRODUCT, True, first["transaction_id"]))
    assert status == 201, body
    signed = json.loads(body)["signedTransaction"]
    import base64
    payload = json.loads(base64.urlsafe_b64decode(signed.split(".")[1] + "=="))
    assert payload["offerType"] == 1 and payload["offerDiscountType"] == "FREE_TRIAL"
