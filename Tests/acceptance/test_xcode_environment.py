"""Xcode testers: signed data shaped as Xcode's StoreKit Testing signs it, which backends must refuse unless
they mean to accept it (Apple's library skips the checks only for Environment.XCODE)."""
import base64
import json
import ssl
import uuid

import subprocess

import pytest
from appstoreserverlibrary.api_client import APIException, AppStoreServerAPIClient
from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier, VerificationException

from server_support import Server


def header(jws):
    return json.loads(base64.urlsafe_b64decode(jws.split(".")[0] + "=="))


def test_xcode_testers_get_xcode_signed_data_that_backends_refuse(emulator, jws_root_pem, tmp_path):
    email = f"xcode{uuid.uuid4().hex[:8]}@example.com"
    emulator.cli("appstore", "tester", "add", email, "--xcode")
    bought = emulator.buy("com.example.coins", "Nada.JPYF02", account=email)
    signed = bought["signedTransaction"]
    assert header(signed)["kid"] == "Apple_Xcode_Key" and header(signed)["typ"] == "JWT" and len(header(signed)["x5c"]) == 1
    xcode_pem = emulator.cli("appstore", "ca", "export", "--xcode").stdout
    certificate = ssl.PEM_cert_to_DER_cert(xcode_pem)
    assert base64.b64decode(header(signed)["x5c"][0]) == certificate
    # Apple's verifier: refused as sandbox data (one certificate is not Apple's chain); decoded in Environment.XCODE.
    with pytest.raises(VerificationException):
        SignedDataVerifier([ssl.PEM_cert_to_DER_cert(jws_root_pem.read_text())], False, Environment.SANDBOX, "com.example.coins", None) \
            .verify_and_decode_signed_transaction(signed)
    decoded = SignedDataVerifier([certificate], False, Environment.XCODE, "com.example.coins", None).verify_and_decode_signed_transaction(signed)
    assert decoded.environment == Environment.XCODE and decoded.transactionId == bought["transaction_id"]
    # Its app receipt is Xcode's: BER with indefinite lengths, signed by one self-signed StoreKit certificate
    # (the one `ca export --xcode-receipts` writes), which OpenSSL checks without any chain.
    receipt = base64.b64decode(bought["receipt"])
    assert receipt[:2] == b"\x30\x80"
    receipt_file, signer_file = tmp_path / "xcode.receipt", tmp_path / "storekit.pem"
    receipt_file.write_bytes(receipt)
    signer_file.write_text(emulator.cli("appstore", "ca", "export", "--xcode-receipts").stdout)
    checked = subprocess.run(["openssl", "cms", "-verify", "-inform", "DER", "-in", str(receipt_file), "-binary", "-noverify",
                              "-certfile", str(signer_file), "-out", str(tmp_path / "payload")], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stderr
    signer = subprocess.run(["openssl", "pkcs7", "-inform", "DER", "-in", str(receipt_file), "-print_certs", "-noout"], capture_output=True, text=True)
    assert "subject=CN = StoreKit, O = StoreKit, OU = StoreKit, C = US" in signer.stdout, signer.stdout
    assert b"Xcode" in (tmp_path / "payload").read_bytes()
    # The purchase server refuses it; the Server API does not know it.
    server = Server(emulator, str(tmp_path))
    try:
        key = server.setup_app("com.example.coins")
        status, body = server.request("POST", "/v1/transactions", {"appUserId": "xavier", "signedTransaction": signed}, key=key)
        assert status == 200 and body["state"] == "rejected" and "Xcode" in body["reason"], body
        assert server.user(key, "xavier").get("balances", {}) in ({}, {"coins": 0})
    finally:
        server.stop()
    api = json.loads(emulator.cli("appstore", "key", "create", "--app", "com.example.coins").stdout)
    client = AppStoreServerAPIClient(api["privateKey"].encode(), api["keyId"], api["issuerId"], "com.example.coins", Environment.SANDBOX)
    client._base_url = f"{emulator.url}/sandbox"
    with pytest.raises(APIException) as unknown:
        client.get_transaction_info(bought["transaction_id"])
    assert unknown.value.http_status_code == 404
