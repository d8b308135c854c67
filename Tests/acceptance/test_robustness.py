"""Bad input never crashes the emulator or corrupts its state."""
import base64
import json
import os
import socket

from conftest import TESTER


def test_ten_megabyte_body_is_refused_with_413(emulator):
    status, body = emulator.request("POST", "/sandbox/verifyReceipt", raw=b"{" + b" " * (10 * 1024 * 1024) + b"}",
                                    headers={"Content-Type": "application/json"})
    assert status == 413
    assert json.loads(body)["error"]["code"] == "payload_too_large"


def test_malformed_receipts_get_apple_statuses(emulator):
    cases = {
        "not base64 at all %%%": 21002,
        base64.b64encode(os.urandom(512)).decode(): 21002,
        base64.b64encode(b"\x30\x82\x01\x00" + os.urandom(40)).decode(): 21002,
        "": 21002,
    }
    for receipt, expected in cases.items():
        assert emulator.verify(receipt)["status"] == expected
    status, body = emulator.request("POST", "/sandbox/verifyReceipt", raw=b"{not json")
    assert status == 200 and json.loads(body)["status"] == 21000
    status, body = emulator.request("GET", "/production/verifyReceipt")
    assert status == 200 and json.loads(body)["status"] == 21000


def test_truncated_receipt_then_state_still_serves(emulator):
    bought = emulator.buy("com.example.coins", "Nada.JPYF03")
    raw = base64.b64decode(bought["receipt"])
    assert emulator.verify(base64.b64encode(raw[: len(raw) // 3]).decode())["status"] == 21002
    assert emulator.verify(bought["receipt"])["status"] == 0


def test_device_api_errors_are_json_with_sk_codes(emulator):
    status, body = emulator.request("POST", "/device/v1/devices", {"account": TESTER})
    device = json.loads(body)["id"]
    for quantity in (0, 11):
        status, body = emulator.request("POST", "/device/v1/payments",
                                        {"app": "com.example.coins", "device": device, "productId": "Nada.JPYF01", "quantity": quantity})
        assert status == 400
        assert json.loads(body)["error"]["skError"] == "paymentInvalid"
    status, body = emulator.request("POST", "/device/v1/payments", {"app": "com.example.coins", "device": device, "productId": "Unknown.Product"})
    assert status == 404
    assert json.loads(body)["error"]["skError"] == "storeProductNotAvailable"
    status, body = emulator.request("POST", "/device/v1/payments", raw=b"[1,2,3]")
    assert status == 400
    assert json.loads(body)["error"]["code"] == "invalid_json"
    status, body = emulator.request("DELETE", "/device/v1/payments")
    assert status == 405


def test_dropped_connection_fault(emulator):
    emulator.cli("appstore", "fault", "add", "--endpoint", "products", "--drop")
    try:
        host, port = emulator.url.split("//")[1].split(":")
        with socket.create_connection((host, int(port)), timeout=5) as connection:
            connection.sendall(b"GET /device/v1/products?app=a&device=b&ids=c HTTP/1.1\r\nHost: x\r\n\r\n")
            assert connection.recv(100) == b""
    finally:
        emulator.cli("appstore", "fault", "clear")
    status, _ = emulator.request("GET", "/health")
    assert status == 200
