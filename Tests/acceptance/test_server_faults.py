"""Apple's bad days: latency, outages, a crashed server, several servers sharing PostgreSQL.
After each, every purchase is granted exactly once and nothing is lost."""
import os
import tempfile
import time
import uuid

import pytest

from server_support import ENGINES, PG_URL, Server, emulator_buy, fresh_postgres_url


def database_for(engine):
    return fresh_postgres_url() if engine == "postgres" else None


def buy_many(emulator, testers, per_tester, product="Nada.JPYF01"):
    """Each tester buys `per_tester` consumables; returns [(tester, receipt after that purchase)]."""
    uploads = []
    for _ in range(testers):
        email = f"load{uuid.uuid4().hex[:10]}@example.com"
        status, _ = emulator.request("POST", "/admin/v1/accounts", {"email": email})
        assert status == 201
        for _ in range(per_tester):
            uploads.append((email, emulator_buy(emulator, "com.example.coins", product, email)["receipt"]))
    return uploads


def submit_all(server, key, uploads):
    ids = []
    for tester, receipt in uploads:
        status, body = server.request("POST", "/v1/receipts", {"appUserId": tester, "receiptData": receipt}, key=key)
        assert status == 202, body
        ids.append(body["verificationId"])
    return ids


def settle_all(server, key, ids, timeout=180):
    deadline = time.time() + timeout
    states = {}
    for verification_id in ids:
        states[verification_id] = server.wait_for(key, verification_id, timeout=max(1, deadline - time.time()))["state"]
    return states


def assert_exactly_once(server, key, uploads, coins_each=20):
    expected = {}
    for tester, _ in uploads:
        expected[tester] = expected.get(tester, 0) + coins_each
    for tester, coins in expected.items():
        assert server.user(key, tester)["balances"] == {"coins": coins}, tester


@pytest.mark.parametrize("engine", ENGINES)
def test_three_to_six_seconds_of_latency_on_every_call(emulator, engine):
    with tempfile.TemporaryDirectory() as data_dir:
        server = Server(emulator, data_dir, database=database_for(engine))
        try:
            key = server.setup_app("com.example.coins")
            uploads = buy_many(emulator, testers=20, per_tester=2)
            emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--latency", "3s-6s")
            started = time.time()
            ids = submit_all(server, key, uploads)
            states = settle_all(server, key, ids)
            assert set(states.values()) == {"verified"}
            # All 40 were in flight together: far less than 40 × 3 s.
            assert time.time() - started < 60
            assert_exactly_once(server, key, uploads)
        finally:
            emulator.cli("appstore", "fault", "clear")
            server.stop()


@pytest.mark.parametrize("engine", ENGINES)
def test_sixty_second_outage_of_mixed_failures(emulator, engine):
    with tempfile.TemporaryDirectory() as data_dir:
        server = Server(emulator, data_dir, database=database_for(engine), extra=["--call-timeout", "3"])
        try:
            key = server.setup_app("com.example.coins")
            uploads = buy_many(emulator, testers=10, per_tester=3)
            for fault in (["--status", "21005"], ["--http", "503"], ["--html"], ["--drop"]):
                emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", *fault, "--for", "60s")
            ids = submit_all(server, key, uploads)
            time.sleep(5)
            status, body = server.request("GET", "/admin/v1/jobs?limit=1", headers={"Authorization": "Bearer " + server.admin_key})
            assert body["counts"].get("verified", 0) == 0, "nothing can verify during the outage"
            states = settle_all(server, key, ids, timeout=150)
            assert set(states.values()) == {"verified"}
            assert_exactly_once(server, key, uploads)
        finally:
            emulator.cli("appstore", "fault", "clear")
            server.stop()


@pytest.mark.parametrize("engine", ENGINES)
def test_sigkill_with_a_thousand_verifications_queued(emulator, engine):
    with tempfile.TemporaryDirectory() as data_dir:
        database = database_for(engine)
        # Short leases (and calls) so the killed server's claims expire quickly.
        server = Server(emulator, data_dir, database=database, extra=["--concurrency", "8", "--call-timeout", "1", "--lease", "3"])
        try:
            key = server.setup_app("com.example.coins")
            uploads = buy_many(emulator, testers=100, per_tester=10)
            emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--latency", "200ms-400ms")
            ids = submit_all(server, key, uploads)
            assert len(ids) == 1000
            server.kill()
            emulator.cli("appstore", "fault", "clear")
            server.extra = ["--call-timeout", "1", "--lease", "3"]
            server.start()
            states = settle_all(server, key, ids, timeout=300)
            assert set(states.values()) == {"verified"}
            assert_exactly_once(server, key, uploads)
        finally:
            emulator.cli("appstore", "fault", "clear")
            server.stop()


@pytest.mark.skipif(PG_URL is None, reason="needs PostgreSQL (make test starts one)")
def test_three_servers_share_postgres_and_survive_losing_one(emulator):
    database = fresh_postgres_url()
    directories = [tempfile.TemporaryDirectory() for _ in range(3)]
    servers = []
    # Processes sharing one database share its master key (each data directory would make its own).
    master_key = os.urandom(32).hex()
    try:
        for index, directory in enumerate(directories):
            servers.append(Server(emulator, directory.name, database=database, master_key=master_key,
                                  extra=["--lease", "3", "--call-timeout", "1", "--concurrency", "16"]))
        key = servers[0].setup_app("com.example.coins")
        for server in servers:
            server.wait_for_key(key)
        uploads = buy_many(emulator, testers=30, per_tester=10)
        emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--latency", "100ms-300ms")
        ids = []
        for index, upload in enumerate(uploads):
            target = servers[index % 3] if servers[index % 3].process.poll() is None else servers[0]
            ids += submit_all(target, key, [upload])
            if index == len(uploads) // 2:
                servers[2].kill()
        survivors = servers[:2]
        states = settle_all(survivors[0], key, ids, timeout=240)
        assert set(states.values()) == {"verified"}
        assert_exactly_once(survivors[1], key, uploads)
        status, body = survivors[0].request("GET", "/admin/v1/transactions?limit=10000&app=com.example.coins",
                                            headers={"Authorization": "Bearer " + survivors[0].admin_key})
        assert len(body) == len(uploads)
    finally:
        emulator.cli("appstore", "fault", "clear")
        for server in servers:
            server.stop()
        for directory in directories:
            directory.cleanup()
