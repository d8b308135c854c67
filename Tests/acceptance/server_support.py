"""Running purchase servers (and PostgreSQL schemas) for the acceptance suites."""
import http.client
import json
import os
import signal
import subprocess
import tempfile
import time
import urllib.parse
import uuid

from conftest import BIN, ROOT

PG_URL = os.environ.get("STOREKEEPER_TEST_POSTGRES")
ENGINES = ["sqlite"] + (["postgres"] if PG_URL else [])

PRODUCTS = {
    "com.example.coins": [("Nada.JPYF01", "consumable", {"currency": "coins", "amount": 20}),
                          ("Nada.JPYF02", "consumable", {"currency": "coins", "amount": 100}),
                          ("Nada.JPYF03", "consumable", {"currency": "coins", "amount": 600})],
    "com.example.football": [("ProtectiveGloves", "non-consumable", {"entitlement": "protective_gloves"}),
                             ("GoldenGlobe", "non-consumable", {"entitlement": "golden_globe"}),
                             ("EnergyBottle", "consumable", {"currency": "energy_bottles", "amount": 1})],
    "com.example.comics": [("com.raywenderlich.inapprage.nightlyrage", "non-consumable", {"entitlement": "nightlyrage"})],
    "com.example.magazine": [("com.example.magazine.monthly", "auto-renewable", {"entitlement": "magazine"}),
                             ("com.example.magazine.yearly", "auto-renewable", {"entitlement": "magazine"})],
}


def fresh_postgres_url():
    """A PostgreSQL URL whose search_path is a new, empty schema."""
    schema = "a_" + uuid.uuid4().hex
    subprocess.run(["psql", PG_URL, "-qc", f"CREATE SCHEMA {schema}"], check=True, capture_output=True)
    separator = "&" if "?" in PG_URL else "?"
    return f"{PG_URL}{separator}options=-csearch_path%3D{schema}"


class Server:
    """A running `storekeeper server serve` wired to an emulator."""

    def __init__(self, emulator, data_dir, database=None, admin_key="sk_admin_acceptance", extra=(), master_key=None):
        self.emulator = emulator
        self.master_key = master_key
        self.data_dir = data_dir
        self.database = database
        self.admin_key = admin_key
        self.extra = list(extra)
        self.start()

    def start(self):
        args = [BIN, "server", "serve", "--data", self.data_dir, "--port", "0", "--quiet", "--appstore-url", self.emulator.url,
                "--trust-emulator", "--follow-emulator-clock", "--admin-key", self.admin_key, "--retry-base", "0.2", "--retry-cap", "2", *self.extra]
        if self.database:
            args += ["--database", self.database]
        environment = {**os.environ, **({"STOREKEEPER_MASTER_KEY": self.master_key} if self.master_key else {})}
        self.process = subprocess.Popen(args, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=environment)
        line = self.process.stdout.readline()
        if "listening on" not in line:
            self.process.kill()
            raise RuntimeError("server did not start: " + line + self.process.stderr.read())
        self.url = line.strip().split("listening on ")[1]
        self.connection = None

    def stop(self):
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.process.kill()

    def kill(self):
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def cli(self, *args):
        result = subprocess.run([BIN, *args, "--url", self.url, "--admin-key", self.admin_key], cwd=ROOT, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stderr
        return json.loads(result.stdout) if result.stdout.strip().startswith(("{", "[")) else result.stdout

    def request(self, method, path, body=None, key=None, headers=None):
        parsed = urllib.parse.urlparse(self.url)
        if self.connection is None:
            self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
        all_headers = {"Content-Type": "application/json", **(headers or {})}
        if key:
            all_headers["Authorization"] = "Bearer " + key
        for attempt in range(2):
            try:
                self.connection.request(method, path, body=json.dumps(body) if body is not None else None, headers=all_headers)
                response = self.connection.getresponse()
                data = response.read()
                if not data:
                    return response.status, None
                if "json" not in (response.getheader("Content-Type") or "json"):
                    return response.status, data.decode()
                return response.status, json.loads(data)
            except (http.client.HTTPException, ConnectionError, OSError):
                self.connection = http.client.HTTPConnection(parsed.hostname, parsed.port, timeout=60)
                if attempt == 1:
                    raise

    def setup_app(self, bundle, **policies):
        """Registers an example app with its shared secret and product mappings; returns an API key."""
        secret = self.emulator.shared_secret(bundle)
        args = ["server", "app", "add", bundle, "--shared-secret", secret]
        for name, value in policies.items():
            if isinstance(value, list):
                for item in value:
                    args += ["--" + name.replace("_", "-"), item]
            else:
                args += ["--" + name.replace("_", "-"), value]
        self.cli(*args)
        for product, kind, grants in PRODUCTS[bundle]:
            product_args = ["server", "product", "set", bundle, product, "--type", kind, "--price", "0.99", "--price-currency", "USD"]
            for name, value in grants.items():
                product_args += ["--" + name, str(value)]
            self.cli(*product_args)
        return self.cli("server", "key", "create", bundle)["apiKey"]

    def wait_for_key(self, key, timeout=10):
        """Returns once this server accepts `key`. A key made elsewhere (the CLI, another process on the database) is
        loaded by the server's refresh, once a second: a test that goes on at once can be refused on a fast host."""
        deadline = time.time() + timeout
        while True:
            status, body = self.request("GET", "/v1/users/key-probe", key=key)
            if status != 401:
                return
            if time.time() > deadline:
                raise AssertionError(f"the server still refuses the key after {timeout} s: {body}")
            time.sleep(0.05)

    def upload(self, key, user, receipt, wait=30):
        status, body = self.request("POST", f"/v1/receipts?wait={wait}", {"appUserId": user, "receiptData": receipt}, key=key)
        assert status in (200, 202), body
        return body

    def user(self, key, user):
        status, body = self.request("GET", f"/v1/users/{user}", key=key)
        assert status == 200, body
        return body

    def wait_for(self, key, verification_id, timeout=120):
        deadline = time.time() + timeout
        while time.time() < deadline:
            status, body = self.request("GET", f"/v1/verifications/{verification_id}?wait=5", key=key)
            if body["state"] in ("verified", "rejected", "dead"):
                return body
        raise AssertionError(f"verification {verification_id} did not settle")


def emulator_buy(emulator, app, product, account, quantity=1):
    """Buys through the emulator's admin API (fast, keep-alive free) and returns the purchase summary."""
    status, data = emulator.request("POST", "/admin/v1/purchases", {"app": app, "product": product, "account": account, "quantity": quantity})
    assert status == 201, data
    return json.loads(data)
