"""A real headless Chromium (Debian's chromium + chromium-driver, driven by Selenium) for the report's
tests, and a `bprof report --serve` subprocess to point it at. Skips with the reason when the browser
is not installed (.ci/run installs it)."""

from __future__ import annotations

import json
import shutil
import socket
import subprocess
import sys
import time
from contextlib import contextmanager
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def chromium_paths() -> tuple[str, str]:
    browser = shutil.which("chromium") or shutil.which("chromium-browser")
    driver = shutil.which("chromedriver")
    if not browser or not driver:
        pytest.skip("no headless browser: install Debian's chromium and chromium-driver (.ci/run does)")
    return browser, driver


def new_driver():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    browser, driver = chromium_paths()
    options = webdriver.ChromeOptions()
    options.binary_location = browser
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu", "--window-size=1400,1000",
                "--disable-extensions", "--no-first-run"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(service=Service(driver), options=options)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def serving(db: Path, *args: str, timeout_s: float = 60):
    """`bprof report --serve` on a free port; yields its base URL; stops it on exit."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "bprof.cli.main", "report", "--serve", "--db", str(db),
                             "--port", str(port), *args], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + timeout_s
        while True:
            if proc.poll() is not None:
                raise AssertionError(f"bprof report --serve exited {proc.returncode}: {proc.stdout.read()[-3000:]}")
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise AssertionError("bprof report --serve did not start listening") from None
                time.sleep(0.2)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def wait_for(driver, css: str, timeout_s: float = 60, text: str | None = None):
    """The first element matching `css` (containing `text` when given), once the app has drawn it."""
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support import expected_conditions as ec
    from selenium.webdriver.support.ui import WebDriverWait

    wait = WebDriverWait(driver, timeout_s)
    if text is None:
        return wait.until(ec.presence_of_element_located((By.CSS_SELECTOR, css)))
    return wait.until(ec.text_to_be_present_in_element((By.CSS_SELECTOR, css), text)) and \
        driver.find_element(By.CSS_SELECTOR, css)


def wait_idle(driver, timeout_s: float = 60) -> None:
    """Until Dash has no callback in flight (its loading state cleared) and the page is complete."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        busy = driver.execute_script(
            "return document.readyState !== 'complete' || !!document.querySelector('[data-dash-is-loading=\"true\"]')"
            " || !!document.querySelector('._dash-loading-callback')")
        if not busy:
            time.sleep(0.3)
            if not driver.execute_script("return !!document.querySelector('[data-dash-is-loading=\"true\"]')"):
                return
        time.sleep(0.2)
    raise AssertionError("the report was still loading after the timeout")


def figure_data(driver, key: str) -> list[dict]:
    """The plotly traces a chart section drew: type, name, x, y, z as the browser holds them."""
    # _fullData holds the decoded arrays (plotly ships numpy arrays base64-encoded); typed arrays
    # become plain lists
    return json.loads(driver.execute_script(
        "const g = document.querySelector(arguments[0] + ' .js-plotly-plot');"
        "if (!g || !g._fullData) return 'null';"
        "const keep = g._fullData.map(t => ({type: t.type, name: t.name, x: t.x, y: t.y, z: t.z}));"
        "return JSON.stringify(keep, (k, v) => ArrayBuffer.isView(v) ? Array.from(v) : v);", f"#{key}")) or []


def console_errors(driver) -> list[str]:
    return [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]


def transferred_bytes(driver) -> int:
    """Bytes the page fetched from the server: the document plus every resource (as sent, compressed)."""
    return int(driver.execute_script(
        "const n = performance.getEntriesByType('navigation').reduce((s, e) => s + (e.transferSize || 0), 0);"
        "return n + performance.getEntriesByType('resource').reduce((s, e) => s + (e.transferSize || 0), 0);"))


def choose(driver, control_id: str, label: str) -> None:
    """Pick the option labelled `label` in a dcc.Dropdown as a user does: open it, search, click it,
    close it (Dash 4's dropdown: a button that opens a popover with a search box and options)."""
    from selenium.common.exceptions import StaleElementReferenceException
    from selenium.webdriver.common.by import By
    from selenium.webdriver.common.keys import Keys

    driver.find_element(By.ID, control_id).click()
    search = wait_for(driver, ".dash-dropdown-content input.dash-dropdown-search", timeout_s=10)
    search.send_keys(label)
    deadline = time.monotonic() + 10
    while True:
        try:
            options = [o for o in driver.find_elements(By.CSS_SELECTOR, ".dash-dropdown-content [role=option]")
                       if o.text.strip() == label]
            if options:
                options[0].click()
                break
        except StaleElementReferenceException:
            # the list re-rendered (the search filtering it) between finding an option and reading or
            # clicking it: find it again (CI, 2026-11-30)
            pass
        assert time.monotonic() < deadline, f"no option {label!r} in #{control_id}"
        time.sleep(0.1)
    if driver.find_elements(By.CSS_SELECTOR, ".dash-dropdown-content"):
        search.send_keys(Keys.ESCAPE)


def clear(driver, control_id: str) -> None:
    """Empty a clearable dcc.Dropdown with its clear button."""
    driver.find_element("css selector", f"#control-{control_id} .dash-dropdown-clear").click()
