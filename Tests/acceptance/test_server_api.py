"""The emulator's App Store Server API, driven by Apple's own app-store-server-library client."""
import json
import ssl
import time
import urllib.error
import urllib.request
import uuid

import jwt
import pytest
from appstoreserverlibrary.api_client import APIException, AppStoreServerAPIClient, GetTransactionHistoryVersion
from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.models.Status import Status
from appstoreserverlibrary.models.TransactionHistoryRequest import Order, ProductType, TransactionHistoryRequest
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier


def new_tester(emulator):
    email = f"api{uuid.uuid4().hex[:10]}@example.com"
    emulator.cli("appstore", "tester", "add", email)
    return email


def api_client(emulator, bundle, environment="sandbox"):
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", bundle).stdout)
    client = AppStoreServerAPIClient(key["privateKey"].encode(), key["keyId"], key["issuerId"], bundle,
                                     Environment.SANDBOX if environment == "sandbox" else Environment.PRODUCTION)
    client._base_url = f"{emulator.url}/{environment}"  # the library only knows Apple's hosts
    return client, key


def verifier(jws_root_pem, bundle):
    return SignedDataVerifier([ssl.PEM_cert_to_DER_cert(jws_root_pem.read_text())], False, Environment.SANDBOX, bundle, None)


def test_get_transaction_info_returns_a_transaction_apples_verifier_accepts(emulator, jws_root_pem):
    client, _ = api_client(emulator, "com.example.coins")
    bought = emulator.buy("com.example.coins", "Nada.JPYF03", account=new_tester(emulator))
    info = client.get_transaction_info(bought["transaction_id"])
    decoded = verifier(jws_root_pem, "com.example.coins").verify_and_decode_signed_transaction(info.signedTransactionInfo)
    assert decoded.transactionId == bought["transaction_id"] and decoded.productId == "Nada.JPYF03"


def test_history_pages_by_twenty_with_revision_filters_and_sort(emulator, jws_root_pem):
    client, _ = api_client(emulator, "com.example.coins")
    tester = new_tester(emulator)
    bought = [emulator.buy("com.example.coins", "Nada.JPYF01" if i % 5 else "Nada.JPYF02", account=tester) for i in range(23)]
    check = verifier(jws_root_pem, "com.example.coins")
    first = client.get_transaction_history(bought[5]["transaction_id"], None, TransactionHistoryRequest(), GetTransactionHistoryVersion.V2)
    assert len(first.signedTransactions) == 20 and first.hasMore is True and first.bundleId == "com.example.coins"
    second = client.get_transaction_history(bought[5]["transaction_id"], first.revision, TransactionHistoryRequest(), GetTransactionHistoryVersion.V2)
    assert len(second.signedTransactions) == 3 and second.hasMore is False
    ids = [check.verify_and_decode_signed_transaction(s).transactionId for s in first.signedTransactions + second.signedTransactions]
    assert ids == [b["transaction_id"] for b in bought]
    newest = client.get_transaction_history(bought[0]["transaction_id"], None, TransactionHistoryRequest(sort=Order.DESCENDING), GetTransactionHistoryVersion.V2)
    assert check.verify_and_decode_signed_transaction(newest.signedTransactions[0]).transactionId == bought[-1]["transaction_id"]
    only = client.get_transaction_history(bought[0]["transaction_id"], None, TransactionHistoryRequest(productIds=["Nada.JPYF02"]),
                                          GetTransactionHistoryVersion.V2)
    assert len(only.signedTransactions) == 5
    none = client.get_transaction_history(bought[0]["transaction_id"], None, TransactionHistoryRequest(productTypes=[ProductType.AUTO_RENEWABLE]),
                                          GetTransactionHistoryVersion.V2)
    assert none.signedTransactions == [] and none.hasMore is False


def test_subscription_statuses_with_signed_renewal_info(emulator, jws_root_pem):
    client, _ = api_client(emulator, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.monthly", account=new_tester(emulator))
    statuses = client.get_all_subscription_statuses(bought["transaction_id"])
    assert len(statuses.data) == 1
    last = statuses.data[0].lastTransactions[0]
    assert last.status == Status.ACTIVE and last.originalTransactionId == bought["original_transaction_id"]
    renewal = verifier(jws_root_pem, "com.example.magazine").verify_and_decode_renewal_info(last.signedRenewalInfo)
    assert renewal.productId == "com.example.magazine.monthly" and renewal.autoRenewStatus.value == 1
    assert client.get_all_subscription_statuses(bought["transaction_id"], [Status.EXPIRED]).data == []


def test_apple_error_codes_for_unknown_invalid_and_wrong_environment(emulator):
    client, _ = api_client(emulator, "com.example.coins")
    with pytest.raises(APIException) as unknown:
        client.get_transaction_info("2999999999999999")
    assert unknown.value.http_status_code == 404 and unknown.value.raw_api_error == 4040010
    with pytest.raises(APIException) as invalid:
        client.get_transaction_info("not-a-number")
    assert invalid.value.http_status_code == 400 and invalid.value.raw_api_error == 4000006
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    production, _ = api_client(emulator, "com.example.coins", environment="production")
    with pytest.raises(APIException) as elsewhere:
        production.get_transaction_info(bought["transaction_id"])
    assert elsewhere.value.raw_api_error == 4040010


def test_bearer_tokens_are_checked_like_apples(emulator):
    _, key = api_client(emulator, "com.example.coins")
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    path = f"/sandbox/inApps/v1/transactions/{bought['transaction_id']}"
    now = int(time.time())

    def call(claims, kid=key["keyId"], private=key["privateKey"]):
        token = jwt.encode(claims, private, algorithm="ES256", headers={"kid": kid})
        status, _ = emulator.request("GET", path, headers={"Authorization": "Bearer " + token})
        return status

    good = {"iss": key["issuerId"], "aud": "appstoreconnect-v1", "bid": "com.example.coins", "exp": now + 300}
    assert call(good) == 200
    assert call({**good, "iat": now}) == 200
    assert call({**good, "exp": now - 10}) == 401
    assert call({**good, "iat": now, "exp": now + 7200}) == 401
    assert call({**good, "aud": "someone-else"}) == 401
    assert call({**good, "iss": str(uuid.uuid4())}) == 401
    assert call({**good, "bid": "com.example.football"}) == 401
    assert call(good, kid="NOSUCHKEY1") == 401
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    stranger = ec.generate_private_key(ec.SECP256R1()).private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                                    serialization.NoEncryption())
    assert call(good, private=stranger) == 401
    status, _ = emulator.request("GET", path)
    assert status == 401


def test_refund_history_order_lookup_and_app_account_token(emulator, jws_root_pem):
    from appstoreserverlibrary.models.OrderLookupStatus import OrderLookupStatus
    from appstoreserverlibrary.models.UpdateAppAccountTokenRequest import UpdateAppAccountTokenRequest
    client, _ = api_client(emulator, "com.example.football")
    tester = new_tester(emulator)
    gloves = emulator.buy("com.example.football", "ProtectiveGloves", account=tester)
    globe = emulator.buy("com.example.football", "GoldenGlobe", account=tester)
    emulator.request("POST", f"/admin/v1/transactions/{globe['transaction_id']}/refund")
    check = verifier(jws_root_pem, "com.example.football")
    refunds = client.get_refund_history(gloves["transaction_id"], None)
    assert [check.verify_and_decode_signed_transaction(s).transactionId for s in refunds.signedTransactions] == [globe["transaction_id"]]
    assert refunds.hasMore is False
    # Refund History v1 (deprecated, no revision): the same refunds at once, signed with the same key discipline.
    import jwt as pyjwt
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.football").stdout)
    token = pyjwt.encode({"iss": key["issuerId"], "iat": int(time.time()), "exp": int(time.time()) + 600, "aud": "appstoreconnect-v1",
                          "bid": "com.example.football"}, key["privateKey"], algorithm="ES256", headers={"kid": key["keyId"]})
    request = urllib.request.Request(f"{emulator.url}/sandbox/inApps/v1/refund/lookup/{gloves['original_transaction_id']}",
                                     headers={"Authorization": "Bearer " + token})
    with urllib.request.urlopen(request, timeout=30) as response:
        v1 = json.loads(response.read())
    assert [check.verify_and_decode_signed_transaction(s).transactionId for s in v1["signedTransactions"]] == [globe["transaction_id"]]
    assert set(v1) == {"signedTransactions"}

    token = str(uuid.uuid4())
    client.set_app_account_token(gloves["transaction_id"], UpdateAppAccountTokenRequest(appAccountToken=token))
    info = client.get_transaction_info(gloves["transaction_id"])
    assert check.verify_and_decode_signed_transaction(info.signedTransactionInfo).appAccountToken == token
    with pytest.raises(APIException) as bad:
        client.set_app_account_token(gloves["transaction_id"], UpdateAppAccountTokenRequest(appAccountToken="not-a-uuid"))
    assert bad.value.raw_api_error == 4000183

    # Order ids exist only in production.
    email = f"prod{uuid.uuid4().hex[:8]}@example.com"
    emulator.cli("appstore", "tester", "add", email, "--production")
    production, _ = api_client(emulator, "com.example.football", environment="production")
    bought = emulator.buy("com.example.football", "EnergyBottle", account=email)
    order = json.loads(emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}/order")[1])["orderId"]
    found = production.look_up_order_id(order)
    assert found.status == OrderLookupStatus.VALID and len(found.signedTransactions) == 1
    assert production.look_up_order_id("MNOSUCHORD").status == OrderLookupStatus.INVALID


def test_renewal_date_extensions_single_and_mass(emulator):
    from appstoreserverlibrary.models.ExtendReasonCode import ExtendReasonCode
    from appstoreserverlibrary.models.ExtendRenewalDateRequest import ExtendRenewalDateRequest
    from appstoreserverlibrary.models.MassExtendRenewalDateRequest import MassExtendRenewalDateRequest
    client, _ = api_client(emulator, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    original = bought["original_transaction_id"]
    before = int(bought["expires_date_ms"])
    request = ExtendRenewalDateRequest(extendByDays=30, extendReasonCode=ExtendReasonCode.CUSTOMER_SATISFACTION, requestIdentifier=str(uuid.uuid4()))
    first = client.extend_subscription_renewal_date(original, request)
    assert first.success is True and first.effectiveDate > before and first.originalTransactionId == original
    client.extend_subscription_renewal_date(original, request)
    with pytest.raises(APIException) as third:  # at most twice in 365 days
        client.extend_subscription_renewal_date(original, request)
    assert third.value.http_status_code == 403 and third.value.raw_api_error == 4030005
    with pytest.raises(APIException) as too_long:
        client.extend_subscription_renewal_date(original, ExtendRenewalDateRequest(extendByDays=91, extendReasonCode=ExtendReasonCode.OTHER,
                                                                                   requestIdentifier="x"))
    assert too_long.value.raw_api_error == 4000009

    trial = emulator.buy("com.example.magazine", "com.example.magazine.monthly", account=new_tester(emulator))
    with pytest.raises(APIException) as free:  # free-trial periods cannot be extended
        client.extend_subscription_renewal_date(trial["original_transaction_id"], request)
    assert free.value.raw_api_error == 4030004

    emulator.buy("com.example.magazine", "com.example.magazine.yearly", account=new_tester(emulator))
    request_id = str(uuid.uuid4())
    mass = client.extend_renewal_date_for_all_active_subscribers(MassExtendRenewalDateRequest(
        extendByDays=7, extendReasonCode=ExtendReasonCode.SERVICE_ISSUE_OR_OUTAGE, requestIdentifier=request_id, productId="com.example.magazine.yearly"))
    assert mass.requestIdentifier == request_id
    status = client.get_status_of_subscription_renewal_date_extensions(request_id, "com.example.magazine.yearly")
    # The new subscriber is extended; the one already extended twice this year is not.
    assert status.complete is True and status.succeededCount >= 1 and status.failedCount >= 1


def test_consumption_information_is_validated(emulator):
    from appstoreserverlibrary.models.ConsumptionRequest import ConsumptionRequest
    from appstoreserverlibrary.models.DeliveryStatus import DeliveryStatus
    client, _ = api_client(emulator, "com.example.coins")
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    client.send_consumption_information(bought["transaction_id"], ConsumptionRequest(
        customerConsented=True, sampleContentProvided=False, deliveryStatus=DeliveryStatus.DELIVERED, consumptionPercentage=100000))
    status, body = emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}")
    assert json.loads(body)["consumptionInfo"]["deliveryStatus"] == "DELIVERED"
    with pytest.raises(APIException) as refused:
        client.send_consumption_information(bought["transaction_id"], ConsumptionRequest(
            customerConsented=False, sampleContentProvided=False, deliveryStatus=DeliveryStatus.DELIVERED))
    assert refused.value.raw_api_error == 4000035


def test_rate_limits_answer_429_with_retry_after(emulator):
    client, key = api_client(emulator, "com.example.comics")
    bought = emulator.buy("com.example.comics", "com.raywenderlich.inapprage.drummerrage", account=new_tester(emulator))
    status, body = emulator.request("GET", "/admin/v1/quirks")
    quirks = json.loads(body)
    emulator.request("PUT", "/admin/v1/quirks", {**quirks, "serverAPIHourlyLimit": 2})
    try:
        client.get_transaction_info(bought["transaction_id"])
        client.get_transaction_info(bought["transaction_id"])
        with pytest.raises(APIException) as limited:
            client.get_transaction_info(bought["transaction_id"])
        assert limited.value.http_status_code == 429 and limited.value.raw_api_error == 4290000
        token = jwt.encode({"iss": key["issuerId"], "aud": "appstoreconnect-v1", "bid": "com.example.comics", "exp": int(time.time()) + 300},
                           key["privateKey"], algorithm="ES256", headers={"kid": key["keyId"]})
        request = urllib.request.Request(f"{emulator.url}/sandbox/inApps/v1/transactions/{bought['transaction_id']}",
                                         headers={"Authorization": "Bearer " + token})
        with pytest.raises(urllib.error.HTTPError) as raw:
            urllib.request.urlopen(request)
        assert int(raw.value.headers["Retry-After"]) > time.time() * 1000
    finally:
        emulator.request("PUT", "/admin/v1/quirks", quirks)


def test_app_transaction_info_and_finish_transaction(emulator, jws_root_pem):
    client, _ = api_client(emulator, "com.example.coins")
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    info = client.get_app_transaction_info(bought["transaction_id"])
    app = verifier(jws_root_pem, "com.example.coins").verify_and_decode_app_transaction(info.signedAppTransactionInfo)
    assert app.bundleId == "com.example.coins" and app.deviceVerification is None
    assert json.loads(emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}")[1])["finished"] is False
    client.finish_transaction(bought["transaction_id"])
    assert json.loads(emulator.request("GET", f"/admin/v1/transactions/{bought['transaction_id']}")[1])["finished"] is True


def test_fields_of_2025_decode_in_apples_library_and_app_transaction_id_looks_up(emulator, jws_root_pem):
    client, _ = api_client(emulator, "com.example.magazine")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.monthly", account=new_tester(emulator))
    check = verifier(jws_root_pem, "com.example.magazine")
    first = check.verify_and_decode_signed_transaction(client.get_transaction_info(bought["transaction_id"]).signedTransactionInfo)
    assert first.offerDiscountType.value == "FREE_TRIAL" and first.offerPeriod == "P1W" and first.offerType.value == 1
    assert first.appTransactionId and first.appTransactionId.isdigit()
    # The appTransactionId stands for the customer's latest transaction of the app.
    again = check.verify_and_decode_signed_transaction(client.get_transaction_info(first.appTransactionId).signedTransactionInfo)
    assert again.transactionId == bought["transaction_id"]
    statuses = client.get_all_subscription_statuses(first.appTransactionId)
    renewal = check.verify_and_decode_renewal_info(statuses.data[0].lastTransactions[0].signedRenewalInfo)
    assert renewal.appTransactionId == first.appTransactionId
    emulator.cli("appstore", "refund", bought["transaction_id"])
    refunded = check.verify_and_decode_signed_transaction(client.get_transaction_info(bought["transaction_id"]).signedTransactionInfo)
    assert refunded.revocationType.value == "REFUND_FULL" and refunded.revocationPercentage == 100000
