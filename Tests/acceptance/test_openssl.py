"""openssl accepts our receipts with our root and rejects tampered ones."""
import base64
import subprocess

from conftest import SHARED


def cms_verify(der_path, root_pem):
    return subprocess.run(
        ["openssl", "cms", "-verify", "-inform", "DER", "-in", str(der_path), "-CAfile", str(root_pem),
         "-purpose", "any", "-out", "/dev/null"],
        capture_output=True, text=True)


def test_openssl_verifies_receipt_with_emulator_root(emulator, root_pem, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    der = tmp_path / "receipt.der"
    der.write_bytes(base64.b64decode(bought["receipt"]))
    result = cms_verify(der, root_pem)
    assert result.returncode == 0, result.stderr
    assert "Verification successful" in result.stderr


def test_openssl_rejects_tampered_receipt(emulator, root_pem, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF02")
    raw = bytearray(base64.b64decode(bought["receipt"]))
    index = raw.index(b"Nada.JPYF02")
    raw[index + 10] = ord("5")
    der = tmp_path / "tampered.der"
    der.write_bytes(bytes(raw))
    result = cms_verify(der, root_pem)
    assert result.returncode != 0
    assert "Verification successful" not in result.stderr


def test_openssl_rejects_receipt_under_another_root(emulator, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    der = tmp_path / "receipt.der"
    der.write_bytes(base64.b64decode(bought["receipt"]))
    result = cms_verify(der, SHARED / "certs" / "apple-inc-root-ca.pem")
    assert result.returncode != 0


def test_chain_has_apple_marker_extensions(emulator, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    der = tmp_path / "receipt.der"
    der.write_bytes(base64.b64decode(bought["receipt"]))
    certs = subprocess.run(["openssl", "pkcs7", "-inform", "DER", "-in", str(der), "-print_certs", "-text", "-noout"],
                           capture_output=True, text=True, check=True).stdout
    assert "1.2.840.113635.100.6.11.1" in certs
    assert "1.2.840.113635.100.6.2.1" in certs
    assert certs.count("Certificate:") == 3
