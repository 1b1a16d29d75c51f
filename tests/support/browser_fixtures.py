"""The browser tests' Playwright page in headless Debian Chromium (`browser_page`, skipped where either is missing) and
the admin's log-in."""

import os
import shutil

import pytest

from tests.support.admin_fixtures import dead, done, failed, fast_password_hashing_fixture  # noqa: F401

CHROMIUM = os.environ.get("JOBSITE_CHROMIUM", "/usr/bin/chromium")


CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]


TIMEOUT_MS = 20_000


@pytest.fixture
def browser_page():
    """A Playwright page in headless Debian Chromium (skips when either is missing)."""
    if not (os.path.exists(CHROMIUM) or shutil.which(CHROMIUM)):
        pytest.skip(f"{CHROMIUM} not found: apt-get install chromium (manage.py test installs it when run as root)")
    sync_api = pytest.importorskip("playwright.sync_api", reason="playwright is not installed (the test extra)")

    def open_page():
        playwright = sync_api.sync_playwright().start()
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 1000})
        page.set_default_timeout(TIMEOUT_MS)
        opened.append((playwright, browser))
        return page

    opened: list = []
    yield open_page
    for playwright, browser in opened:
        browser.close()
        playwright.stop()


def log_in(page, base: str, user, then: str) -> None:
    """Log `user` in on the admin's login page and land on the admin path `then`."""
    page.goto(f"{base}/admin/login/?next={then}")
    page.fill("#id_username", user.username)
    page.fill("#id_password", "password")
    page.click("input[type=submit]")
    page.wait_for_url(f"**{then}")
