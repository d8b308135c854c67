"""The command line as a script author uses it."""
import base64
import json
import os
import signal
import subprocess
import threading
import time
import urllib.request

import pytest

from conftest import BIN, ROOT, SHARED

COMMANDS = [
    [], ["appstore"], ["appstore", "serve"], ["appstore", "tester", "add"], ["appstore", "buy"], ["appstore", "finish"],
    ["appstore", "restore"], ["appstore", "time", "advance"], ["appstore", "time", "set"], ["appstore", "fault", "add"],
    ["appstore", "fault", "clear"], ["appstore", "ca", "export"], ["receipt", "decode"],
    ["server"], ["server", "serve"], ["server", "app", "add"], ["server", "key", "create"], ["server", "product", "set"],
    ["server", "user", "show"], ["server", "jobs", "list"], ["server", "jobs", "replay"], ["server", "report"], ["up"],
    ["appstore", "tester", "family"], ["appstore", "refund"], ["appstore", "subscription"], ["appstore", "grace-period"],
    ["appstore", "redeem-code"], ["appstore", "key", "create"], ["appstore", "notifications", "set"], ["jws", "decode"], ["jws", "bench"],
    ["server", "reconcile"], ["shop"], ["shop-bench"], ["server", "operator", "add"], ["server", "operator", "list"],
    ["server", "operator", "remove"], ["server", "metrics"], ["appstore", "catalog", "export"],
]


@pytest.mark.parametrize("args, message", [
    (["appstore", "subscription", "renew"], "original transaction id"),
    (["appstore", "subscription", "pause", "2000000000000001"], "original transaction id"),
    (["appstore", "subscription", "price-increase", "2000000000000001"], "--price"),
    (["appstore", "grace-period", "--app", "com.example.coins", "--days", "7"], "--days is 3, 16, 28 or none"),
    (["appstore", "refund", "2000000000000001", "--reverse", "--decline"], "at most one"),
    (["appstore", "tester", "family", "a@example.com"], "--family NAME or --leave"),
    (["appstore", "redeem-code", "--app", "com.example.coins"], "are required"),
    (["server", "app", "add", "com.example.coins", "--admin-key", "sk_x", "--server-api-key-id", "ABC"], "go together"),
    (["shop", "list", "--catalog", "nope"], "--catalog"),
    (["shop", "sell"], "list, buy PRODUCT or restore"),
    (["server", "serve", "--database-pool", "0"], "--database-pool is 1…256"),
    (["server", "serve", "--database-pool", "many"], "--database-pool is 1…256"),
])
def test_new_commands_refuse_bad_input_with_usage_errors(args, message):
    result = subprocess.run([BIN, *args], capture_output=True, text=True)
    assert result.returncode == 64, result.stderr
    assert message in result.stderr


@pytest.mark.parametrize("command", COMMANDS, ids=lambda c: " ".join(c) or "storekeeper")
def test_every_command_has_help(command):
    result = subprocess.run([BIN, *command, "--help"], capture_output=True, text=True)
    assert result.returncode == 0
    assert "USAGE" in result.stdout or "SUBCOMMANDS" in result.stdout


def test_unknown_options_are_usage_errors():
    result = subprocess.run([BIN, "receipt", "decode", "--frobnicate"], capture_output=True, text=True)
    assert result.returncode == 64
    assert "unknown option --frobnicate" in result.stderr


def decode(*args, stdin=None):
    return subprocess.run([BIN, "receipt", "decode", *args], capture_output=True, text=True, input=stdin, cwd=ROOT)


def test_decode_real_sandbox_receipt_matches_apple_response():
    result = decode(str(next((SHARED / "fixtures" / "real").glob("r01*.receipt.b64"))),
                    "--verify-with", str(SHARED / "certs" / "apple-inc-root-ca.pem"))
    assert result.returncode == 0, result.stderr
    ours = json.loads(result.stdout)
    apple = json.loads(next((SHARED / "fixtures" / "real").glob("r01*.response.json")).read_text())["receipt"]
    assert ours["verification"]["valid"] is True
    for key in ["receipt_type", "bundle_id", "application_version", "receipt_creation_date_ms", "original_purchase_date_pst"]:
        assert ours["receipt"][key] == apple[key]
    key = lambda entry: entry["transaction_id"]
    assert sorted(ours["receipt"]["in_app"], key=key) == sorted(apple["in_app"], key=key)


def test_decode_ios6_receipt_through_itunes_store_ca():
    receipt = next((SHARED / "fixtures" / "real").glob("r12*.receipt.b64"))
    result = decode(str(receipt), "--verify-with", str(SHARED / "fixtures" / "real" / "certs" / "AppleiTunesStoreCA.pem"))
    assert result.returncode == 0, result.stderr
    apple = json.loads(next((SHARED / "fixtures" / "real").glob("r12*mbaasy.response.json")).read_text())["receipt"]
    assert json.loads(result.stdout)["receipt"] == apple


def test_decode_xcode_receipt_from_stdin_and_refuse_its_signer():
    text = (SHARED / "fixtures" / "xcode" / "xcode-receipt-with-purchase.b64").read_text()
    plain = decode(stdin=text)
    assert plain.returncode == 0
    assert json.loads(plain.stdout)["receipt_type"] == "Xcode"
    checked = decode("-", "--verify-with", str(SHARED / "certs" / "apple-inc-root-ca.pem"), stdin=text)
    assert checked.returncode == 2
    assert json.loads(checked.stdout)["verification"]["valid"] is False


def test_decode_rejects_garbage():
    result = decode(stdin="this is not a receipt")
    assert result.returncode == 1
    assert "error" in result.stderr


def test_decode_our_receipt_with_exported_root(emulator, root_pem, tmp_path):
    bought = emulator.buy("com.example.coins", "Nada.JPYF05")
    path = tmp_path / "ours.der"
    path.write_bytes(base64.b64decode(bought["receipt"]))
    result = decode(str(path), "--verify-with", str(root_pem))
    assert result.returncode == 0, result.stderr
    decoded = json.loads(result.stdout)
    assert decoded["verification"]["valid"] is True
    assert bought["transaction_id"] in [entry["transaction_id"] for entry in decoded["receipt"]["in_app"]]


def test_decode_our_ios6_receipt_with_exported_chain(emulator, tmp_path):
    chain = tmp_path / "chain.pem"
    emulator.cli("appstore", "ca", "export", "--chain", "--output", str(chain))
    bought = emulator.buy("com.example.coins", "Nada.JPYF02")
    result = decode("-", "--verify-with", str(chain), stdin=bought["transaction_receipt"])
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["receipt"]["transaction_id"] == bought["transaction_id"]


def test_buy_prints_the_documented_fields(emulator):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", quantity=4)
    for key in ["transaction_id", "original_transaction_id", "environment", "receipt"]:
        assert bought[key]
    assert bought["environment"] == "Sandbox"


def test_finish_removes_consumable_from_receipt(emulator):
    emulator.cli("appstore", "tester", "add", "finisher@example.com")
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account="finisher@example.com")
    before = emulator.verify(bought["receipt"])
    assert [entry["transaction_id"] for entry in before["receipt"]["in_app"]] == [bought["transaction_id"]]
    emulator.cli("appstore", "finish", bought["transaction_id"])
    again = emulator.buy("com.example.coins", "Nada.JPYF02", account="finisher@example.com")
    after = emulator.verify(again["receipt"])
    assert [entry["transaction_id"] for entry in after["receipt"]["in_app"]] == [again["transaction_id"]]


def test_restore_on_second_device(emulator):
    emulator.cli("appstore", "tester", "add", "restorer@example.com")
    first = emulator.buy("com.example.comics", "com.raywenderlich.inapprage.nightlyrage", account="restorer@example.com")
    result = json.loads(emulator.cli("appstore", "restore", "--app", "com.example.comics", "--account", "restorer@example.com",
                                     "--device", "0E5F3C2A-1111-4222-8333-944455556666").stdout)
    assert [t["originalTransactionIdentifier"] for t in result["transactions"]] == [first["transaction_id"]]
    assert all(t["transactionState"] == "restored" for t in result["transactions"])


def test_time_advance_renews_subscription(emulator):
    emulator.cli("appstore", "tester", "add", "renewer@example.com")
    bought = emulator.buy("com.example.magazine", "com.example.magazine.yearly", account="renewer@example.com")
    secret = emulator.shared_secret("com.example.magazine")
    emulator.cli("appstore", "time", "advance", "61m")
    answer = emulator.verify(bought["receipt"], password=secret)
    assert answer["status"] == 0
    assert len(answer["receipt"]["in_app"]) == 1
    assert len(answer["latest_receipt_info"]) >= 2
    assert {entry["original_transaction_id"] for entry in answer["latest_receipt_info"]} == {bought["transaction_id"]}


def test_fault_add_and_clear(emulator):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01")
    fault = json.loads(emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--environment", "sandbox", "--status", "21150").stdout)
    assert fault["endpoint"] == "verifyReceipt"
    answer = emulator.verify(bought["receipt"])
    assert answer["status"] == 21150 and answer["is_retryable"] is True
    emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--environment", "production", "--http", "503")
    status, _ = emulator.request("POST", "/production/verifyReceipt", {"receipt-data": bought["receipt"]})
    assert status == 503
    emulator.cli("appstore", "fault", "clear")
    assert emulator.verify(bought["receipt"])["status"] == 0


def test_fault_usage_errors(emulator):
    result = emulator.cli("appstore", "fault", "add", "--endpoint", "nowhere", "--drop", check=False)
    assert result.returncode == 1
    assert "invalid_endpoint" in result.stderr


def test_commands_report_unreachable_emulator():
    result = subprocess.run([BIN, "appstore", "time", "advance", "1m", "--url", "http://127.0.0.1:9"], capture_output=True, text=True)
    assert result.returncode == 1
    assert "cannot reach" in result.stderr


def replay_of_nothing(data):
    """`appstore replay` of an empty recording, kept in `data`."""
    os.makedirs(data, exist_ok=True)
    recording = os.path.join(data, "recording.jsonl")
    open(recording, "w").close()
    return ["appstore", "replay", recording, "--data", data, "--port", "0", "--quiet", "--no-proxy"]


SERVE_COMMANDS = {
    "server serve": lambda data: ["server", "serve", "--data", data, "--port", "0", "--quiet", "--admin-key", "sk_admin_signal_tests"],
    "appstore serve": lambda data: ["appstore", "serve", "--data", data, "--port", "0", "--quiet", "--no-proxy"],
    "webhook listen": lambda data: ["webhook", "listen", "--port", "0", "--quiet"],
    "up": lambda data: ["up", "--data", data, "--appstore-port", "0", "--server-port", "0"],
    "appstore replay": replay_of_nothing,
}


def start_serving(args):
    """Starts a serve command and returns it with the first address it prints (what a script waits for)."""
    process = subprocess.Popen([BIN, *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    line = ""
    for _ in range(20):
        line = process.stdout.readline()
        if "http://" in line or not line:
            break
    if "http://" not in line:
        process.kill()
        pytest.fail("did not start: " + line + process.stderr.read())
    return process, "http://" + line.split("http://")[1].split()[0].rstrip("/")


def stopped(process, timeout):
    """The exit status and standard error of a process given `timeout` seconds to end; killed, its standard error
    shown, when it does not."""
    try:
        _, stderr = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        _, stderr = process.communicate()
        pytest.fail(f"still running {timeout} s after the signal; its standard error ends: {stderr[-2000:]}")
    return process.returncode, stderr


@pytest.mark.parametrize("name", SERVE_COMMANDS)
def test_serve_commands_stop_cleanly_on_a_signal_sent_as_soon_as_they_announce_their_address(name, tmp_path):
    # A supervisor (or a test) may signal the moment it has read the address: the signal is neither lost (a hang)
    # nor fatal (status -15, no graceful stop).
    for start, number in enumerate([signal.SIGTERM, signal.SIGINT, signal.SIGTERM]):
        process, _ = start_serving(SERVE_COMMANDS[name](str(tmp_path / f"data-{start}")))
        process.send_signal(number)
        status, stderr = stopped(process, 30)
        assert status == 0, stderr


def post_ignoring_errors(url):
    try:
        urllib.request.urlopen(urllib.request.Request(url, data=b'{"receipt-data": "AAAA"}', method="POST"), timeout=60).read()
    except OSError:
        pass


def test_a_second_signal_ends_a_graceful_stop_at_once(tmp_path):
    # A verifyReceipt call held open (a hanging fault) keeps the first stop in its 5 s grace; a second signal ends it.
    # When the call had not reached the emulator yet (a loaded machine), the first stop ends at once: tried again.
    for attempt in range(3):
        process, url = start_serving(SERVE_COMMANDS["appstore serve"](str(tmp_path / f"data-{attempt}")))
        try:
            fault = subprocess.run([BIN, "appstore", "fault", "add", "--endpoint", "verifyReceipt", "--hang", "--url", url],
                                   capture_output=True, text=True, timeout=60)
            assert fault.returncode == 0, fault.stderr
            threading.Thread(target=lambda: post_ignoring_errors(url + "/sandbox/verifyReceipt"), daemon=True).start()
            time.sleep(0.5 * (attempt + 1))
            process.send_signal(signal.SIGTERM)
            time.sleep(1)
            if process.poll() is not None:
                assert process.returncode == 0, process.stderr.read()
                continue
            started = time.monotonic()
            process.send_signal(signal.SIGTERM)
            status, stderr = stopped(process, 10)
            assert status == 1 and "second signal" in stderr, stderr
            assert time.monotonic() - started < 3.5, "the second signal should not wait for the grace"
            return
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
    pytest.fail("the held call never kept the first stop waiting")
