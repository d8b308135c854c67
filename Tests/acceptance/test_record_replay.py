"""Record Apple's answers once with the purchase server, then serve them back in CI: `server serve --record`
and `appstore replay`. Here the emulator stands in for Apple's sandbox."""
import hashlib
import json
import os
import signal
import stat
import subprocess
import tempfile
import uuid

from conftest import BIN, ROOT
from server_support import Server, emulator_buy


class Replay:
    def __init__(self, recording, data_dir):
        self.process = subprocess.Popen([BIN, "appstore", "replay", str(recording), "--data", data_dir, "--port", "0", "--quiet"],
                                        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        assert "listening on" in line, line + self.process.stderr.read()
        self.url = line.strip().split("listening on ")[1]

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        self.process.wait(timeout=20)


def post(url, body):
    import urllib.request
    request = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST", headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=30) as response:
        return response.status, json.loads(response.read())


def test_the_server_records_verify_receipt_and_replay_serves_it_back(emulator, tmp_path):
    recording = tmp_path / "apple.jsonl"
    secret = emulator.shared_secret("com.example.coins")
    tester = f"rec{uuid.uuid4().hex[:8]}@example.com"
    emulator.cli("appstore", "tester", "add", tester)
    bought = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", tester)
    with tempfile.TemporaryDirectory() as server_dir:
        server = Server(emulator, server_dir, extra=["--record", str(recording)])
        try:
            key = server.setup_app("com.example.coins")
            assert server.upload(key, "rita", bought["receipt"])["state"] == "verified"
        finally:
            server.stop()
    text = recording.read_text()
    lines = [json.loads(line) for line in text.splitlines()]
    assert lines and all(line["path"] == "/verifyReceipt" for line in lines)
    # The shared secret and the receipts never reach the file; it is readable by its owner only.
    assert secret not in text and bought["receipt"][:200] not in text
    assert stat.S_IMODE(os.stat(recording).st_mode) == 0o600
    answered = [line for line in lines if json.loads(line["body"]).get("status") == 0]
    assert answered and answered[0]["environment"] == "sandbox"

    with tempfile.TemporaryDirectory() as replay_dir:
        replay = Replay(recording, replay_dir)
        try:
            # The same request body gets the same answer (matched by its SHA-256, though the file keeps no receipt).
            status, body = post(replay.url + "/sandbox/verifyReceipt", {"receipt-data": bought["receipt"], "password": secret, "exclude-old-transactions": False})
            recorded = json.loads(answered[0]["body"])
            assert status == 200 and body["status"] == 0
            assert [item["transaction_id"] for item in body["receipt"]["in_app"]] == [item["transaction_id"] for item in recorded["receipt"]["in_app"]]
            # Through HTTPS_PROXY, as an unmodified client calls Apple.
            tls_root = os.path.join(replay_dir, "ca", "tls", "root.pem")
            environment = {k: v for k, v in os.environ.items() if "proxy" not in k.lower()}
            environment.update({"HTTPS_PROXY": replay.url, "CURL_CA_BUNDLE": tls_root})
            answer = subprocess.run(["curl", "-sS", "-X", "POST", "https://sandbox.itunes.apple.com/verifyReceipt", "-d", "{}"],
                                    env=environment, capture_output=True, text=True, timeout=30)
            assert json.loads(answer.stdout)["status"] in (0, 21002, 21007), answer.stderr
            # Never recorded: 404 not_recorded, with the reason.
            import urllib.error
            try:
                post(replay.url + "/production/inApps/v1/transactions/1", {})
                raise AssertionError("an unrecorded call was answered")
            except urllib.error.HTTPError as error:
                assert error.code == 404 and json.loads(error.read())["error"]["code"] == "not_recorded"
        finally:
            replay.stop()


def test_replay_refuses_a_file_that_is_not_a_recording(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"method": "POST"}\n')
    result = subprocess.run([BIN, "appstore", "replay", str(bad), "--data", str(tmp_path), "--port", "0"], cwd=ROOT,
                            capture_output=True, text=True, timeout=30)
    assert result.returncode != 0 and "line 1" in result.stderr
