"""Fixtures of the web tier (tests/web): tests/support/web_tier.py says what they are."""

from __future__ import annotations

import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from web_tier import (
    ARTIFACTS,
    CHROMEDRIVER,
    CHROMIUM,
    REQUIRE,
    PageController,
    start_page_controller,
)


@pytest.fixture(scope="module")
def page_controller(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PageController]:
    """A controller with a page token, its nodes silent, in dry run."""
    token = "page-" + uuid.uuid4().hex
    controller = start_page_controller(tmp_path_factory.mktemp("page"), token=token)
    try:
        yield controller
    finally:
        controller.thread.stop()


@pytest.fixture(scope="module")
def artifacts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    base = os.environ.get(ARTIFACTS)
    folder = Path(base) / "web" if base else tmp_path_factory.mktemp("web-artifacts")
    folder.mkdir(parents=True, exist_ok=True)
    print(f"\nweb tier screenshots: {folder}")
    return folder


def _browser_missing() -> str | None:
    try:
        import selenium  # noqa: F401
    except ImportError:
        return "selenium is not installed (pip install -e '.[dev]')"
    for path, package in ((CHROMIUM, "chromium"), (CHROMEDRIVER, "chromium-driver")):
        if not path.exists() and shutil.which(path.name) is None:
            return f"{path} is missing (apt-get install {package})"
    return None


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """Headless Chromium, 1280x900; every test sets the size it needs."""
    missing = _browser_missing()
    if missing is not None:
        if os.environ.get(REQUIRE) == "1":
            pytest.fail(f"browser tier required but unavailable: {missing}")
        pytest.skip(f"browser tier skipped: {missing} (scripts/setup.sh installs it)")
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    for flag in (
        "--headless=new",
        "--no-sandbox",  # root in CI, no user namespaces in containers
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-first-run",
        "--disable-extensions",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--metrics-recording-only",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    chromium = CHROMIUM if CHROMIUM.exists() else Path(shutil.which("chromium") or CHROMIUM)
    options.binary_location = str(chromium)
    driver_path = (
        CHROMEDRIVER if CHROMEDRIVER.exists() else Path(shutil.which("chromedriver") or "")
    )
    service = Service(executable_path=str(driver_path))
    # Both paths are given, so Selenium Manager has nothing to look up; should it
    # run all the same, it stays offline and sends no usage statistics.
    saved = {name: os.environ.get(name) for name in ("SE_OFFLINE", "SE_AVOID_STATS")}
    os.environ.update({"SE_OFFLINE": "true", "SE_AVOID_STATS": "true"})
    try:
        driver = webdriver.Chrome(service=service, options=options)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    driver.set_page_load_timeout(60)
    driver.set_script_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()  # ends chromedriver and every chromium process it started
