"""`storekeeper shop` against `storekeeper up`: a device buying through the order journal."""
import json
import signal
import subprocess
import tempfile
import uuid

import pytest

from conftest import BIN, ROOT


@pytest.fixture(scope="module")
def up():
    with tempfile.TemporaryDirectory() as data:
        process = subprocess.Popen([BIN, "up", "--data", data, "--appstore-port", "0", "--server-port", "0", "--quiet"], cwd=ROOT,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        summary = json.loads(process.stdout.readline())
        try:
            yield data, summary
        finally:
            process.send_signal(signal.SIGTERM)
            process.wait(timeout=20)


def shop(up, *args, check=True):
    data, summary = up
    result = subprocess.run([BIN, "shop", *args, "--data", data, "--appstore", summary["appstore"], "--server", summary["server"]],
                            cwd=ROOT, capture_output=True, text=True, timeout=60)
    if check:
        assert result.returncode == 0, result.stderr
    return result


def listing(up, *args):
    return {row["productId"]: row for row in json.loads(shop(up, "list", "--json", *args).stdout)}


def test_football_store_owned_and_counted(up):
    user = "fan-" + uuid.uuid4().hex[:6]
    before = listing(up, "--catalog", "football", "--user", user)
    assert set(before) == {"ProtectiveGloves", "GoldenGlobe", "EnergyBottle"}
    assert all(row["price"].startswith("$") for row in before.values())
    assert not before["GoldenGlobe"]["owned"]
    bought = json.loads(shop(up, "buy", "GoldenGlobe", "--catalog", "football", "--user", user).stdout)
    assert bought["state"] == "finished"
    for _ in range(2):
        shop(up, "buy", "EnergyBottle", "--catalog", "football", "--user", user)
    after = listing(up, "--catalog", "football", "--user", user)
    assert after["GoldenGlobe"]["owned"] is True and after["ProtectiveGloves"]["owned"] is False
    assert after["EnergyBottle"]["count"] == 2


def test_restore_on_a_new_device(up):
    user = "restorer-" + uuid.uuid4().hex[:6]
    shop(up, "buy", "ProtectiveGloves", "--catalog", "football", "--user", user)
    new_device = str(uuid.uuid4()).upper()
    restored = json.loads(shop(up, "restore", "--catalog", "football", "--user", user, "--device", new_device).stdout)
    assert restored["restored"] is True and restored["state"] == "verified"
    assert listing(up, "--catalog", "football", "--user", user, "--device", new_device)["ProtectiveGloves"]["owned"] is True


def test_unknown_product_and_bad_catalog_fail_clearly(up):
    bad = shop(up, "buy", "no.such.product", check=False)
    assert bad.returncode != 0 and "not available" in bad.stderr
    wrong = shop(up, "list", "--catalog", "nope", check=False)
    assert wrong.returncode != 0 and "--catalog" in wrong.stderr
