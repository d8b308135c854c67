"""The emulator's App Store Server API, driven by Apple's own app-store-server-library client."""
import json
import ssl
import time
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
