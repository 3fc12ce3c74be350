"""A headless Chromium for the console's tests: Debian's ``chromium`` driven by its
``chromium-driver`` through Selenium, nothing downloaded (``make test`` installs both with apt).

Running as root needs ``--no-sandbox``; ``--disable-dev-shm-usage`` keeps a container's small
``/dev/shm`` from crashing the renderer. Selenium Manager is never asked for a driver (the
driver's path is given) and is told to stay offline and send no statistics.
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path
from typing import Callable, Iterator

import pytest

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"


@contextlib.contextmanager
def chromium(width: int = 1400, height: int = 1100) -> Iterator:
    """A headless Chromium session (Selenium's ``WebDriver``), quit at the end."""
    if not (Path(CHROMIUM).exists() and Path(CHROMEDRIVER).exists()):
        pytest.fail(f"{CHROMIUM} and {CHROMEDRIVER} are needed: scripts/bootstrap.sh installs them "
                    f"(apt-get install chromium chromium-driver)")
    os.environ.setdefault("SE_OFFLINE", "true")
    os.environ.setdefault("SE_AVOID_STATS", "true")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for flag in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                 f"--window-size={width},{height}"):
        options.add_argument(flag)
    driver = webdriver.Chrome(service=Service(CHROMEDRIVER), options=options)
    try:
        yield driver
    finally:
        driver.quit()


def text_of(driver, selector: str) -> str | None:
    """The text of the first element ``selector`` finds, in one round trip (None: none): read so, a
    value the page redraws between finding and reading cannot go stale."""
    return driver.execute_script("const e = document.querySelector(arguments[0]); return e ? e.textContent : null;",
                                 selector)


def texts_of(driver, selector: str) -> list[str]:
    return driver.execute_script("return [...document.querySelectorAll(arguments[0])].map(e => e.textContent);",
                                 selector)


def fetch(driver, path: str, method: str = "GET", body: str | None = None, action: bool = False) -> dict:
    """A request from the page, with the token the page signed in with: ``{"status", "body"}``."""
    return driver.execute_async_script("""
        const [path, method, body, action, done] = arguments;
        const headers = {"X-Twinflow-Operator": sessionStorage.getItem("tf-name") || ""};
        const token = sessionStorage.getItem("tf-token");
        if (token) headers["Authorization"] = "Bearer " + token;
        if (action) headers["X-Twinflow-Console"] = "1";
        fetch(path, {method, headers, body}).then(async r => done({status: r.status, body: await r.text()}))
            .catch(e => done({status: 0, body: String(e)}));
    """, path, method, body, action)


def shots(directory: Path) -> Callable[[object, str], Path]:
    """A function that saves the page as ``directory/<name>.png`` (and, with TWINFLOW_CONSOLE_SHOTS set,
    a copy there: how the docs' pictures are made)."""
    directory.mkdir(parents=True, exist_ok=True)
    extra = os.environ.get("TWINFLOW_CONSOLE_SHOTS")

    def save(driver, name: str) -> Path:
        path = directory / f"{name}.png"
        driver.execute_script("window.scrollTo(0, 0)")  # the page from its top, as a person opens it
        driver.save_screenshot(str(path))
        if extra:
            Path(extra).mkdir(parents=True, exist_ok=True)
            (Path(extra) / path.name).write_bytes(path.read_bytes())
        return path

    return save
