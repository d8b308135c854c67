"""The console in a real browser: Debian's Chromium driven by Playwright. Operators sign in, every page renders
and passes an accessibility check (axe: no serious or critical violation), each action changes what the API then
reports, and the refusals hold: a wrong password, a form without its CSRF token, a role that may not open a page.
Screenshots of every page are written under Tests/acceptance/artifacts/console/."""
import json
import os
import pathlib
import re
import shutil
import tempfile
import time
import urllib.parse
import uuid

import pytest
from axe_playwright_python.sync_playwright import Axe
from playwright.sync_api import sync_playwright

from server_support import ROOT, Server, emulator_buy

ARTIFACTS = pathlib.Path(ROOT) / "Tests" / "acceptance" / "artifacts" / "console"
CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"
APP = "com.example.magazine"
PASSWORD = "correct horse battery staple"


@pytest.fixture(scope="module")
def console(emulator):
    """A server with the magazine app, a subscriber, and one operator per role (each with a password)."""
    with tempfile.TemporaryDirectory() as data:
        server = Server(emulator, data, extra=["--max-age", "2"])
        try:
            key = server.setup_app(APP)
            receipt = buy(emulator, "console")
            assert server.upload(key, "alice", receipt)["state"] == "verified"
            for name, role in (("admin", "admin"), ("support", "support"), ("finance", "finance"), ("developer", "developer"), ("locked", "finance")):
                added = subprocess_cli(server, ["server", "operator", "add", f"{name}@example.com", "--role", role, "--password-stdin"], PASSWORD)
                assert "/console/login/link?token=" in added
            server.key = key
            yield server
        finally:
            server.stop()


def buy(emulator, name):
    """A monthly subscription bought by a new tester; its receipt."""
    tester = f"{name}-{uuid.uuid4().hex[:8]}@example.com"
    emulator.cli("appstore", "tester", "add", tester)
    return emulator_buy(emulator, APP, "com.example.magazine.monthly", tester)["receipt"]


def subprocess_cli(server, args, stdin):
    import subprocess
    from server_support import BIN
    result = subprocess.run([BIN, *args, "--url", server.url, "--admin-key", server.admin_key], cwd=ROOT, input=stdin + "\n",
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return result.stdout


@pytest.fixture(scope="module")
def browser():
    assert os.path.exists(CHROMIUM), "Debian's chromium is needed (make deps installs it)"
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox", "--disable-gpu"])
        yield browser
        browser.close()


def signed_in(browser, server, role, viewport=None):
    context = browser.new_context(viewport=viewport or {"width": 1280, "height": 900})
    page = context.new_page()
    page.goto(server.url + "/console/login")
    page.get_by_label("Email").fill(f"{role}@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    page.get_by_role("button", name="Sign in").click()
    page.wait_for_url(re.compile(r".*/console(\?.*)?$"))
    return context, page


def shoot(page, name):
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / f"{name}.png"), full_page=True)


def accessible(page, name):
    """axe on the page: the serious and critical violations (written beside the screenshots)."""
    results = Axe().run(page)
    violations = [v for v in results.response["violations"] if v["impact"] in ("serious", "critical")]
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    (ARTIFACTS / f"{name}.axe.json").write_text(json.dumps(results.response["violations"], indent=1))
    return [(v["id"], v["impact"], [node["target"] for node in v["nodes"]][:3]) for v in violations]


PAGES = [("overview", "/console", "Overview"), ("customers", "/console/customers?app=" + APP + "&query=alice", "Customers"),
         ("customer", f"/console/customers/{APP}/alice", "Customer alice"), ("transactions", "/console/transactions", "Transactions"),
         ("metrics", "/console/metrics?interval=day", "Metrics"), ("jobs", "/console/jobs", "Verification jobs"),
         ("webhooks", "/console/webhooks", "Webhooks"), ("settings", "/console/settings", "Settings"), ("operators", "/console/operators", "Operators")]


def test_every_page_renders_for_an_admin_and_passes_axe(console, browser):
    context, page = signed_in(browser, console, "admin")
    problems = {}
    for name, path, heading in PAGES:
        response = page.goto(console.url + path)
        assert response.status == 200, (path, response.status)
        assert page.get_by_role("heading", level=1).inner_text() == heading
        assert "script-src 'self'" in response.headers["content-security-policy"]
        shoot(page, name)
        found = accessible(page, name)
        if found:
            problems[name] = found
    # A phone's width: the overview still fits (no sideways scrolling of the page itself).
    page.set_viewport_size({"width": 320, "height": 800})
    page.goto(console.url + "/console")
    assert page.evaluate("document.documentElement.scrollWidth") <= 320
    shoot(page, "overview-phone")
    found = accessible(page, "overview-phone")
    if found:
        problems["overview-phone"] = found
    context.close()
    assert not problems, problems


def test_a_wrong_password_is_refused_and_then_throttled(console, browser):
    context = browser.new_context()
    page = context.new_page()
    for attempt in range(5):
        page.goto(console.url + "/console/login")
        page.get_by_label("Email").fill("locked@example.com")
        page.get_by_label("Password").fill("not the password")
        with page.expect_response(lambda r: r.url.endswith("/console/login") and r.request.method == "POST") as answer:
            page.get_by_role("button", name="Sign in").click()
        assert answer.value.status == 401
        assert "wrong" in page.get_by_role("alert").inner_text()
    # The sixth try is refused before any password is checked, even the right one.
    page.goto(console.url + "/console/login")
    page.get_by_label("Email").fill("locked@example.com")
    page.get_by_label("Password").fill(PASSWORD)
    with page.expect_response(lambda r: r.url.endswith("/console/login") and r.request.method == "POST") as answer:
        page.get_by_role("button", name="Sign in").click()
    assert answer.value.status == 429
    # Without a session every page sends you to sign in.
    page.goto(console.url + "/console/customers")
    assert page.url.endswith("/console/login")
    context.close()


def test_grant_and_revoke_a_promotional_entitlement_change_the_user_view(console, browser):
    context, page = signed_in(browser, console, "support")
    page.goto(console.url + "/console/customers?app=" + APP)
    page.get_by_label(re.compile("App user id")).fill("bob")
    page.get_by_role("button", name="Search").click()
    assert "no customer found" in page.content()
    page.goto(f"{console.url}/console/customers/{APP}/bob")
    page.get_by_label("Days").fill("7")
    page.locator("#f-grant-reason").fill("goodwill after an outage")
    page.get_by_role("button", name="Grant").click()
    assert "Granted magazine for 7 days" in page.get_by_role("status").inner_text()
    shoot(page, "customer-after-grant")
    view = console.user(console.key, "bob")
    granted = [e for e in view["entitlements"] if e["id"] == "magazine"]
    assert granted and granted[0]["source"] == "promotional" and granted[0]["active"], view
    # The timeline names the operator who did it.
    status, timeline = console.request("GET", f"/admin/v1/apps/{APP}/users/bob/timeline", key=console.admin_key)
    audited = [json.loads(item["detail"]["detail"]) for item in timeline["items"] if item["kind"] == "audit"]
    assert status == 200 and any(entry.get("operator") == "support@example.com" and entry.get("reason") == "goodwill after an outage"
                                 for entry in audited), timeline

    page.locator("#f-reason-magazine").fill("granted by mistake")
    page.get_by_role("button", name="Revoke").click()
    assert "Revoked magazine" in page.get_by_role("status").inner_text()
    view = console.user(console.key, "bob")
    assert not any(e["id"] == "magazine" and e["active"] for e in view["entitlements"]), view
    context.close()


def test_a_form_without_its_csrf_token_is_refused(console, browser):
    context, page = signed_in(browser, console, "support")
    answer = page.request.post(f"{console.url}/console/customers/{APP}/carol/grant",
                               form={"entitlement": "magazine", "durationDays": "30", "reason": "forged"}, max_redirects=0)
    assert answer.status == 403
    view = console.user(console.key, "carol")
    assert not any(e["id"] == "magazine" for e in view["entitlements"]), view
    # The same form with the token goes through: the refusal was the token, not the form.
    token = page.goto(f"{console.url}/console/customers/{APP}/carol") and page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(f"{console.url}/console/customers/{APP}/carol/grant",
                               form={"csrf": token, "entitlement": "magazine", "durationDays": "30", "reason": "real"}, max_redirects=0)
    assert answer.status == 303
    assert any(e["id"] == "magazine" and e["active"] for e in console.user(console.key, "carol")["entitlements"])
    context.close()


def test_roles_limit_what_each_operator_sees(console, browser):
    context, page = signed_in(browser, console, "support")
    response = page.goto(console.url + "/console/settings")
    assert response.status == 403
    assert "for admin, developer" in page.content()
    nav = page.get_by_role("navigation", name="Console").inner_text()
    assert "Customers" in nav and "Settings" not in nav and "Metrics" not in nav
    context.close()
    context, page = signed_in(browser, console, "finance")
    assert page.goto(console.url + "/console/metrics").status == 200
    assert page.goto(f"{console.url}/console/customers/{APP}/alice").status == 403
    # A forged POST to a page the role may not use is refused too, token or not.
    token = page.goto(console.url + "/console") and page.locator("input[name=csrf]").first.get_attribute("value")
    answer = page.request.post(f"{console.url}/console/customers/{APP}/alice/delete", form={"csrf": token, "confirm": "yes"}, max_redirects=0)
    assert answer.status == 403
    assert console.user(console.key, "alice")["entitlements"], "alice still owns her subscription"
    context.close()


def test_replaying_a_dead_verification_settles_it(console, browser, emulator):
    receipt = buy(emulator, "replay")
    emulator.cli("appstore", "fault", "add", "--endpoint", "verifyReceipt", "--http", "503", "--for", "60s")
    try:
        job = console.upload(console.key, "dora", receipt, wait=0)
        deadline = time.time() + 60
        while time.time() < deadline:
            status, body = console.request("GET", f"/v1/verifications/{job['verificationId']}?wait=2", key=console.key)
            if body["state"] == "dead":
                break
        assert body["state"] == "dead", body
    finally:
        emulator.cli("appstore", "fault", "clear")
    context, page = signed_in(browser, console, "developer")
    page.goto(console.url + "/console/jobs?state=dead")
    shoot(page, "jobs-dead")
    row = page.get_by_role("row").filter(has_text=job["verificationId"])
    row.get_by_role("button", name="Replay").click()
    assert "Replayed 1 job" in page.get_by_role("status").inner_text()
    settled = console.wait_for(console.key, job["verificationId"])
    assert settled["state"] == "verified", settled
    assert any(e["id"] == "magazine" and e["active"] for e in console.user(console.key, "dora")["entitlements"])
    context.close()


def test_metrics_and_transactions_show_the_ledger(console, browser):
    context, page = signed_in(browser, console, "finance")
    page.goto(console.url + "/console/metrics?interval=day")
    assert page.locator("svg[role=img]").count() >= 5
    table = page.get_by_role("table").filter(has_text="Active subscriptions").first
    assert table.count() == 1
    status, figures = console.request("GET", f"/admin/v1/apps/{APP}/metrics?interval=day", key=console.admin_key)
    # Subscriptions started, not active now: the sandbox's trials last three minutes of real time, fewer than a slow run may take.
    assert status == 200 and sum(figure["trialsStarted"] + figure["newSubscriptions"] for figure in figures) >= 1, figures
    page.goto(console.url + "/console/transactions")
    assert page.get_by_role("cell", name="com.example.magazine.monthly").count() >= 1
    with page.expect_download() as download:
        page.get_by_role("link", name="Export these as CSV").click()
    text = pathlib.Path(download.value.path()).read_text()
    assert text.startswith("purchase_date,transaction_id") and "alice" in text
    # Every transaction the admin API lists, once each (every cell is quoted).
    import csv, io
    exported = [row["transaction_id"] for row in csv.DictReader(io.StringIO(text))]
    status, rows = console.request("GET", f"/admin/v1/transactions?app={APP}&limit=1000", key=console.admin_key)
    assert status == 200 and sorted(exported) == sorted(row["transaction_id"] for row in rows), (exported, rows)
    context.close()


def test_an_admin_adds_an_operator_whose_link_signs_in_once(console, browser):
    context, page = signed_in(browser, console, "admin")
    page.goto(console.url + "/console/operators")
    page.get_by_label("Email").fill("newcomer@example.com")
    page.get_by_label("Role").select_option("finance")
    page.get_by_role("button", name="Add and make a login link").click()
    link = re.search(r"https?://\S+/console/login/link\?token=[0-9a-f]{64}", page.get_by_role("status").inner_text()).group(0)
    context.close()
    fresh = browser.new_context()
    page = fresh.new_page()
    page.goto(link)
    page.get_by_role("button", name="Sign in").click()
    assert page.url.endswith("/console/password")
    assert "newcomer@example.com (finance)" in page.content()
    # The link is used up.
    other = browser.new_context().new_page()
    other.goto(link)
    with other.expect_response(lambda r: r.request.method == "POST") as answer:
        other.get_by_role("button", name="Sign in").click()
    assert answer.value.status == 401
    fresh.close()


def test_the_emulator_page_drives_the_app_store_under_up(browser, tmp_path):
    """Under `storekeeper up`: the first admin's link from the first output line signs in; the Emulator page moves
    the clock, adds and clears a fault, adds a tester and buys as that tester, and the emulator and the server
    then say so through their APIs."""
    import subprocess
    import urllib.request
    from server_support import BIN
    process = subprocess.Popen([BIN, "up", "--data", str(tmp_path), "--appstore-port", "0", "--server-port", "0", "--quiet"],
                               cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        summary = json.loads(process.stdout.readline())
        keys = {app["bundleId"]: app["apiKey"] for app in summary["apps"]}

        def appstore(path):
            with urllib.request.urlopen(summary["appstore"] + path, timeout=30) as response:
                return json.loads(response.read())

        context = browser.new_context()
        page = context.new_page()
        page.goto(summary["consoleLoginLink"])
        page.get_by_role("button", name="Sign in").click()
        page.goto(summary["console"] + "/emulator?app=" + APP)
        shoot(page, "emulator")
        assert not accessible(page, "emulator")

        before = int(appstore("/admin/v1/time")["now_ms"])
        page.get_by_label("Advance by").select_option("86400")
        page.get_by_role("button", name="Advance").click()
        assert "The time is now" in page.get_by_role("status").inner_text()
        assert int(appstore("/admin/v1/time")["now_ms"]) - before >= 86_400_000

        page.get_by_label("Fault").select_option("http-503")
        page.get_by_role("button", name="Add fault").click()
        assert [f for f in appstore("/admin/v1/faults") if f["endpoint"] == "verifyReceipt"], "the fault is in force"
        # And the App Store answers with it.
        import urllib.error
        try:
            urllib.request.urlopen(urllib.request.Request(summary["appstore"] + "/sandbox/verifyReceipt", data=b'{"receipt-data": "x"}'), timeout=30)
            raise AssertionError("verifyReceipt answered normally")
        except urllib.error.HTTPError as error:
            assert error.code == 503
        page.get_by_role("button", name="Clear every fault").click()
        assert appstore("/admin/v1/faults") == []

        page.get_by_label("Tester email").fill("clicker@example.com")
        page.get_by_role("button", name="Add tester").click()
        page.goto(summary["console"] + "/emulator?app=" + APP)
        page.get_by_label("Product").select_option("com.example.magazine.monthly")
        page.get_by_label("Tester", exact=True).select_option("clicker@example.com")
        page.get_by_label("App user id").fill("erin")
        page.get_by_role("button", name="Buy and upload").click()
        assert "is verified" in page.get_by_role("status").inner_text()
        request = urllib.request.Request(summary["server"] + "/v1/users/erin", headers={"Authorization": "Bearer " + keys[APP]})
        with urllib.request.urlopen(request, timeout=30) as response:
            view = json.loads(response.read())
        assert any(e["id"] == "magazine" and e["active"] for e in view["entitlements"]), view
        context.close()
    finally:
        process.terminate()
        process.wait(timeout=30)


def test_settings_and_webhooks_change_what_the_api_reports(console, browser):
    context, page = signed_in(browser, console, "developer")
    page.goto(console.url + "/console/settings?app=" + APP)
    page.get_by_label("Product id").fill("com.example.magazine.weekpass")
    page.get_by_label("Type").select_option("non-renewing")
    page.get_by_label("Entitlement").fill("magazine")
    page.get_by_label("Days (non-renewing)").fill("7")
    page.get_by_label("Price", exact=True).fill("1.99")
    page.get_by_label("Price currency").fill("USD")
    page.get_by_role("button", name="Save product").click()
    assert "is saved" in page.get_by_role("status").inner_text()
    status, products = console.request("GET", f"/admin/v1/apps/{APP}/products", key=console.admin_key)
    saved = [p for p in products if p["productId"] == "com.example.magazine.weekpass"]
    assert saved and saved[0]["durationDays"] == 7 and saved[0]["price"] == "1.99", products
    # A hostile price is refused with the reason, and nothing changes.
    page.get_by_label("Product id").fill("com.example.magazine.weekpass")
    page.get_by_label("Type").select_option("non-renewing")
    page.get_by_label("Price", exact=True).fill("1e40")
    page.get_by_role("button", name="Save product").click()
    assert "at most 6 decimals" in page.get_by_role("alert").inner_text()
    status, products = console.request("GET", f"/admin/v1/apps/{APP}/products", key=console.admin_key)
    assert [p for p in products if p["productId"] == "com.example.magazine.weekpass"][0]["price"] == "1.99"

    # Rotating a key shows the new one once; the old one keeps working for the grace hour.
    page.get_by_role("button", name=re.compile("Rotate")).first.click()
    new_key = re.search(r"sk_[0-9a-f]{64}", page.get_by_role("status").inner_text()).group(0)
    assert console.user(new_key, "alice")["entitlements"]
    assert console.user(console.key, "alice")["entitlements"]

    page.goto(console.url + "/console/webhooks?app=" + APP)
    page.get_by_label("Endpoint URL").fill("http://127.0.0.1:9/hooks")
    page.get_by_role("button", name="Add endpoint").click()
    assert re.search(r"whsec_\S+", page.get_by_role("status").inner_text())
    status, endpoints = console.request("GET", f"/admin/v1/apps/{APP}/webhooks", key=console.admin_key)
    assert any(e["url"] == "http://127.0.0.1:9/hooks" for e in endpoints), endpoints
    shoot(page, "webhooks-after-add")
    context.close()
    # With an endpoint, a change to a customer is an event on their timeline, and support can send it again.
    context, page = signed_in(browser, console, "support")
    page.goto(f"{console.url}/console/customers/{APP}/frank")
    page.get_by_label("Days").fill("3")
    page.locator("#f-grant-reason").fill("webhook check")
    page.get_by_role("button", name="Grant").click()
    page.goto(f"{console.url}/console/customers/{APP}/frank")
    page.get_by_role("row").filter(has_text="ENTITLEMENT_GRANTED").get_by_role("button", name="Redeliver").click()
    assert "queued again for 1 endpoint" in page.get_by_role("status").inner_text()
    context.close()
