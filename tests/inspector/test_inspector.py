"""The context inspector in a real browser: Debian's chromium, headless,
driven by Selenium through chromedriver, against a daemon started here with
``--inspector``.

A session is driven through a burst of tool output that compacts it; the
session's page must show GetContext's numbers in its window bar; a new
compaction's marker must appear on the open page without a reload, and the
window's numbers follow it; a span holding a ``<script>`` element shows as
text and runs nothing; an unknown session is a 404 page. Screenshots go to
``$CTXBROKER_SCREENSHOTS`` (``target/inspector/screenshots`` by default;
``docs/img`` refreshes the README's).

Run by ``.ci/inspector.sh``, which installs what it needs.
"""

from __future__ import annotations

import os
import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from ctxbroker_client import Broker, LocalDaemon, find_binary, pb, tool, user
from selenium import webdriver
from selenium.webdriver.chrome.options import Options
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
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


@pytest.fixture(scope="module")
def daemon() -> Iterator[tuple[LocalDaemon, str]]:
    local = LocalDaemon(find_binary(REPO), args=["--metrics-addr", "127.0.0.1:0", "--inspector"])
    local.start()
    try:
        found = None
        deadline = time.monotonic() + 30
        while found is None and time.monotonic() < deadline:
            log = local.log_path.read_text(errors="replace")
            found = re.search(r"inspector served at (http://127\.0\.0\.1:\d+)/inspect", log)
            if found is None:
                time.sleep(0.05)
        assert found, f"the daemon did not say where the inspector is:\n{local.log_tail()}"
        yield local, found.group(1)
    finally:
        local.close()


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
    return driver.find_element(By.ID, element_id).text.strip()


def class_tokens(driver: WebDriver, name: str) -> int:
    row = driver.find_element(By.CSS_SELECTOR, f'#window-numbers tr[data-class="{name}"]')
    return int(row.find_element(By.CSS_SELECTOR, '[data-field="tokens"]').text)


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
    compacted = []
    step = 0
    while len(compacted) < 2:
        step += 1
        admission = broker.admit(SESSION, [tool(tool_output(step, 24))])
        if admission.compaction is not None:
            compacted.append(admission.compaction.seq)
        assert step < 40, "the burst never compacted"
    context = broker.get_context(SESSION)
    totals = context.totals
    assert any(s.span_class == pb.SPAN_CLASS_CONSTRAINT for s in context.spans)

    # The list, then the session's page by its link.
    browser.get(f"{base}/inspect")
    assert browser.title.startswith("Sessions")
    shot(browser, "inspector-sessions", height=520)
    browser.find_element(By.LINK_TEXT, SESSION).click()
    WebDriverWait(browser, 10).until(lambda d: d.find_elements(By.ID, "window-bar"))

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
    new_seq = None
    while new_seq is None:
        step += 1
        admission = broker.admit(SESSION, [tool(tool_output(step, 24))])
        if admission.compaction is not None:
            new_seq = admission.compaction.seq
        assert step < 80, "no further compaction"
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
