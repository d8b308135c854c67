"""The emulator's whole state survives a restart."""
import tempfile

from conftest import Emulator, TESTER


def test_state_and_keys_survive_restart():
    with tempfile.TemporaryDirectory() as data_dir:
        first = Emulator(data_dir)
        try:
            bought = first.buy("com.example.football", "GoldenGlobe")
            first.cli("appstore", "time", "advance", "2h")
            first.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--environment", "production", "--status", "21005")
        finally:
            first.stop()
        second = Emulator(data_dir)
        try:
            answer = second.verify(bought["receipt"])
            assert answer["status"] == 0
            assert [entry["transaction_id"] for entry in answer["receipt"]["in_app"]] == [bought["transaction_id"]]
            assert second.verify(bought["receipt"], environment="production")["status"] == 21005
            again = second.buy("com.example.football", "GoldenGlobe")
            assert again["original_transaction_id"] == bought["transaction_id"]
            assert int(again["transaction_id"]) > int(bought["transaction_id"])
        finally:
            second.stop()
