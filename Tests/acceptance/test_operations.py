"""What operators run on, against the real server: probes, the Prometheus exposition (parsed by the official
client library), request ids, and an online SQLite backup taken while the server runs."""
import os
import resource
import socket
import sqlite3
import subprocess
import tempfile
import time
import urllib.error
import urllib.request

import pytest
from prometheus_client.parser import text_string_to_metric_families

from conftest import BIN, ROOT
from server_support import Server, emulator_buy


def get(url, headers=None):
    request = urllib.request.Request(url, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=30) as response:
            return response.status, dict(response.headers), response.read().decode()
    except urllib.error.HTTPError as error:
        return error.code, dict(error.headers), error.read().decode()


def test_probes_metrics_request_ids_and_backup(emulator):
    with tempfile.TemporaryDirectory() as data_dir:
        server = Server(emulator, data_dir, extra=["--metrics-port", "0"])
        try:
            metrics_url = server.process.stdout.readline().strip().split(" on ")[1]
            key = server.setup_app("com.example.coins")
            bought = emulator_buy(emulator, "com.example.coins", "Nada.JPYF02", "acceptance@example.com")
            assert server.upload(key, "olivia", bought["receipt"])["state"] == "verified"

            assert get(server.url + "/healthz")[0] == 200
            status, _, body = get(server.url + "/readyz")
            assert status == 200 and '"ready":true' in body.replace(" ", "")
            assert get(server.url + "/metrics")[0] == 401
            # Refused at the edge, before the body is read: still counted, under the route that would have answered.
            assert get(server.url + "/v1/users/olivia", {"Authorization": "Bearer sk_not_a_key"})[0] == 401
            oversized = urllib.request.Request(server.url + "/v1/notifications/apple", data=b"x" * 70_000, method="POST")
            try:
                urllib.request.urlopen(oversized, timeout=30)
                assert False, "a 70 KB notification was accepted"
            except urllib.error.HTTPError as error:
                assert error.code == 413
            status, headers, text = get(server.url + "/metrics", {"Authorization": "Bearer " + server.admin_key})
            assert status == 200 and headers["Content-Type"].startswith("text/plain; version=0.0.4")
            families = {family.name: family for family in text_string_to_metric_families(text)}
            for name in ["storekeeper_http_requests", "storekeeper_http_request_duration_seconds", "storekeeper_apple_calls",
                         "storekeeper_verification_jobs", "storekeeper_webhook_deliveries", "storekeeper_notification_lag_seconds"]:
                assert name in families, sorted(families)
            uploads = [sample for sample in families["storekeeper_http_requests"].samples
                       if sample.labels.get("route") == "/v1/receipts" and sample.labels.get("status") == "200"]
            assert [sample.value for sample in uploads] == [1.0]
            def counted(route, method, status):
                return [sample.value for sample in families["storekeeper_http_requests"].samples
                        if sample.name == "storekeeper_http_requests_total" and sample.labels == {"route": route, "method": method, "status": status}]
            assert counted("/v1/users/:user", "GET", "401") == [1.0]
            assert counted("/v1/notifications/apple", "POST", "413") == [1.0]
            assert counted("/metrics", "GET", "401") == [1.0]
            verified = [s.value for s in families["storekeeper_verification_jobs"].samples if s.labels["state"] == "verified"]
            assert verified == [1.0]
            # The monitoring port needs no key, and serves nothing else.
            assert get(metrics_url + "/metrics")[0] == 200 and get(metrics_url + "/readyz")[0] == 200
            assert get(metrics_url + "/admin/v1/apps", {"Authorization": "Bearer " + server.admin_key})[0] == 404
            # Request ids: echoed, or made up.
            assert get(server.url + "/healthz", {"X-Request-Id": "trace-7"})[1]["X-Request-Id"] == "trace-7"
            assert len(get(server.url + "/healthz")[1]["X-Request-Id"]) == 36

            backup = data_dir + "/copy.sqlite"
            result = subprocess.run([BIN, "server", "backup", backup, "--data", data_dir], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert result.returncode == 0, result.stderr
            copy = sqlite3.connect(backup)
            assert copy.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
            assert copy.execute("SELECT app_user_id FROM ledger WHERE transaction_id = ?", (bought["transaction_id"],)).fetchone() == ("olivia",)
            copy.close()
            again = subprocess.run([BIN, "server", "backup", backup, "--data", data_dir], cwd=ROOT, capture_output=True, text=True, timeout=60)
            assert again.returncode != 0 and "exists" in again.stderr
        finally:
            server.stop()


def test_both_services_allocate_with_jemalloc(emulator):
    """The program's allocator is jemalloc, linked ahead of the C library (main.swift says why): the running emulator
    and server have it mapped, and the dynamic linker binds `malloc` and `free` to it, the C library's own calls included."""
    with tempfile.TemporaryDirectory() as data_dir:
        server = Server(emulator, data_dir)
        try:
            for process in (emulator.process, server.process):
                with open(f"/proc/{process.pid}/maps") as maps:
                    assert "libjemalloc.so" in maps.read()
        finally:
            server.stop()
    bindings = subprocess.run([BIN, "--help"], cwd=ROOT, capture_output=True, text=True, timeout=60,
                              env={**os.environ, "LD_DEBUG": "bindings"}).stderr
    for symbol in ("malloc", "free", "realloc", "malloc_usable_size"):
        bound = [line for line in bindings.splitlines() if f"normal symbol `{symbol}'" in line]
        assert bound, symbol
        assert all("to /" in line and "libjemalloc.so" in line.split(" to ")[1] for line in bound), bound[:3]


def test_emulator_probes(emulator):
    assert get(emulator.url + "/healthz")[0] == 200
    assert get(emulator.url + "/readyz")[0] == 200


def open_file_limit(pid):
    with open(f"/proc/{pid}/limits") as limits:
        line = next(line for line in limits if line.startswith("Max open files"))
    return int(line.split()[3])


def memory_for_calls():
    """What an eighth of the memory this process may use holds at 32 KiB a call (the machine's, or the cgroup's limit)."""
    memory = os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    for path in ["/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"]:
        try:
            limit = int(open(path).read().strip())
        except (OSError, ValueError):
            continue
        if limit < 1 << 60:
            memory = min(memory, limit)
    return memory // 8 // 32_768


def verifications_limit(files, extra=()):
    """The server's `storekeeper_verifications_in_flight_limit` when started with `files` open files at most
    (soft and hard limit), and the open-file limit the running process has (it may raise it, when privileged)."""
    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    with tempfile.TemporaryDirectory() as data_dir:
        process = subprocess.Popen([BIN, "server", "serve", "--data", data_dir, "--port", "0", "--quiet", "--admin-key", "sk_admin_open_file_limits",
                                    "--database-pool", "4", *extra],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limited)
        try:
            line = process.stdout.readline()
            assert "listening on" in line, line + process.stderr.read()
            url = line.strip().split("listening on ")[1]
            status, _, text = get(url + "/metrics", {"Authorization": "Bearer sk_admin_open_file_limits"})
            assert status == 200
            families = {family.name: family for family in text_string_to_metric_families(text)}
            return families["storekeeper_verifications_in_flight_limit"].samples[0].value, open_file_limit(process.pid)
        finally:
            process.terminate()
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                raise AssertionError("still running 30 s after SIGTERM; its standard error ends: " + process.communicate()[1][-2000:])


def test_verifications_in_flight_follow_the_open_file_limit():
    # Each call to Apple holds a connection: by default the server keeps in flight what its open-file limit leaves
    # once its clients (a quarter, at least 1,024), webhook deliveries (an eighth, at most 2,048) and a spare (the
    # database's 4 connections and its listening one, 32 for the Server API, 64 for the metrics listener, and a
    # twentieth of the limit, at least 256) are counted.
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"this process may not set an open-file limit of 4,096 (its hard limit is {hard})")
    measured = {files: verifications_limit(files) for files in [4096, 3000]}
    for files, (limit, granted) in measured.items():
        clients = min(65_536, max(1024, int(granted * 0.25)))
        webhooks = min(2048, max(64, granted // 8))
        spare = 4 + 1 + 32 + 64 + max(256, granted // 20)
        assert limit == max(256, min(65_536, granted - clients - webhooks - spare, memory_for_calls())), (files, granted)
    if measured[3000][1] == 3000 and memory_for_calls() > 2203:  # not raised (unprivileged, or no CAP_SYS_RESOURCE)
        assert measured[4096][0] == 4096 - 1024 - 512 - 357 and measured[3000][0] == 3000 - 1024 - 375 - 357
    # Told, it keeps what it is told.
    assert verifications_limit(4096, ["--concurrency", "300"])[0] == 300


def release(connections, process, limits):
    """Closes a test's client connections, stops the program it started and gives this process its open-file limits back."""
    for connection in connections:
        connection.close()
    process.terminate()
    process.wait(timeout=30)
    resource.setrlimit(resource.RLIMIT_NOFILE, limits)


def test_calls_to_apple_make_way_for_clients():
    # Clients and calls to Apple share what webhook deliveries and the spare leave: calls take what the clients
    # connected now do not hold, less room for 1,024 more of them (up to the clients' quarter). With 8,192 files:
    # clients at most 2,048, webhooks 1,024, a spare of 4 + 1 + 32 + 64 + 409.
    files, idle = 8192, 800
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < files:
        pytest.skip(f"this process may not set an open-file limit of {files} (its hard limit is {hard})")
    if memory_for_calls() < files:
        pytest.skip("this machine's memory, not its open files, bounds the calls")
    wanted = idle + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (files, files))
    with tempfile.TemporaryDirectory() as data_dir:
        process = subprocess.Popen([BIN, "server", "serve", "--data", data_dir, "--port", "0", "--quiet", "--admin-key", "sk_admin_clients_and_calls",
                                    "--database-pool", "4"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limited)
        connections = []
        try:
            line = process.stdout.readline()
            assert "listening on" in line, line + process.stderr.read()
            if open_file_limit(process.pid) != files:
                pytest.skip("the server raised its open-file limit (a privileged process)")
            url = line.strip().split("listening on ")[1]
            port = int(url.rsplit(":", 1)[1])

            def calls_limit():
                status, _, text = get(url + "/metrics", {"Authorization": "Bearer sk_admin_clients_and_calls"})
                assert status == 200
                families = {family.name: family for family in text_string_to_metric_families(text)}
                return families["storekeeper_verifications_in_flight_limit"].samples[0].value

            def when(clients):  # the metrics request's own connection among them
                return files - min(2048, clients + 1024) - 1024 - 510

            def settles_at(expected):  # the server notes connections (the last request's among them) as it gets to them
                deadline = time.monotonic() + 10
                while (seen := calls_limit()) != expected and time.monotonic() < deadline:
                    time.sleep(0.05)
                return seen

            assert settles_at(when(1)) == 5633
            for _ in range(idle):
                connections.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            assert settles_at(when(idle + 1)) == 4833
            for connection in connections:
                connection.close()
            connections = []
            assert settles_at(when(1)) == 5633
        finally:
            release(connections, process, (soft, hard))


def test_emulator_holds_most_of_its_open_file_limit_in_connections():
    # A purchase server hides Apple's latency with thousands of calls held open at once: the emulator, serving plain
    # HTTP and TLS interception on one port, takes nine tenths of its open-file limit in connections, less 512 for
    # the descriptors its TLS tunnels may hold besides them (3,174 of 4,096).
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 4096:
        pytest.skip(f"the emulator needs more open files than the hard limit of {hard}")
    # This process holds the 3,100 connections too.
    wanted = 3100 + 256
    if soft != resource.RLIM_INFINITY and soft < wanted:
        if hard != resource.RLIM_INFINITY and hard < wanted:
            pytest.skip(f"this test needs more open files than the hard limit of {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted, hard))

    def limited():
        resource.setrlimit(resource.RLIMIT_NOFILE, (4096, 4096))
    with tempfile.TemporaryDirectory() as data_dir:
        process = subprocess.Popen([BIN, "appstore", "serve", "--data", data_dir, "--port", "0", "--quiet"],
                                   cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=limited)
        connections = []
        try:
            line = process.stdout.readline()
            assert "listening on" in line, line + process.stderr.read()
            if open_file_limit(process.pid) != 4096:
                pytest.skip("the emulator raised its open-file limit (a privileged process)")
            port = int(line.strip().rsplit(":", 1)[1])
            for _ in range(3100):
                connections.append(socket.create_connection(("127.0.0.1", port), timeout=30))
            for connection in connections:
                connection.sendall(b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n")
            answered = sum(1 for connection in connections if connection.recv(64).startswith(b"HTTP/1.1 200"))
            assert answered == 3100
        finally:
            release(connections, process, (soft, hard))
