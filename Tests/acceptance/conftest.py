"""Acceptance tests: drive the real `storekeeper` binary with outside clients.

The binary comes from $STOREKEEPER_BIN (make test sets it to the debug build).
"""
import json
import os
import pathlib
import signal
import subprocess
import tempfile
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared"
BIN = os.environ.get("STOREKEEPER_BIN", str(ROOT / ".build" / "debug" / "storekeeper"))
TESTER = "acceptance@example.com"
CATALOGS = [
    "com.example.coins=examples/coins.storekit",
    "com.example.football=examples/football.storekit",
    "com.example.comics=examples/comics.storekit",
    "com.example.magazine=examples/magazine.storekit",
]


class Emulator:
    """A running `storekeeper appstore serve` on a free port."""

    def __init__(self, data_dir):
        self.data_dir = data_dir
        args = [BIN, "appstore", "serve", "--data", data_dir, "--port", "0", "--quiet", "--tester", TESTER]
        for catalog in CATALOGS:
            args += ["--catalog", catalog]
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError("emulator did not start: " + line + self.process.stderr.read())
        self.url = line.strip().split("listening on ")[1]

    def stop(self):
        self.process.send_signal(signal.SIGTERM)
        try:
            self.process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            self.process.kill()
            raise

    def cli(self, *args, check=True):
        """Runs a storekeeper command against this emulator and returns (exit code, stdout, stderr)."""
        result = subprocess.run([BIN, *args, "--url", self.url], cwd=ROOT, capture_output=True, text=True, timeout=60)
        if check and result.returncode != 0:
            raise AssertionError(f"storekeeper {' '.join(args)} failed: {result.stderr}")
        return result

    def buy(self, app, product, account=TESTER, **options):
        args = ["appstore", "buy", "--app", app, "--product", product, "--account", account]
        for key, value in options.items():
            args += ["--" + key, str(value)]
        return json.loads(self.cli(*args).stdout)

    def request(self, method, path, body=None, raw=None, headers=None):
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        headers = dict(headers or {})
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)
        try:
            with urllib.request.urlopen(request, timeout=30) as response:
                return response.status, response.read()
        except urllib.error.HTTPError as error:
            return error.code, error.read()

    def verify(self, receipt, environment="sandbox", **fields):
        body = {"receipt-data": receipt, **fields}
        status, data = self.request("POST", f"/{environment}/verifyReceipt", body)
        assert status == 200
        return json.loads(data)

    def shared_secret(self, app):
        status, data = self.request("GET", f"/admin/v1/apps/{app}")
        assert status == 200
        return json.loads(data)["sharedSecret"]


@pytest.fixture(scope="session")
def emulator():
    with tempfile.TemporaryDirectory() as data_dir:
        running = Emulator(data_dir)
        try:
            yield running
        finally:
            running.stop()


@pytest.fixture(scope="session")
def root_pem(emulator, tmp_path_factory):
    path = tmp_path_factory.mktemp("ca") / "root.pem"
    emulator.cli("appstore", "ca", "export", "--output", str(path))
    return path


@pytest.fixture(scope="session")
def jws_root_pem(emulator, tmp_path_factory):
    path = tmp_path_factory.mktemp("jws-ca") / "jws-root.pem"
    emulator.cli("appstore", "ca", "export", "--jws", "--output", str(path))
    return path
