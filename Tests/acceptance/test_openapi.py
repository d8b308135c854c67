"""Every operation in openapi/appstore.yaml is served by the emulator."""
import json
import re

import yaml

from conftest import ROOT


def test_every_documented_operation_is_routed(emulator):
    spec = yaml.safe_load((ROOT / "openapi" / "appstore.yaml").read_text())
    checked = 0
    for path, operations in spec["paths"].items():
        concrete = re.sub(r"\{[^}]+\}", "x", path)
        for method in operations:
            status, body = emulator.request(method.upper(), concrete, raw=b"{}" if method in ("post", "put") else None)
            assert status != 405, f"{method.upper()} {path} is not routed"
            if status == 404:
                message = json.loads(body)["error"]["message"]
                assert not message.startswith("Route"), f"{method.upper()} {path} is not routed"
            checked += 1
    assert checked >= 30


def test_every_documented_server_operation_is_routed(emulator, tmp_path):
    from server_support import Server
    server = Server(emulator, str(tmp_path))
    try:
        spec = yaml.safe_load((ROOT / "openapi" / "purchase-server.yaml").read_text())
        checked = 0
        for path, operations in spec["paths"].items():
            concrete = re.sub(r"\{[^}]+\}", "x", path)
            for method in operations:
                status, body = server.request(method.upper(), concrete, body={} if method in ("post", "put") else None,
                                              headers={"Authorization": "Bearer " + server.admin_key})
                assert status != 405, f"{method.upper()} {path} is not routed"
                if status == 404:
                    assert not body["error"]["message"].startswith("Route"), f"{method.upper()} {path} is not routed"
                checked += 1
        assert checked >= 18
    finally:
        server.stop()
