"""The operator's page in a real browser, against a real controller in the lab
(docs/page.md): a freeze as it happens, an incident's timeline and charts, a
hold set from the page, no action without the token, and a phone's screen.

One lab of two nodes for the module (tests/lab starts theirs the same way);
Chromium headless through Selenium (tests/web/conftest.py). The deadlines
are generous: the suite runs on a loaded 2-core machine. Screenshots are kept
(the directory is printed); ``recovery.png`` is the README's picture.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from web_tier import secret_file, wait_until

from spark_watchdog.lab.session import LabSession

pytestmark = [pytest.mark.integration, pytest.mark.xdist_group("web-lab")]

# A freeze, its power cycle, the boot and the agent back, on a loaded machine.
RECOVERY_S = 300.0
PAGE_S = 60.0
# Healthy this long before the freeze: the flight recorder's charts have a past.
BEFORE_FREEZE_S = 12.0


@dataclass
class WebLab:
    session: LabSession
    token: str

    @property
    def url(self) -> str:
        assert self.session.controller is not None
        return self.session.controller.url


@pytest.fixture(scope="module")
def web_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[WebLab]:
    root = tmp_path_factory.mktemp("web-lab")
    token = "page-" + uuid.uuid4().hex
    token_file = secret_file(root / "page-token", token)
    session = LabSession(
        root / "lab", nodes=2, controller_overrides={"listen": {"token_file": str(token_file)}}
    )
    with session:
        yield WebLab(session, token)


def _card(driver: Any, node: str) -> dict[str, Any] | None:
    """What the page shows of ``node`` now: verdict, state and what it saw happen."""
    found: dict[str, Any] | None = driver.execute_script(
        """
        const card = document.querySelector(`article[data-node="${arguments[0]}"]`);
        if (!card) return null;
        const state = card.querySelector("[data-state]");
        return {
          verdict: card.querySelector("[data-verdict]").dataset.verdict,
          state: state ? state.dataset.state : "watching",
          seen: [...card.querySelectorAll("[data-seen]")].map((e) => e.dataset.seen),
          action: card.querySelector("button[data-action]").dataset.action,
          disabled: card.querySelector("button[data-action]").disabled,
        };
        """,
        node,
    )
    return found


def _label(card: dict[str, Any]) -> str:
    """As the page labels what it saw (page.js's noteSeen)."""
    verdict = str(card["verdict"])
    return f"{verdict}, power cycle" if card["state"] == "fencing" else verdict


def _recovering(label: str) -> bool:
    return label.endswith("power cycle") or label == "booting"


def _open(driver: Any, lab: WebLab, *, phone: bool = False) -> None:
    if phone:
        driver.execute_cdp_cmd(
            "Emulation.setDeviceMetricsOverride",
            {"width": 390, "height": 844, "deviceScaleFactor": 2, "mobile": True},
        )
    else:
        driver.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
        driver.set_window_size(1280, 1000)
    driver.get(lab.url + "/")
    wait_until(lambda: _card(driver, "spark-1"), PAGE_S, "the page to draw spark-1")


def _shot(driver: Any, folder: Path, name: str) -> Path:
    path = folder / name
    driver.save_screenshot(str(path))
    return path


def _no_horizontal_scroll(driver: Any) -> tuple[int, int]:
    """(the document's width, the viewport's): equal when nothing scrolls sideways."""
    width, inner = driver.execute_script(
        "return [document.documentElement.scrollWidth, window.innerWidth];"
    )
    return int(width), int(inner)


def test_the_page_shows_a_freeze_as_it_happens(
    browser: Any, web_lab: WebLab, artifacts: Path
) -> None:
    _open(browser, web_lab)
    wait_until(
        lambda: (c := _card(browser, "spark-2")) and c["verdict"] == "healthy",
        PAGE_S,
        "spark-2 healthy on the page",
    )
    time.sleep(BEFORE_FREEZE_S)
    _shot(browser, artifacts, "healthy.png")
    target = web_lab.session.lab.node("spark-2")
    web_lab.session.lab.freeze(target)
    watched: list[str] = []
    shot: Path | None = None

    def recovered() -> bool:
        nonlocal shot
        card = _card(browser, "spark-2")
        if card is None:
            return False
        label = _label(card)
        if not watched or watched[-1] != label:
            watched.append(label)
        if _recovering(label) and shot is None:
            shot = _shot(browser, artifacts, "recovery.png")
        return any(w.startswith("host_frozen") for w in watched) and label == "healthy"

    wait_until(recovered, RECOVERY_S, "spark-2 frozen, power-cycled and healthy on the page")
    card = _card(browser, "spark-2")
    assert card is not None
    seen = set(watched) | set(card["seen"])  # what this test polled, and what the page kept
    assert any(s.startswith("host_frozen") for s in seen), seen
    assert any(_recovering(s) for s in seen), f"neither a power cycle nor a boot shown: {seen}"
    assert card["seen"][-1] == "healthy", card["seen"]
    assert shot is not None
    print(f"states the page showed for spark-2: {' -> '.join(card['seen'])}")
    # Everything the page loaded came from the controller.
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map((e) => new URL(e.name).origin);"
    )
    assert set(origins) <= {web_lab.url}, origins


def test_an_incident_s_timeline_and_charts_render(
    browser: Any, web_lab: WebLab, artifacts: Path
) -> None:
    _open(browser, web_lab)
    selector = "#incidents button[data-incident]"
    button = wait_until(
        lambda: browser.find_elements("css selector", selector), PAGE_S, "the incident list"
    )[0]
    assert "host_frozen on spark-2" in button.text
    button.click()

    def drawn() -> dict[str, Any] | None:
        found: dict[str, Any] = browser.execute_script(
            """
            return {
              hidden: document.getElementById("incident").hidden,
              steps: [...document.querySelectorAll("#steps > li")].map((e) => e.textContent),
              actions: [...document.querySelectorAll("#actions tbody tr")]
                .map((e) => e.textContent),
              charts: document.querySelectorAll("#charts svg polyline").length,
              boots: document.querySelectorAll("#boots details").length,
            };
            """
        )
        return found if not found["hidden"] and found["charts"] and found["actions"] else None

    shown = wait_until(drawn, PAGE_S, "the incident's timeline, actions and charts")
    assert any("incident_opened" in step for step in shown["steps"])
    assert any("cycle" in row and "verified" in row for row in shown["actions"]), shown
    assert shown["charts"] >= 2
    _shot(browser, artifacts, "incident.png")
    browser.execute_script("document.getElementById('actions').scrollIntoView();")
    _shot(browser, artifacts, "incident-actions.png")


def _confirm(browser: Any, reason: str | None = None) -> None:
    dialog = wait_until(
        lambda: browser.execute_script("return document.getElementById('confirm').open;"),
        PAGE_S,
        "the confirmation",
    )
    assert dialog
    if reason is not None:
        browser.find_element("id", "confirm-reason").send_keys(reason)
    browser.find_element("id", "confirm-ok").click()


def _click_action(browser: Any, node: str) -> None:
    def clicked() -> bool:
        buttons = browser.find_elements("css selector", f'button[data-target="{node}"]')
        if not buttons or not buttons[0].is_enabled():
            return False
        buttons[0].click()
        return True

    wait_until(clicked, PAGE_S, f"the action button of {node}")


def test_a_hold_set_from_the_page_holds(browser: Any, web_lab: WebLab, artifacts: Path) -> None:
    _open(browser, web_lab)
    browser.find_element("id", "token-input").send_keys(web_lab.token)
    browser.find_element("id", "token-use").click()
    _click_action(browser, "spark-1")
    text = browser.find_element("id", "confirm-text").text
    assert "Hold spark-1?" in text and "Nothing automatic" in text
    _confirm(browser, "replacing a cable (web tier)")
    wait_until(
        lambda: (c := _card(browser, "spark-1")) and c["verdict"] == "held",
        PAGE_S,
        "spark-1 held on the page",
    )
    holds = web_lab.session.store().active_holds()
    assert [(h.node, h.created_by, h.reason) for h in holds] == [
        ("spark-1", "page", "replacing a cable (web tier)")
    ]
    _shot(browser, artifacts, "held.png")
    _click_action(browser, "spark-1")
    assert "Release spark-1?" in browser.find_element("id", "confirm-text").text
    _confirm(browser)
    wait_until(
        lambda: (c := _card(browser, "spark-1")) and c["verdict"] != "held",
        PAGE_S,
        "spark-1 released on the page",
    )
    assert web_lab.session.store().active_holds() == []
    browser.find_element("id", "token-forget").click()


def test_no_action_succeeds_without_the_token(browser: Any, web_lab: WebLab) -> None:
    _open(browser, web_lab)
    browser.execute_script("sessionStorage.clear();")
    browser.refresh()
    card = wait_until(lambda: _card(browser, "spark-1"), PAGE_S, "the page")
    assert card["disabled"], "an action button works without the token"
    statuses = browser.execute_async_script(
        """
        const done = arguments[arguments.length - 1];
        const post = (headers) => fetch("/v1/actions/hold", {
          method: "POST", headers: {"Content-Type": "application/json", ...headers},
          body: JSON.stringify({node: "spark-1", reason: "no token"}),
        }).then((r) => r.status);
        Promise.all([post({}), post({Authorization: "Bearer wrong"})]).then(done);
        """
    )
    assert statuses == [401, 401]
    # A wrong token typed into the form: the page says so, the history is unchanged.
    browser.find_element("id", "token-input").send_keys("not-the-token")
    browser.find_element("id", "token-use").click()
    _click_action(browser, "spark-1")
    _confirm(browser, "should not hold")
    error = wait_until(
        lambda: browser.find_element("id", "confirm-error").text, PAGE_S, "the refusal"
    )
    assert "invalid bearer token" in error
    assert web_lab.session.store().active_holds() == []
    browser.find_element("id", "confirm-cancel").click()


def test_on_a_phone_s_screen_nothing_scrolls_sideways(
    browser: Any, web_lab: WebLab, artifacts: Path
) -> None:
    _open(browser, web_lab, phone=True)
    try:
        width, inner = _no_horizontal_scroll(browser)
        assert inner == 390 and width <= inner, (width, inner)
        _shot(browser, artifacts, "phone.png")
        wait_until(
            lambda: browser.find_elements("css selector", "#incidents button[data-incident]"),
            PAGE_S,
            "the incident list",
        )[0].click()
        wait_until(
            lambda: browser.find_elements("css selector", "#charts svg"), PAGE_S, "the charts"
        )
        width, inner = _no_horizontal_scroll(browser)
        assert width <= inner, f"the incident scrolls sideways: {width} > {inner}"
        _shot(browser, artifacts, "phone-incident.png")
        unnamed = browser.execute_script(
            """
            const named = (e) => (e.getAttribute("aria-label") || e.textContent || "").trim()
              || (e.id && document.querySelector(`label[for="${e.id}"]`));
            return [...document.querySelectorAll("button, input, select")]
              .filter((e) => !named(e)).map((e) => e.outerHTML.slice(0, 80));
            """
        )
        assert unnamed == [], unnamed
    finally:
        browser.execute_cdp_cmd("Emulation.clearDeviceMetricsOverride", {})
