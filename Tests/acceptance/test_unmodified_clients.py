"""Clients that hard-code Apple's URLs reach the emulator unchanged, through HTTPS_PROXY and a trusted root only.

Each client runs in its own Python process whose only link to the emulator is its environment
(HTTPS_PROXY, REQUESTS_CA_BUNDLE, SSL_CERT_FILE), as a team's CI would run its backend.
"""
import json
import os
import socket
import ssl
import subprocess
import sys
import textwrap
import uuid

import pytest

from conftest import ROOT


@pytest.fixture(scope="module")
def tls_root(emulator, tmp_path_factory):
    path = tmp_path_factory.mktemp("tls") / "tls-root.pem"
    emulator.cli("appstore", "ca", "export", "--tls", "--output", str(path))
    return path


def proxy_environment(emulator, tls_root):
    environment = {key: value for key, value in os.environ.items() if "proxy" not in key.lower()}
    proxy = emulator.url  # the emulator's own port answers CONNECT
    environment.update({"HTTPS_PROXY": proxy, "https_proxy": proxy, "REQUESTS_CA_BUNDLE": str(tls_root),
                        "SSL_CERT_FILE": str(tls_root), "CURL_CA_BUNDLE": str(tls_root), "NO_PROXY": "", "no_proxy": ""})
    return environment


def run_client(emulator, tls_root, code, **values):
    """Runs `code` in a fresh interpreter with the proxy environment; `values` arrive as the dict `given`;
    the code's `print(json.dumps(...))` comes back parsed."""
    program = "import json, sys\ngiven = json.loads(sys.argv[1])\n" + textwrap.dedent(code)
    result = subprocess.run([sys.executable, "-c", program, json.dumps(values)], env=proxy_environment(emulator, tls_root),
                            capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout.strip().splitlines()[-1])


def new_tester(emulator, production=False):
    email = f"proxy{uuid.uuid4().hex[:10]}@example.com"
    emulator.cli("appstore", "tester", "add", email, *(["--production"] if production else []))
    return email


APPLE_LIBRARY = """
    from appstoreserverlibrary.api_client import AppStoreServerAPIClient
    from appstoreserverlibrary.models.Environment import Environment
    from appstoreserverlibrary.signed_data_verifier import SignedDataVerifier, VerificationException
    environment = Environment.PRODUCTION if given["environment"] == "production" else Environment.SANDBOX
    key = given["key"]
    client = AppStoreServerAPIClient(key["privateKey"].encode(), key["keyId"], key["issuerId"], given["bundle"], environment)
    info = client.get_transaction_info(given["transaction"])
    root = open(given["jwsRoot"], "rb").read()
    import ssl
    verifier = SignedDataVerifier([ssl.PEM_cert_to_DER_cert(root.decode())], True, environment, given["bundle"], given.get("appAppleId"))
    try:
        decoded = verifier.verify_and_decode_signed_transaction(info.signedTransactionInfo)
        print(json.dumps({"transactionId": decoded.transactionId, "environment": decoded.environment.value}))
    except VerificationException as error:
        print(json.dumps({"refused": error.status.name}))
"""


def apple_library(emulator, tls_root, jws_root_pem, bundle, transaction, environment):
    key = json.loads(emulator.cli("appstore", "key", "create", "--app", bundle).stdout)
    app_apple_id = None
    if environment == "production":
        app_apple_id = json.loads(emulator.request("GET", f"/admin/v1/apps/{bundle}")[1]).get("appAppleId")
    return run_client(emulator, tls_root, APPLE_LIBRARY, key=key, bundle=bundle, transaction=transaction, environment=environment,
                      jwsRoot=str(jws_root_pem), appAppleId=app_apple_id)


@pytest.mark.parametrize("environment", ["sandbox", "production"])
def test_apple_library_calls_apple_hosts_and_checks_ocsp_online(emulator, tls_root, jws_root_pem, environment):
    bought = emulator.buy("com.example.coins", "Nada.JPYF02", account=new_tester(emulator, production=environment == "production"))
    result = apple_library(emulator, tls_root, jws_root_pem, "com.example.coins", bought["transaction_id"], environment)
    assert result == {"transactionId": bought["transaction_id"], "environment": environment.capitalize()}


def test_online_checks_refuse_a_revoked_certificate_and_accept_it_again(emulator, tls_root, jws_root_pem):
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    for certificate in ["leaf", "intermediate"]:
        revoked = json.loads(emulator.cli("appstore", "ca", "revoke", certificate).stdout)
        assert [entry["certificate"] for entry in revoked["revoked"]] == [certificate]
        try:
            result = apple_library(emulator, tls_root, jws_root_pem, "com.example.coins", bought["transaction_id"], "sandbox")
            assert result == {"refused": "VERIFICATION_FAILURE"}
        finally:
            emulator.cli("appstore", "ca", "revoke", certificate, "--undo")
    result = apple_library(emulator, tls_root, jws_root_pem, "com.example.coins", bought["transaction_id"], "sandbox")
    assert result["transactionId"] == bought["transaction_id"]


def test_ocsp_answers_by_key_with_each_status_and_refuses_garbage(emulator, jws_root_pem):
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509 import ocsp
    chain = emulator.request("GET", "/admin/v1/ca?jws=true&chain=true")[1].decode()
    root, intermediate = x509.load_pem_x509_certificates(chain.encode())
    # The leaf is the first certificate of any signed transaction's x5c.
    bought = emulator.buy("com.example.coins", "Nada.JPYF01", account=new_tester(emulator))
    import base64
    header = json.loads(base64.urlsafe_b64decode(bought["signedTransaction"].split(".")[0] + "=="))
    leaf = x509.load_der_x509_certificate(base64.b64decode(header["x5c"][0]))
    urls = [d.access_location.value for d in leaf.extensions.get_extension_for_class(x509.AuthorityInformationAccess).value]
    assert urls == ["https://ocsp.apple.com/ocsp03-storekeeper-wwdrg6"]

    def ask(certificate, issuer, algorithm=hashes.SHA256()):
        request = ocsp.OCSPRequestBuilder().add_certificate(certificate, issuer, algorithm).build()
        status, body = emulator.request("POST", "/ocsp", raw=request.public_bytes(serialization.Encoding.DER),
                                        headers={"Content-Type": "application/ocsp-request"})
        assert status == 200
        return ocsp.load_der_ocsp_response(body)

    good = ask(leaf, intermediate, hashes.SHA1())
    assert good.response_status == ocsp.OCSPResponseStatus.SUCCESSFUL
    assert good.certificate_status == ocsp.OCSPCertStatus.GOOD and good.serial_number == leaf.serial_number
    # Named by key and signed by the leaf's issuer, as Apple's verifier requires.
    assert good.responder_key_hash is not None
    from cryptography.hazmat.primitives.asymmetric.ec import ECDSA
    intermediate.public_key().verify(good.signature, good.tbs_response_bytes, ECDSA(good.signature_hash_algorithm))
    emulator.cli("appstore", "ca", "revoke", "intermediate")
    try:
        revoked = ask(intermediate, root)
        assert revoked.certificate_status == ocsp.OCSPCertStatus.REVOKED
        assert ask(leaf, intermediate).certificate_status == ocsp.OCSPCertStatus.GOOD
    finally:
        emulator.cli("appstore", "ca", "revoke", "intermediate", "--undo")
    # A certificate the emulator never issued, garbage, and an oversized body.
    apple = x509.load_pem_x509_certificate((ROOT.parent / "shared" / "certs" / "apple-root-ca-g3.pem").read_bytes())
    assert ask(apple, apple).response_status == ocsp.OCSPResponseStatus.UNAUTHORIZED
    for body in [b"", b"\x30\x03\x02\x01\x00", b"\x30" * 10_000]:
        status, answer = emulator.request("POST", "/ocsp", raw=body, headers={"Content-Type": "application/ocsp-request"})
        assert status == 200 and ocsp.load_der_ocsp_response(answer).response_status == ocsp.OCSPResponseStatus.MALFORMED_REQUEST


def test_ocsp_get_form_through_the_proxy(emulator, tls_root):
    """RFC 6960's GET: the DER request in Base64, URL-escaped, after the responder's path on ocsp.apple.com."""
    import base64
    import urllib.parse
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.x509 import ocsp
    chain = emulator.request("GET", "/admin/v1/ca?jws=true&chain=true")[1].decode()
    root, intermediate = x509.load_pem_x509_certificates(chain.encode())
    request = ocsp.OCSPRequestBuilder().add_certificate(intermediate, root, hashes.SHA1()).build().public_bytes(serialization.Encoding.DER)
    encoded = urllib.parse.quote(base64.b64encode(request).decode(), safe="")
    answer = subprocess.run(["curl", "-sS", "--fail", "-o", "-", f"https://ocsp.apple.com/ocsp03-storekeeper-rootg3/{encoded}"],
                            env=proxy_environment(emulator, tls_root), capture_output=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    response = ocsp.load_der_ocsp_response(answer.stdout)
    assert response.response_status == ocsp.OCSPResponseStatus.SUCCESSFUL and response.certificate_status == ocsp.OCSPCertStatus.GOOD
    assert response.serial_number == intermediate.serial_number
    # Not Base64: a clear 400, not a crash.
    status, _ = emulator.request("GET", "/ocsp/%25%25not-base64")
    assert status == 400


def test_inapppy_and_itunes_iap_with_their_built_in_urls(emulator, tls_root):
    emulator.cli("appstore", "tester", "add", "proxy-customer@example.com", "--production")
    production = emulator.buy("com.example.football", "GoldenGlobe", account="proxy-customer@example.com")
    sandbox = emulator.buy("com.example.football", "ProtectiveGloves", account=new_tester(emulator))
    result = run_client(emulator, tls_root, """
        import itunesiap
        from inapppy import AppStoreValidator
        validator = AppStoreValidator(sandbox=False, auto_retry_wrong_env_request=True)
        out = {"inapppy": [validator.validate(given[name])["receipt"]["in_app"][0]["product_id"] for name in ("production", "sandbox")]}
        out["itunes"] = [itunesiap.verify(given[name], env=itunesiap.env.review).receipt.in_app[0].product_id for name in ("production", "sandbox")]
        print(json.dumps(out))
    """, production=production["receipt"], sandbox=sandbox["receipt"])
    assert result == {"inapppy": ["GoldenGlobe", "ProtectiveGloves"], "itunes": ["GoldenGlobe", "ProtectiveGloves"]}


def test_curl_through_https_proxy_only(emulator, tls_root):
    bought = emulator.buy("com.example.coins", "Nada.JPYF03", account=new_tester(emulator))
    answer = subprocess.run(["curl", "-sS", "--fail", "-X", "POST", "https://sandbox.itunes.apple.com/verifyReceipt",
                             "-d", json.dumps({"receipt-data": bought["receipt"]})],
                            env=proxy_environment(emulator, tls_root), capture_output=True, text=True, timeout=60)
    assert answer.returncode == 0, answer.stderr
    body = json.loads(answer.stdout)
    assert body["status"] == 0 and body["environment"] == "Sandbox"
    assert body["receipt"]["in_app"][0]["transaction_id"] == bought["transaction_id"]
    # buy.itunes.apple.com is production: the sandbox receipt gets Apple's 21007 there.
    answer = subprocess.run(["curl", "-sS", "-X", "POST", "https://buy.itunes.apple.com/verifyReceipt", "-d", json.dumps({"receipt-data": bought["receipt"]})],
                            env=proxy_environment(emulator, tls_root), capture_output=True, text=True, timeout=60)
    assert json.loads(answer.stdout)["status"] == 21007


def test_the_proxy_is_not_open_and_admin_stays_on_loopback_names(emulator, tls_root):
    env = proxy_environment(emulator, tls_root)
    for url in ["https://example.com/", "https://api.storekit.apple.com:8443/", "https://127.0.0.1/admin/v1/apps"]:
        answer = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_connect}", url], env=env, capture_output=True, text=True, timeout=30)
        assert answer.returncode != 0 and answer.stdout == "403", (url, answer.stdout, answer.stderr)
    # Through a tunnel the Host is Apple's: the admin API refuses it (as any non-loopback name without the token)
    # and the device API is not served there.
    for path, status in [("/admin/v1/apps", "403"), ("/admin/v1/ca/revocations", "403"), ("/v1/devices", "404"), ("/health", "404")]:
        answer = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", "https://api.storekit.apple.com" + path],
                                env=env, capture_output=True, text=True, timeout=30)
        assert answer.stdout == status, (path, answer.stdout, answer.stderr)
    # Naming a loopback host (or none) inside the tunnel does not reach the admin API either: 421.
    for host_header in [["-H", "Host: 127.0.0.1"], ["--http1.0", "-H", "Host:"]]:
        answer = subprocess.run(["curl", "-sS", "-o", "/dev/null", "-w", "%{http_code}", *host_header, "https://buy.itunes.apple.com/admin/v1/apps"],
                                env=env, capture_output=True, text=True, timeout=30)
        assert answer.stdout == "421", (host_header, answer.stdout, answer.stderr)


def test_tls_straight_to_the_port_as_a_hosts_entry_would_and_sni_is_checked(emulator, tls_root):
    port = int(emulator.url.rsplit(":", 1)[1])
    answer = subprocess.run(["curl", "-sS", "--cacert", str(tls_root), "--connect-to", f"buy.itunes.apple.com:443:127.0.0.1:{port}",
                             "-X", "POST", "https://buy.itunes.apple.com/verifyReceipt", "-d", "{}"], capture_output=True, text=True, timeout=30)
    assert json.loads(answer.stdout) == {"environment": "Production", "status": 21002} or json.loads(answer.stdout)["status"] == 21002
    context = ssl.create_default_context(cafile=str(tls_root))
    with socket.create_connection(("127.0.0.1", port), timeout=10) as raw:
        with pytest.raises(ssl.SSLError):
            with context.wrap_socket(raw, server_hostname="www.example.com"):
                pass
    # Plain HTTP on the same port is untouched.
    assert emulator.request("GET", "/health")[0] == 200
