"""Schema-driven API tests: schemathesis generates requests from both OpenAPI documents against the live
programs (an emulator and a purchase server of their own, so the state it makes touches no other test).
No answer may be a 5xx, and every documented answer must match its documented shape. A bounded budget
keeps it inside make test; SCHEMATHESIS_EXAMPLES raises it."""
import json
import os
import subprocess
import sys
import tempfile

import pytest

from conftest import ROOT, Emulator
from server_support import Server

EXAMPLES = os.environ.get("SCHEMATHESIS_EXAMPLES", "12")
SCHEMATHESIS = os.path.join(os.path.dirname(sys.executable), "schemathesis")
CHECKS = "not_a_server_error,response_schema_conformance"


def run(spec, url, *options):
    result = subprocess.run([SCHEMATHESIS, "run", str(ROOT / "openapi" / spec), "--url", url, "-c", CHECKS, "--max-examples", EXAMPLES,
                             "--request-timeout", "20", "--seed", "20261201", "--no-color", *options],
                            cwd=ROOT, capture_output=True, text=True, timeout=900)
    summary = result.stdout[-3000:]
    assert result.returncode == 0, summary
    assert " passed" in summary and "failed" not in summary.split("Test cases:")[-1], summary


@pytest.fixture(scope="module")
def programs():
    with tempfile.TemporaryDirectory() as emulator_dir, tempfile.TemporaryDirectory() as server_dir:
        emulator = Emulator(emulator_dir)
        server = Server(emulator, server_dir)
        try:
            secret = server.setup_app("com.example.coins")
            yield emulator, server, secret
        finally:
            server.stop()
            emulator.stop()


def test_purchase_server_app_api(programs):
    _, server, secret = programs
    run("purchase-server.yaml", server.url, "-H", f"Authorization: Bearer {secret}", "--include-path-regex", "^/(v1|health)")


def test_purchase_server_admin_api(programs):
    _, server, _ = programs
    run("purchase-server.yaml", server.url, "-H", f"Authorization: Bearer {server.admin_key}", "--include-path-regex", "^/admin/")


def test_emulator(programs):
    emulator, _, _ = programs
    # Faults and time jumps are what this API is for, and they would make every later answer slow or a storm of renewals.
    run("appstore.yaml", emulator.url, "--exclude-path-regex", "^/admin/v1/(faults|time)")
