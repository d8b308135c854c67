"""`storekeeper shop` against `storekeeper up`: a device buying through the order journal."""
import json
import os
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


def new_account(up):
    """A fresh Apple ID: a non-consumable one user bought cannot be granted to another user of the same Apple ID."""
    email = f"shopper-{uuid.uuid4().hex[:8]}@example.com"
    subprocess.run([BIN, "appstore", "tester", "add", email, "--url", up[1]["appstore"]], check=True, capture_output=True)
    return email


def listing(up, *args):
    return {row["productId"]: row for row in json.loads(shop(up, "list", "--json", *args).stdout)}


def test_football_store_owned_and_counted(up):
    user = "fan-" + uuid.uuid4().hex[:6]
    account = new_account(up)
    before = listing(up, "--catalog", "football", "--user", user, "--account", account)
    assert set(before) == {"ProtectiveGloves", "GoldenGlobe", "EnergyBottle"}
    assert all(row["price"].startswith("$") for row in before.values())
    assert not before["GoldenGlobe"]["owned"]
    bought = json.loads(shop(up, "buy", "GoldenGlobe", "--catalog", "football", "--user", user, "--account", account).stdout)
    assert bought["state"] == "finished"
    for _ in range(2):
        shop(up, "buy", "EnergyBottle", "--catalog", "football", "--user", user, "--account", account)
    after = listing(up, "--catalog", "football", "--user", user, "--account", account)
    assert after["GoldenGlobe"]["owned"] is True and after["ProtectiveGloves"]["owned"] is False
    assert after["EnergyBottle"]["count"] == 2


def test_restore_on_a_new_device(up):
    user = "restorer-" + uuid.uuid4().hex[:6]
    account = new_account(up)
    shop(up, "buy", "ProtectiveGloves", "--catalog", "football", "--user", user, "--account", account)
    new_device = str(uuid.uuid4()).upper()
    restored = json.loads(shop(up, "restore", "--catalog", "football", "--user", user, "--account", account, "--device", new_device).stdout)
    assert restored["restored"] is True and restored["state"] == "verified"
    assert listing(up, "--catalog", "football", "--user", user, "--account", account, "--device", new_device)["ProtectiveGloves"]["owned"] is True


def test_unknown_product_and_bad_catalog_fail_clearly(up):
    bad = shop(up, "buy", "no.such.product", check=False)
    assert bad.returncode != 0 and "not available" in bad.stderr
    wrong = shop(up, "list", "--catalog", "nope", check=False)
    assert wrong.returncode != 0 and "--catalog" in wrong.stderr


class Tmux:
    """The interactive shop in a tmux session: keys in, screen out, as a person would use it."""

    def __init__(self, up, *args):
        import shutil
        if not shutil.which("tmux"):
            pytest.skip("tmux is not installed")
        data, summary = up
        self.name = "shop-" + uuid.uuid4().hex[:8]
        # A tmux server of its own: on the shared default socket, a session started just after another
        # one ended can reach the server while it is exiting ("server exited unexpectedly").
        self.tmux = ["tmux", "-f", "/dev/null", "-S", os.path.join(data, self.name + ".tmux")]
        command = " ".join([BIN, "shop", *args, "--data", data, "--appstore", summary["appstore"], "--server", summary["server"]])
        subprocess.run([*self.tmux, "new-session", "-d", "-s", self.name, "-x", "110", "-y", "30", "-c", str(ROOT), command], check=True)

    def screen(self):
        return subprocess.run([*self.tmux, "capture-pane", "-p", "-t", self.name], capture_output=True, text=True).stdout

    def wait_for(self, text, timeout=20):
        import time
        deadline = time.time() + timeout
        while time.time() < deadline:
            screen = self.screen()
            if text in screen:
                return screen
            time.sleep(0.1)
        raise AssertionError(f"{text!r} never appeared:\n{self.screen()}")

    def press(self, key):
        subprocess.run([*self.tmux, "send-keys", "-t", self.name, key], check=True)

    def close(self):
        subprocess.run([*self.tmux, "kill-server"], capture_output=True)


def row(screen, title):
    return next(line for line in screen.splitlines() if title in line)


def test_interactive_shop_buys_counts_and_restores(up):
    user = "tmux-" + uuid.uuid4().hex[:6]
    account = new_account(up)
    shop_screen = Tmux(up, "--catalog", "football", "--user", user, "--account", account)
    try:
        screen = shop_screen.wait_for("status: ready")
        assert "$2.99" in screen and "Golden" in screen
        titles = [line.split("]", 1)[1].split("$")[0].strip() for line in screen.splitlines() if line.strip().startswith("[")]
        globe = next(index for index, title in enumerate(titles, 1) if "Globe" in title)
        bottle = next(index for index, title in enumerate(titles, 1) if "Energy" in title)
        shop_screen.press(str(globe))
        screen = shop_screen.wait_for("delivered")
        assert "owned" in row(screen, titles[globe - 1])
        for _ in range(2):
            shop_screen.press(str(bottle))
            shop_screen.wait_for("delivered")
        shop_screen.wait_for("bought 2")
        shop_screen.press("q")
    finally:
        shop_screen.close()

    new_device = Tmux(up, "--catalog", "football", "--user", user, "--account", account, "--device", str(uuid.uuid4()).upper())
    try:
        new_device.wait_for("status: ready")
        new_device.press("r")
        screen = new_device.wait_for("restored (verified)")
        assert "owned" in row(screen, titles[globe - 1])
    finally:
        new_device.close()


def test_up_runs_from_anywhere_and_shop_finds_it_by_its_data_directory(tmp_path):
    """No checkout around it: `up` started in an empty directory loads the example stores built into the binary,
    writes where it listens into its data directory, and `shop` given only that directory finds it."""
    work = tmp_path / "elsewhere"
    work.mkdir()
    data = str(tmp_path / "data")
    process = subprocess.Popen([BIN, "up", "--data", data, "--appstore-port", "0", "--server-port", "0", "--quiet"], cwd=work,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        summary = json.loads(process.stdout.readline())
        assert {app["bundleId"] for app in summary["apps"]} == {"com.example.coins", "com.example.football", "com.example.comics", "com.example.magazine"}
        listed = subprocess.run([BIN, "shop", "list", "--json", "--catalog", "magazine", "--data", data], cwd=work, capture_output=True, text=True,
                                timeout=60)
        assert listed.returncode == 0, listed.stderr
        assert "com.example.magazine.monthly" in listed.stdout
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=20)
    # Once it has stopped, the address file is gone (a later `shop` does not talk to a dead port by mistake).
    assert not os.path.exists(os.path.join(data, "up.json"))
