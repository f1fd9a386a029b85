"""The context inspector in a real browser: Debian's chromium, headless,
driven by Selenium through chromedriver, against a daemon started here with
``--inspector``.

A session is driven through a burst of tool output that compacts it; the
session's page must show GetContext's numbers in its window bar; a new
compaction's marker must appear on the open page without a reload, and the
window's numbers follow it; a span holding a ``<script>`` element shows as
text and runs nothing; an unknown session is a 404 page; the keyboard
reaches the skip link first. With a token file, the login form refuses a
wrong token, a watcher's token sees its tenant's session only (another
tenant's is a 404), its cookie is hidden from scripts, the live events
reach the page with it, and logging out forgets it. Screenshots go to
``$CTXBROKER_SCREENSHOTS`` (``target/inspector/screenshots`` by default;
``docs/img`` refreshes the README's).

Run by ``.ci/inspector.sh``, which installs what it needs.
"""

from __future__ import annotations

import os
import re
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctxbroker_client import Broker, LocalDaemon, find_binary, pb, tool, user
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.common.keys import Keys
from selenium.webdriver.remote.webdriver import WebDriver
from selenium.webdriver.support.ui import WebDriverWait

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = os.environ.get("CTXBROKER_CHROMIUM", "/usr/bin/chromium")
CHROMEDRIVER = os.environ.get("CTXBROKER_CHROMEDRIVER", "/usr/bin/chromedriver")
SHOTS = Path(os.environ.get("CTXBROKER_SCREENSHOTS", REPO / "target" / "inspector" / "screenshots"))

SESSION = "checkout-agent"
CONSTRAINT = "Never write to the `prod` namespace; deploy to staging only."
INJECTED = "notes from the page <script>window.__injected = 1</script> end of notes"


def tool_output(step: int, lines: int) -> str:
    """A tool's log: about 30 tokens a line."""
    return "\n".join(
        f"step {step}.{n}: GET /api/v1/orders/{step * 1000 + n} 200 OK in {n % 17 + 3} ms, "
        f"cache {'hit' if n % 3 else 'miss'}, shard s{n % 4}"
        for n in range(lines)
    )


def inspector_daemon(*args: str) -> tuple[LocalDaemon, str]:
    """A daemon with the inspector on, started, and the inspector's base
    URL as its log says."""
    local = LocalDaemon(
        find_binary(REPO), args=["--metrics-addr", "127.0.0.1:0", "--inspector", *args]
    )
    local.start()
    found = None
    deadline = time.monotonic() + 30
    while found is None and time.monotonic() < deadline:
        log = local.log_path.read_text(errors="replace")
        found = re.search(r"inspector served at (http://127\.0\.0\.1:\d+)/inspect", log)
        if found is None:
            time.sleep(0.05)
    if found is None:
        tail = local.log_tail()
        local.close()
        raise AssertionError(f"the daemon did not say where the inspector is:\n{tail}")
    return local, found.group(1)


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[LocalDaemon, str]]:
    local, base = inspector_daemon()
    try:
        yield local, base
    finally:
        local.close()


def new_token(role: str, token_id: str, tenant: str | None) -> tuple[str, str]:
    """``ctxbrokerd token new``: the token and its token file entry."""
    args = [str(find_binary(REPO)), "token", "new", "--id", token_id, "--role", role]
    if tenant:
        args += ["--tenant", tenant]
    made = subprocess.run(args, capture_output=True, text=True, check=True)
    return made.stdout.strip(), made.stderr


def compact_once(broker: Broker, session: str, step: int) -> tuple[int, int]:
    """Admits tool output until an admission compacts; returns the
    compaction's seq and the step reached."""
    while True:
        step += 1
        admission = broker.admit(session, [tool(tool_output(step, 24))])
        if admission.compaction is not None:
            return admission.compaction.seq, step
        assert step < 200, "no compaction"


@pytest.fixture(scope="module")
def browser() -> Iterator[WebDriver]:
    options = Options()
    options.binary_location = CHROMIUM
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--window-size=1280,1800",
        "--hide-scrollbars",
    ):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def shot(driver: WebDriver, name: str, height: int | None = None) -> None:
    """Saves the page as ``name``.png, the whole page's height when
    ``height`` is None."""
    SHOTS.mkdir(parents=True, exist_ok=True)
    full = driver.execute_script("return document.documentElement.scrollHeight")
    driver.set_window_size(1280, height or max(900, min(int(full), 4000)))
    driver.save_screenshot(str(SHOTS / f"{name}.png"))
    driver.set_window_size(1280, 1800)


def text(driver: WebDriver, element_id: str) -> str:
    """The element's visible text, or "" while the page has none by that id.

    Read in one script so a page replaced between finding the element and
    reading it (a form's answer, a live update) cannot leave a dangling node.
    """
    found = driver.execute_script(
        "const e = document.getElementById(arguments[0]); return e ? e.innerText : null;",
        element_id,
    )
    return found.strip() if isinstance(found, str) else ""


def class_tokens(driver: WebDriver, name: str) -> int:
    cell = driver.execute_script(
        "const c = document.querySelector(arguments[0]); return c ? c.innerText : null;",
        f'#window-numbers tr[data-class="{name}"] [data-field="tokens"]',
    )
    assert isinstance(cell, str), f"no token count for class {name}"
    return int(cell)


def test_the_window_the_live_markers_and_bad_input(
    daemon: tuple[LocalDaemon, str], browser: WebDriver
) -> None:
    local, base = daemon
    broker = Broker(local.address)
    broker.create_session(SESSION, window_tokens=3000, soft_watermark=1.0)
    broker.admit(SESSION, [user(CONSTRAINT)])
    broker.admit(SESSION, [user(INJECTED)])
    broker.create_session("research-agent", window_tokens=8000)
    broker.admit("research-agent", [user("Summarise the three papers on retrieval.")])
    # A burst: tool output until an admission compacts.
    first, step = compact_once(broker, SESSION, 0)
    second, step = compact_once(broker, SESSION, step)
    compacted = [first, second]
    context = broker.get_context(SESSION)
    totals = context.totals
    assert any(s.span_class == pb.SPAN_CLASS_CONSTRAINT for s in context.spans)

    # The list, then the session's page by its link.
    browser.get(f"{base}/inspect")
    assert browser.title.startswith("Sessions")
    shot(browser, "inspector-sessions", height=520)
    browser.find_element(By.LINK_TEXT, SESSION).click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "window-bar"))

    # The keyboard reaches the skip link first, and it leads to the content.
    browser.find_element(By.TAG_NAME, "body").send_keys(Keys.TAB)
    focused = browser.switch_to.active_element
    assert focused.get_attribute("class") == "skip"
    assert focused.get_attribute("href").endswith("#main")

    # The window bar's numbers are GetContext's.
    assert int(text(browser, "live-tokens")) == totals.live_tokens
    assert int(text(browser, "budget-tokens")) == totals.budget_tokens
    assert int(text(browser, "window-tokens")) == totals.window_tokens
    assert int(text(browser, "soft-watermark-tokens")) == totals.soft_watermark_tokens
    assert class_tokens(browser, "constraint") == totals.pinned_tokens
    bar = browser.find_element(By.ID, "window-bar")
    assert str(totals.live_tokens) in (bar.get_attribute("aria-label") or "")
    for seq in compacted:
        assert browser.find_elements(By.ID, f"marker-{seq}"), f"marker {seq} is listed"

    # The span that holds a script shows it as text, and nothing ran.
    assert browser.execute_script("return window.__injected") is None
    assert (
        "<script>window.__injected = 1</script>" in browser.find_element(By.ID, "live-spans").text
    )

    # Live: a new compaction's marker joins the open page.
    WebDriverWait(browser, 20).until(
        lambda d: "on" in (d.find_element(By.ID, "live-status").get_attribute("class") or "")
    )
    browser.execute_script("window.__sentinel = 'same page'")
    new_seq, step = compact_once(broker, SESSION, step)
    WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, f"marker-{new_seq}"))
    assert browser.execute_script("return window.__sentinel") == "same page", "no reload"
    after = broker.get_context(SESSION).totals
    WebDriverWait(browser, 20).until(lambda d: text(d, "live-tokens") == str(after.live_tokens))
    newest = browser.find_elements(By.CSS_SELECTOR, "#markers tbody tr.marker")[0]
    assert newest.get_attribute("id") == f"marker-{new_seq}"
    browser.execute_script("window.scrollTo(0, 0)")
    shot(browser, "inspector-session")

    # The archive of the first evicted turn, and a span whole.
    browser.get(f"{base}/inspect/archive?id={SESSION}")
    assert browser.find_elements(By.CSS_SELECTOR, "#archived tbody tr"), "spans were archived"

    # An unknown session: a 404 page, not an error.
    browser.get(f"{base}/inspect/session?id=no-such-session")
    assert browser.find_element(By.TAG_NAME, "h1").text.startswith("404")
    assert "no-such-session" in text(browser, "problem")
    broker.close()


def test_a_tenants_token_logs_in_sees_its_own_and_follows_live(browser: WebDriver) -> None:
    watcher, watcher_entry = new_token("watcher", "dash", "acme")
    agent, agent_entry = new_token("agent", "bot", "acme")
    other, other_entry = new_token("agent", "rival", "globex")
    with tempfile.TemporaryDirectory(prefix="ctxbroker-tokens-") as tmp:
        tokens = Path(tmp) / "tokens.toml"
        tokens.write_text(watcher_entry + agent_entry + other_entry)
        local, base = inspector_daemon("--auth-tokens-file", str(tokens))
        try:
            acme = Broker(local.address, token=agent)
            globex = Broker(local.address, token=other)
            acme.create_session("orders", window_tokens=3000, soft_watermark=1.0)
            acme.admit("orders", [user(CONSTRAINT)])
            globex.create_session("secret-plans", window_tokens=3000)
            _, step = compact_once(acme, "orders", 0)

            # Not logged in: the login form, and no session named.
            browser.delete_all_cookies()
            browser.get(f"{base}/inspect")
            assert browser.find_element(By.TAG_NAME, "h1").text == "Log in"
            assert "secret-plans" not in browser.page_source
            # A wrong token is refused on the form.
            browser.find_element(By.ID, "token").send_keys("not-a-token")
            browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
            # The form's answer replaces the page, whose own #problem said
            # that no credentials were sent: wait for the new one.
            WebDriverWait(browser, 10).until(lambda d: "unknown token" in text(d, "problem"))
            # The watcher's token: its tenant's session, by its bare id.
            browser.find_element(By.ID, "token").send_keys(watcher)
            browser.find_element(By.CSS_SELECTOR, "form button[type=submit]").click()
            WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "sessions"))
            listed = [a.text for a in browser.find_elements(By.CSS_SELECTOR, "#sessions th a")]
            assert listed == ["orders"]
            cookie = browser.get_cookie("ctxbroker_token")
            assert cookie is not None and cookie["httpOnly"] and cookie["sameSite"] == "Strict"
            assert browser.execute_script("return document.cookie") == "", "hidden from scripts"
            # Another tenant's session is not found, by any name.
            browser.get(f"{base}/inspect/session?id=secret-plans")
            assert browser.find_element(By.TAG_NAME, "h1").text.startswith("404")

            # The live events carry the cookie too: a new marker arrives.
            browser.get(f"{base}/inspect/session?id=orders")
            WebDriverWait(browser, 20).until(
                lambda d: (
                    "on" in (d.find_element(By.ID, "live-status").get_attribute("class") or "")
                )
            )
            seq, _ = compact_once(acme, "orders", step)
            WebDriverWait(browser, 20).until(lambda d: d.find_elements(By.ID, f"marker-{seq}"))
            live = acme.get_context("orders").totals.live_tokens
            WebDriverWait(browser, 20).until(lambda d: text(d, "live-tokens") == str(live))

            # Logging out forgets the token.
            browser.find_element(By.CSS_SELECTOR, "form.logout button").click()
            WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "token"))
            assert browser.get_cookie("ctxbroker_token") is None
            acme.close()
            globex.close()
        finally:
            local.close()
