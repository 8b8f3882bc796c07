"""The web tier's helpers (tests/web): a real controller with its page token,
and a real Chromium driven by Selenium.

``page_controller`` is a controller in this process (the lab's
``ControllerThread``) whose nodes answer nothing and which, in dry run,
never touches power: for the page's API and its refusals. The browser tier
(test_page_browser.py) runs the lab's real cluster instead.

``browser`` is Debian's ``chromium`` through ``chromium-driver``, headless,
with Selenium pointed at ``/usr/bin/chromedriver`` so that Selenium Manager
never looks for a driver on the network. Without them the browser tests are
skipped with the way to get them, unless ``SPARK_WATCHDOG_REQUIRE_BROWSER=1``
(scripts/test.sh sets it after setup.sh installed them), where they fail.

Screenshots go to ``$SPARK_WATCHDOG_ARTIFACTS/web`` when that is set, else to
a directory of the test session's temporary tree; the path is printed.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import requests

from spark_watchdog.lab.lab_controller import ControllerThread
from spark_watchdog.lab.ports import free_port

CHROMEDRIVER = Path("/usr/bin/chromedriver")
CHROMIUM = Path("/usr/bin/chromium")
REQUIRE = "SPARK_WATCHDOG_REQUIRE_BROWSER"
ARTIFACTS = "SPARK_WATCHDOG_ARTIFACTS"


def wait_until(check: Callable[[], Any], timeout: float, what: str, every: float = 0.2) -> Any:
    """``check()``'s first true value within ``timeout`` s; AssertionError naming ``what``."""
    deadline = time.monotonic() + timeout
    last: BaseException | None = None
    while time.monotonic() < deadline:
        try:
            value = check()
            if value:
                return value
        except Exception as exc:  # a page mid-redraw, a controller starting
            last = exc
        time.sleep(every)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what} (last error: {last!r})")


def secret_file(path: Path, value: str) -> Path:
    path.write_text(value + "\n")
    path.chmod(0o600)
    return path


@dataclass
class PageController:
    thread: ControllerThread
    url: str
    token: str | None

    def auth(self, token: str | None = None) -> dict[str, str]:
        return {"Authorization": f"Bearer {token or self.token}"}


def start_page_controller(root: Path, *, token: str | None, nodes: int = 2) -> PageController:
    root.mkdir(parents=True, exist_ok=True)
    community = secret_file(root / "community", "private")
    listen: dict[str, Any] = {"address": "127.0.0.1", "port": free_port()}
    if token is not None:
        listen["token_file"] = str(secret_file(root / "page-token", token))
    config = {
        "nodes": [
            {
                "name": f"spark-{n}",
                "agent": f"http://127.0.0.1:{free_port()}",
                "ssh_host": "127.0.0.1",
                "ssh_port": free_port(),
                "power": [
                    {
                        "type": "snmp",
                        "host": "127.0.0.1",
                        "port": free_port(),
                        "outlet": n,
                        "vendor": "apc",
                        "community_file": str(community),
                        "timeout": 1.0,
                    }
                ],
            }
            for n in range(1, nodes + 1)
        ],
        "detection": {"poll_interval": 0.5, "agent_timeout": 0.5, "freeze_after": 60.0},
        "guards": {"dry_run": True},
        "listen": listen,
        "history": str(root / "history.db"),
    }
    thread = ControllerThread(config).start()
    url = thread.url
    wait_until(
        lambda: requests.get(f"{url}/v1/status", timeout=2).json().get("ticks", 0) > 0,
        60,
        "the controller's first poll sweep",
    )
    return PageController(thread, url, token)
