"""Third-party verifyReceipt clients validate our receipts end to end, URLs pointed at the emulator."""
import pytest
import itunesiap
from inapppy import AppStoreValidator, InAppPyValidationError


def make_inapppy(base, sandbox=False):
    class EmulatorValidator(AppStoreValidator):
        def _change_url_by_sandbox(self):
            self.url = f"{base}/sandbox/verifyReceipt" if self.sandbox else f"{base}/production/verifyReceipt"

    return EmulatorValidator(sandbox=sandbox, auto_retry_wrong_env_request=True)


@pytest.fixture()
def itunes(emulator, monkeypatch):
    monkeypatch.setattr(itunesiap.request.Request, "PRODUCTION_VALIDATION_URL", emulator.url + "/production/verifyReceipt")
    monkeypatch.setattr(itunesiap.request.Request, "SANDBOX_VALIDATION_URL", emulator.url + "/sandbox/verifyReceipt")
    return itunesiap


def test_inapppy_falls_back_to_sandbox_on_21007(emulator):
    bought = emulator.buy("com.example.coins", "Nada.JPYF04")
    validator = make_inapppy(emulator.url)
    response = validator.validate(bought["receipt"])
    assert validator.sandbox is True
    assert response["status"] == 0
    assert response["environment"] == "Sandbox"
    assert bought["transaction_id"] in [entry["transaction_id"] for entry in response["receipt"]["in_app"]]


def test_inapppy_validates_subscription_with_shared_secret(emulator):
    emulator.cli("appstore", "tester", "add", "reader@example.com")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.monthly", account="reader@example.com")
    secret = emulator.shared_secret("com.example.magazine")
    response = make_inapppy(emulator.url).validate(bought["receipt"], shared_secret=secret, exclude_old_transactions=True)
    assert response["status"] == 0
    assert response["latest_receipt_info"][0]["original_transaction_id"] == bought["original_transaction_id"]
    assert response["pending_renewal_info"][0]["auto_renew_status"] == "1"
    with pytest.raises(InAppPyValidationError) as error:
        make_inapppy(emulator.url).validate(bought["receipt"], shared_secret="0" * 32)
    assert error.value.raw_response["status"] == 21004


def test_inapppy_production_receipt_validates_directly(emulator):
    emulator.cli("appstore", "tester", "add", "customer@example.com", "--production")
    bought = emulator.buy("com.example.comics", "com.raywenderlich.inapprage.updogsadness", account="customer@example.com")
    assert bought["environment"] == "Production"
    validator = make_inapppy(emulator.url)
    response = validator.validate(bought["receipt"])
    assert validator.sandbox is False
    assert response["environment"] == "Production"
    assert response["receipt"]["receipt_type"] == "Production"


def test_itunes_iap_verifies_with_sandbox_fallback(emulator, itunes):
    bought = emulator.buy("com.example.football", "EnergyBottle", quantity=2)
    response = itunes.verify(bought["receipt"], env=itunes.env.review)
    assert response.status == 0
    in_app = [entry for entry in response.receipt.in_app if entry.transaction_id == bought["transaction_id"]]
    assert len(in_app) == 1
    assert in_app[0].quantity == 2
    assert in_app[0].product_id == "EnergyBottle"


def test_itunes_iap_reports_21007_in_production_only_mode(emulator, itunes):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    with pytest.raises(itunes.exc.InvalidReceipt) as error:
        itunes.verify(bought["receipt"], env=itunes.env.production)
    assert error.value.status == 21007
