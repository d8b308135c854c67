"""StoreKit 2 signed data: Apple's own SignedDataVerifier and openssl accept what the emulator signs."""
import base64
import json
import ssl
import subprocess

import pytest
from appstoreserverlibrary.models.Environment import Environment
from appstoreserverlibrary.models.Type import Type
from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier, VerificationException

from conftest import BIN, ROOT


def verifier(root_pem, bundle_id, environment=Environment.SANDBOX, app_apple_id=None):
    der = ssl.PEM_cert_to_DER_cert(root_pem.read_text())
    return SignedDataVerifier([der], False, environment, bundle_id, app_apple_id)


def test_apple_library_verifies_and_decodes_a_signed_transaction(emulator, jws_root_pem):
    bought = emulator.buy("com.example.coins", "Nada.JPYF02", username="5b4e7a1c-0d8e-4c43-9a4e-2f2b6f3f6c11")
    decoded = verifier(jws_root_pem, "com.example.coins").verify_and_decode_signed_transaction(bought["signedTransaction"])
    assert decoded.transactionId == bought["transaction_id"]
    assert decoded.originalTransactionId == bought["original_transaction_id"]
    assert decoded.productId == "Nada.JPYF02"
    assert decoded.type == Type.CONSUMABLE
    assert decoded.environment == Environment.SANDBOX
    assert decoded.appAccountToken == "5b4e7a1c-0d8e-4c43-9a4e-2f2b6f3f6c11"
    assert decoded.quantity == 1 and decoded.price > 0 and len(decoded.currency) == 3
    assert decoded.storefront and decoded.storefrontId
    assert decoded.signedDate >= decoded.purchaseDate


def test_header_is_apples_shape_and_signature_is_raw_es256(emulator):
    bought = emulator.buy("com.example.football", "EnergyBottle")
    header_b64, payload_b64, signature_b64 = bought["signedTransaction"].split(".")
    header = json.loads(base64.urlsafe_b64decode(header_b64 + "=" * (-len(header_b64) % 4)))
    assert set(header) == {"alg", "x5c"} and header["alg"] == "ES256" and len(header["x5c"]) == 3
    assert len(base64.urlsafe_b64decode(signature_b64 + "=" * (-len(signature_b64) % 4))) == 64
    payload = json.loads(base64.urlsafe_b64decode(payload_b64 + "=" * (-len(payload_b64) % 4)))
    assert isinstance(payload["purchaseDate"], int) and isinstance(payload["transactionId"], str)
    assert None not in payload.values()


def test_apple_library_refuses_other_bundle_other_environment_and_other_roots(emulator, jws_root_pem, root_pem):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    with pytest.raises(VerificationException):
        verifier(jws_root_pem, "com.example.football").verify_and_decode_signed_transaction(bought["signedTransaction"])
    with pytest.raises(VerificationException):
        verifier(jws_root_pem, "com.example.coins", Environment.PRODUCTION, 1).verify_and_decode_signed_transaction(bought["signedTransaction"])
    with pytest.raises(VerificationException):
        verifier(root_pem, "com.example.coins").verify_and_decode_signed_transaction(bought["signedTransaction"])
    header, payload, signature = bought["signedTransaction"].split(".")
    forged = json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))
    forged["quantity"] = 10
    forged_payload = base64.urlsafe_b64encode(json.dumps(forged).encode()).rstrip(b"=").decode()
    with pytest.raises(VerificationException):
        verifier(jws_root_pem, "com.example.coins").verify_and_decode_signed_transaction(f"{header}.{forged_payload}.{signature}")


def test_openssl_verifies_the_x5c_chain_to_the_exported_root(emulator, jws_root_pem, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    header = bought["signedTransaction"].split(".")[0]
    chain = json.loads(base64.urlsafe_b64decode(header + "=" * (-len(header) % 4)))["x5c"]
    pems = [ssl.DER_cert_to_PEM_cert(base64.b64decode(entry)) for entry in chain]
    (tmp_path / "leaf.pem").write_text(pems[0])
    (tmp_path / "intermediate.pem").write_text(pems[1])
    result = subprocess.run(["openssl", "verify", "-CAfile", str(jws_root_pem), "-untrusted", str(tmp_path / "intermediate.pem"),
                             str(tmp_path / "leaf.pem")], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    text = subprocess.run(["openssl", "x509", "-in", str(tmp_path / "leaf.pem"), "-noout", "-text"], capture_output=True, text=True).stdout
    assert "1.2.840.113635.100.6.11.1" in text and "prime256v1" in text


def test_jws_decode_cli_verifies_ours_and_refuses_a_wrong_root(emulator, jws_root_pem, root_pem, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    path = tmp_path / "transaction.jws"
    path.write_text(bought["signedTransaction"])
    good = subprocess.run([BIN, "jws", "decode", str(path), "--verify-with", str(jws_root_pem)], cwd=ROOT, capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    output = json.loads(good.stdout)
    assert output["payload"]["transactionId"] == bought["transaction_id"] and output["verification"]["valid"] is True
    bad = subprocess.run([BIN, "jws", "decode", str(path), "--verify-with", str(root_pem)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode == 2 and json.loads(bad.stdout)["verification"]["valid"] is False
    garbage = subprocess.run([BIN, "jws", "decode", "-"], input="not.a-jws", cwd=ROOT, capture_output=True, text=True)
    assert garbage.returncode != 0 and "JWS" in garbage.stderr


REAL = ROOT.parent / "shared" / "fixtures" / "real"
G3 = ROOT.parent / "shared" / "certs" / "apple-root-ca-g3.pem"


@pytest.mark.parametrize("name", sorted(path.name for path in REAL.glob("j*.jws")))
def test_real_apple_jws_verify_at_their_signed_date_and_fail_with_one_byte_changed(name, tmp_path):
    text = (REAL / name).read_text().strip()
    good = subprocess.run([BIN, "jws", "decode", str(REAL / name), "--verify-with", str(G3)], cwd=ROOT, capture_output=True, text=True)
    assert good.returncode == 0, good.stdout + good.stderr
    output = json.loads(good.stdout)
    assert output["verification"]["valid"] is True
    nested = [value for value in (output["payload"].get("data") or {}).values() if isinstance(value, dict)]
    assert all(item["verification"]["valid"] for item in nested)
    header, payload, signature = text.split(".")
    middle = len(payload) // 2
    changed = payload[:middle] + ("A" if payload[middle] != "A" else "B") + payload[middle + 1:]
    (tmp_path / "changed.jws").write_text(f"{header}.{changed}.{signature}")
    bad = subprocess.run([BIN, "jws", "decode", str(tmp_path / "changed.jws"), "--verify-with", str(G3)], cwd=ROOT, capture_output=True, text=True)
    assert bad.returncode != 0


def test_production_data_verifies_with_the_app_apple_id_and_pyjwt_agrees(emulator, jws_root_pem):
    import time
    import uuid as uuidlib

    import jwt as pyjwt
    from cryptography import x509
    from test_notifications import Receiver
    app_apple_id = json.loads(emulator.request("GET", "/admin/v1/apps/com.example.coins")[1])["appAppleId"]
    receiver = Receiver()
    try:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins", "--production-url", receiver.url)
        email = f"prodjws{uuidlib.uuid4().hex[:8]}@example.com"
        emulator.cli("appstore", "tester", "add", email, "--production")
        bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=email)
        production = verifier(jws_root_pem, "com.example.coins", Environment.PRODUCTION, app_apple_id)
        decoded = production.verify_and_decode_signed_transaction(bought["signedTransaction"])
        assert decoded.environment == Environment.PRODUCTION
        notification = production.verify_and_decode_notification(receiver.wait_for(1)[0]["signedPayload"])
        assert notification.data.appAppleId == app_apple_id and notification.data.environment == Environment.PRODUCTION
        wrong = verifier(jws_root_pem, "com.example.coins", Environment.PRODUCTION, app_apple_id + 1)
        with pytest.raises(VerificationException):
            wrong.verify_and_decode_notification(receiver.bodies[0]["signedPayload"])
        header = json.loads(base64.urlsafe_b64decode(bought["signedTransaction"].split(".")[0] + "=="))
        leaf = x509.load_der_x509_certificate(base64.b64decode(header["x5c"][0]))
        claims = pyjwt.decode(bought["signedTransaction"], key=leaf.public_key(), algorithms=["ES256"], options={"verify_aud": False})
        assert claims["transactionId"] == bought["transaction_id"]
    finally:
        emulator.cli("appstore", "notifications", "set", "--app", "com.example.coins")
        receiver.close()
