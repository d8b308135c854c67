"""Apple's app-store-server-library reads our receipts."""
import base64

from appstoreserverlibrary.receipt_utility import ReceiptUtility


def test_receipt_utility_extracts_transaction_id_from_app_receipt(emulator):
    emulator.cli("appstore", "tester", "add", "library@example.com")
    first = emulator.buy("com.example.football", "ProtectiveGloves", account="library@example.com")
    second = emulator.buy("com.example.football", "GoldenGlobe", account="library@example.com")
    extracted = ReceiptUtility().extract_transaction_id_from_app_receipt(second["receipt"])
    assert extracted in {first["transaction_id"], second["transaction_id"]}


def test_receipt_utility_extracts_transaction_id_from_transaction_receipt(emulator):
    bought = emulator.buy("com.example.coins", "Nada.JPYF03")
    extracted = ReceiptUtility().extract_transaction_id_from_transaction_receipt(bought["transaction_receipt"])
    assert extracted == bought["transaction_id"]


def test_receipt_utility_finds_nothing_in_receipt_without_purchases(emulator):
    emulator.cli("appstore", "tester", "add", "empty@example.com")
    cancelled = emulator.buy("com.example.comics", "com.raywenderlich.inapprage.drummerrage", account="empty@example.com", simulate="cancel")
    assert cancelled["state"] == "failed"
    assert cancelled["error"]["name"] == "paymentCancelled"
    receipt = cancelled["receipt"]
    assert receipt is not None
    assert ReceiptUtility().extract_transaction_id_from_app_receipt(receipt) is None
    assert base64.b64decode(receipt)[:1] == b"\x30"
