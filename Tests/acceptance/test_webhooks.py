"""Webhooks from the real server to a receiver written as a developer would write one, in Python: signatures
checked with the documented recipe (hmac over "t.BODY"), events de-duplicated on their id, and nothing lost
when the server is killed between settling a purchase and delivering its event."""
import hashlib
import hmac
import http.server
import json
import socket
import tempfile
import threading
import time
import uuid

import pytest

from server_support import ENGINES, Server, emulator_buy, fresh_postgres_url


class Receiver:
    """A developer's endpoint on a fixed port, which can be down (nothing listening) and come up later."""

    def __init__(self):
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            self.port = probe.getsockname()[1]
        self.url = f"http://127.0.0.1:{self.port}/storekeeper"
        self.deliveries = []
        self.server = None

    def up(self):
        receiver = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers["Content-Length"]))
                receiver.deliveries.append((self.headers["Storekeeper-Signature"], body))
                self.send_response(200)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", self.port), Handler)
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def down(self):
        if self.server:
            self.server.shutdown()
            self.server.server_close()

    def events(self):
        return {json.loads(body)["id"]: json.loads(body) for _, body in self.deliveries}

    def wait_for(self, count, timeout=30):
        deadline = time.time() + timeout
        while time.time() < deadline and len(self.events()) < count:
            time.sleep(0.1)
        return self.events()


def verify(header, body, secret, tolerance=300):
    """The README's recipe, as a receiver implements it."""
    parts = [part.split("=", 1) for part in header.split(",")]
    timestamp = next(value for name, value in parts if name == "t")
    if abs(time.time() - int(timestamp)) > tolerance:
        return False
    expected = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256).hexdigest()
    return any(hmac.compare_digest(expected, value) for name, value in parts if name == "v1")


@pytest.mark.parametrize("engine", ENGINES)
def test_killed_between_settlement_and_delivery_loses_nothing(emulator, engine):
    receiver = Receiver()
    with tempfile.TemporaryDirectory() as data_dir:
        database = fresh_postgres_url() if engine == "postgres" else None
        extra = ["--webhook-retry-base", "0.2", "--webhook-timeout", "2"]
        server = Server(emulator, data_dir, database=database, extra=extra)
        try:
            key = server.setup_app("com.example.coins")
            added = server.cli("server", "webhook", "add", "com.example.coins", receiver.url)
            secret = added["secret"]
            tester = f"w{uuid.uuid4().hex[:10]}@example.com"
            emulator.cli("appstore", "tester", "add", tester)
            bought = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", tester)
            # The receiver is down: the purchase settles, its events wait in the outbox, and the server dies.
            assert server.upload(key, "carol", bought["receipt"])["state"] == "verified"
            # Killed once both deliveries have met the closed port (not after a guess of how long that takes).
            deadline = time.time() + 30
            while time.time() < deadline:
                logged = server.cli("server", "webhook", "deliveries", "com.example.coins", added["id"])
                if len(logged) == 2 and all(delivery["log"] for delivery in logged):
                    break
                time.sleep(0.1)
            server.kill()
            receiver.up()
            server.start()
            # A kill in the middle of a retry leaves that delivery claimed until its lease (2 x timeout + 30 s) lapses.
            events = receiver.wait_for(2, timeout=90)
            assert sorted(event["type"] for event in events.values()) == ["BALANCE_CHANGED", "CONSUMABLE_PURCHASE"], events
            purchase = next(event for event in events.values() if event["type"] == "CONSUMABLE_PURCHASE")
            assert purchase["appUserId"] == "carol" and purchase["transactionId"] == bought["transaction_id"]
            assert purchase["balances"] == {"coins": 100} and purchase["sequence"] == 1
            for header, body in receiver.deliveries:
                assert verify(header, body, secret)
                assert not verify(header, body, secret + "-wrong")
                assert not verify(header, body.replace(b"carol", b"mallory"), secret)
            # The log shows the refused connections before the server died, then the delivery.
            deliveries = server.cli("server", "webhook", "deliveries", "com.example.coins", added["id"])
            assert len(deliveries) == 2 and all(delivery["state"] == "delivered" for delivery in deliveries)
            assert all(delivery["log"][0]["outcome"] == "connection_failed" for delivery in deliveries), deliveries
            # A test event and a redelivery arrive too; a redelivered event has the id it had.
            server.cli("server", "webhook", "test", "com.example.coins", added["id"])
            assert any(event["type"] == "TEST" for event in receiver.wait_for(3).values())
            server.cli("server", "webhook", "redeliver", "com.example.coins", added["id"], purchase["id"])
            deadline = time.time() + 10
            while time.time() < deadline and len(receiver.deliveries) < 4:
                time.sleep(0.1)
            assert len(receiver.deliveries) == 4 and len(receiver.events()) == 3
            # A rotation: for the grace period each delivery carries both signatures.
            rotated = server.cli("server", "webhook", "rotate", "com.example.coins", added["id"])
            server.cli("server", "webhook", "test", "com.example.coins", added["id"])
            receiver.wait_for(4)
            header, body = receiver.deliveries[-1]
            assert verify(header, body, secret) and verify(header, body, rotated["secret"])
        finally:
            server.stop()
            receiver.down()
