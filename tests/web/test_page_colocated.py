"""The page where controllers run on the Sparks: its own controller tells every
controller's incidents with who acted, asking the others on the server
(GET /v1/colocated/incidents, docs/design.md, "One story from either node"),
so the page itself still talks to its own controller alone.

spark-1's controller is a real one (its loop, its page, its /v1/status with
the colocated section), on loopback, its nodes silent, in dry run; spark-2's
controller answers from a history of its own through the real page API
(tests/support/fake_controllers.py)."""

from __future__ import annotations

import asyncio
import email.message
import json
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any, cast

import pytest
import requests
from fake_controllers import Canned, closed_url, served_history
from web_tier import wait_until

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.decide.colocation import Placement
from spark_watchdog.controller.look.controller_peers import ALONE
from spark_watchdog.controller.page.page_api import PageRoutes
from spark_watchdog.controller.page.page_auth import PageAuth
from spark_watchdog.controller.page.status_api import StatusEndpoint
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.http.server import Request
from spark_watchdog.lab.ports import free_port

pytestmark = pytest.mark.integration

PAGE_S = 60.0


def _config(root: Path, name: str, peer_url: str, *, colocated: bool = True) -> ControllerConfig:
    nodes = [
        {
            "name": f"spark-{i}",
            "agent": f"http://127.0.0.1:{free_port()}",
            "ssh_host": "127.0.0.1",
            "ssh_port": free_port(),
            "power": [],
        }
        for i in (1, 2, 3)
    ]
    body: dict[str, Any] = {
        "nodes": nodes,
        "detection": {"poll_interval": 0.5, "agent_timeout": 0.5, "freeze_after": 60.0},
        "guards": {"dry_run": True},
        "history": str(root / f"{name}.db"),
    }
    if colocated:
        body["listen"] = {"address": "0.0.0.0", "port": free_port()}
        body["colocated"] = {
            "takeover_after": 90.0,
            "controllers": [
                {"node": "spark-1", "urls": ["http://127.0.0.1:9"]},
                {"node": "spark-2", "urls": [peer_url]},
            ],
        }
    return parse_controller_config(body, name)


def _spark_2_history(path: Path) -> None:
    """spark-2's controller cycled spark-3 a minute ago."""
    with HistoryStore(path) as store:
        incident = store.open_incident(
            "host_frozen", ["spark-3"], detected_at=time.time() - 60, evidence={"reasons": ["x"]}
        )
        action = store.record_action(
            "spark-3", "cycle", device="kasa plug 3", incident_id=incident.id, rung=0
        )
        store.finish_action(action.id, "verified", step="power_restored")
        store.resolve_incident(incident.id, "recovered")


@dataclass
class Page:
    url: str
    controller: Controller
    store: HistoryStore


@pytest.fixture(scope="module")
def page(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Page]:
    """spark-1's controller and its page, spark-2's controller beside it."""
    root = tmp_path_factory.mktemp("colocated-page")
    _spark_2_history(root / "spark-2.db")
    there = parse_controller_config(
        {"nodes": [{"name": f"spark-{i}", "agent": "http://127.0.0.1:9"} for i in (1, 2, 3)],
         "history": str(root / "spark-2.db")},
        "spark-2",
    )  # fmt: skip
    with (
        HistoryStore(root / "spark-2.db", read_only=True) as spark_2,
        served_history(there, spark_2) as peer_url,
    ):
        config = _config(root, "spark-1", peer_url)
        store = HistoryStore(config.history)
        store.open_incident(
            "serving_stalled", ["spark-1"], detected_at=time.time() - 600, evidence={}
        )
        controller = Controller(config, store, node="spark-1")
        loop: list[asyncio.AbstractEventLoop] = []
        routes = PageRoutes(controller, PageAuth(None), lambda: loop[0] if loop else None)
        endpoint = StatusEndpoint("127.0.0.1", 0, controller, paths_of=routes)
        stop = threading.Event()

        def run() -> None:
            async def main() -> None:
                loop.append(asyncio.get_running_loop())
                stopping = asyncio.Event()
                task = asyncio.create_task(controller.run(stopping))
                while not stop.is_set():
                    await asyncio.sleep(0.1)
                stopping.set()
                await task

            asyncio.run(main())

        thread = threading.Thread(target=run, name="spark-1-controller", daemon=True)
        endpoint.start()
        thread.start()
        url = f"http://127.0.0.1:{endpoint.port}"
        try:
            wait_until(
                lambda: requests.get(f"{url}/v1/status", timeout=2).json().get("ticks", 0) > 0,
                PAGE_S,
                "spark-1's controller's first sweep",
            )
            yield Page(url, controller, store)
        finally:
            stop.set()
            thread.join(30)
            endpoint.stop()
            store.close()


def test_the_list_has_every_controller_s_incidents_with_who_acted(page: Page) -> None:
    body = requests.get(page.url + "/v1/colocated/incidents", timeout=10).json()
    assert body["here"] == "spark-1" and body["unreachable"] == []
    assert [(i["ref"], i["by"], i["kind"]) for i in body["incidents"]] == [
        ("spark-2#1", "spark-2", "host_frozen"),
        ("spark-1#1", "spark-1", "serving_stalled"),
    ]
    assert all("evidence" not in i for i in body["incidents"])
    only = requests.get(page.url + "/v1/colocated/incidents?node=spark-3", timeout=10).json()
    assert [i["ref"] for i in only["incidents"]] == ["spark-2#1"]
    theirs = requests.get(page.url + "/v1/colocated/incidents/spark-2/1", timeout=10).json()
    assert theirs["by"] == "spark-2"
    assert [a["device"] for a in theirs["timeline"]["actions"]] == ["kasa plug 3"]
    mine = requests.get(page.url + "/v1/colocated/incidents/spark-1/1", timeout=10).json()
    assert (mine["by"], mine["timeline"]["incident"]["kind"]) == ("spark-1", "serving_stalled")
    for path, status, words in [
        ("/v1/colocated/incidents/spark-2/99", 404, "no incident 99 in the history of spark-2's"),
        ("/v1/colocated/incidents/spark-3/1", 404, "no controller runs on spark-3"),
        ("/v1/colocated/incidents/spark-2", 400, "expected /v1/colocated/incidents/NODE/ID"),
        ("/v1/colocated/incidents?limit=0", 400, "limit: expected an integer"),
    ]:
        answer = requests.get(page.url + path, timeout=10)
        assert answer.status_code == status and words in answer.json()["error"], answer.text


def test_the_page_shows_another_controller_s_incident_and_who_acted(
    browser: Any, page: Page
) -> None:
    browser.set_window_size(1280, 1000)
    browser.get(page.url + "/")
    selector = '#incidents button[data-by="spark-2"]'
    button = wait_until(
        lambda: browser.find_elements("css selector", selector), PAGE_S, "spark-2's incident"
    )[0]
    assert button.text.startswith("spark-2#1 host_frozen on spark-3")
    assert button.text.endswith("by spark-2")
    mine = browser.find_element("css selector", '#incidents button[data-by="spark-1"]')
    assert mine.text.startswith("spark-1#1 serving_stalled") and mine.text.endswith("by spark-1")
    button.click()

    def drawn() -> dict[str, Any] | None:
        found: dict[str, Any] = browser.execute_script(
            """
            return {
              hidden: document.getElementById("incident").hidden,
              title: document.getElementById("incident-title").textContent,
              facts: document.getElementById("incident-facts").textContent,
              actions: [...document.querySelectorAll("#actions tbody tr")]
                .map((e) => e.textContent),
            };
            """
        )
        return found if not found["hidden"] and found["actions"] else None

    shown = wait_until(drawn, PAGE_S, "spark-2's incident opened")
    assert shown["title"] == "Incident spark-2#1: host_frozen on spark-3"
    assert "handled bythe controller on spark-2" in shown["facts"]
    assert any("kasa plug 3" in row and "verified" in row for row in shown["actions"])
    # The page asked its own controller only; that one asked spark-2's.
    origins = browser.execute_script(
        "return performance.getEntriesByType('resource').map((e) => new URL(e.name).origin);"
    )
    assert set(origins) <= {page.url}, origins


# -- the routes alone, against answers no controller gives -------------------------


def _routes(tmp_path: Path, peer_url: str, *, colocated: bool = True) -> PageRoutes:
    config = _config(tmp_path, "spark-1", peer_url, colocated=colocated)
    placement = Placement("spark-1", ("spark-1", "spark-2"), 30.0, 20.0, 8.0)
    source = SimpleNamespace(
        config=config,
        ledger=SimpleNamespace(store=HistoryStore(config.history)),
        peers=SimpleNamespace(placement=placement) if colocated else ALONE,
    )
    return PageRoutes(cast(Any, source), PageAuth(None), lambda: None)


def _get(routes: PageRoutes, path: str, query: str = "") -> tuple[int, dict[str, Any]]:
    reply = routes.answer(Request("GET", path, query, email.message.Message()))
    return reply[0], json.loads(reply[2])


def test_a_controller_that_does_not_answer_is_listed_and_the_rest_still_shows(
    tmp_path: Path,
) -> None:
    url = closed_url()
    routes = _routes(tmp_path, url)
    status, body = _get(routes, "/v1/colocated/incidents")
    assert status == 200 and body["incidents"] == []
    [missing] = body["unreachable"]
    assert missing["controller"] == "spark-2" and missing["error"].startswith(url)
    status, body = _get(routes, "/v1/colocated/incidents/spark-2/1")
    assert status == 502 and body["error"].startswith(f"controller spark-2: {url}")


def test_an_answer_that_is_no_timeline_is_refused_with_its_field(tmp_path: Path) -> None:
    hostile = Canned({"incident": {"id": 1, "kind": "<img src=x onerror=alert(1)>"}})
    try:
        status, body = _get(_routes(tmp_path, hostile.url), "/v1/colocated/incidents/spark-2/1")
    finally:
        hostile.stop()
    assert status == 502
    assert "answered something else than a timeline: incident" in body["error"]
    assert "<img" not in body["error"]


def test_a_controller_not_on_the_sparks_says_where_its_incidents_are(tmp_path: Path) -> None:
    status, body = _get(_routes(tmp_path, "", colocated=False), "/v1/colocated/incidents")
    assert status == 404 and "GET /v1/incidents has every incident it handled" in body["error"]
    standby = PageRoutes(None, PageAuth(None), lambda: None)
    status, body = _get(standby, "/v1/colocated/incidents/spark-2/1")
    assert status == 503 and "stands by" in body["error"]
