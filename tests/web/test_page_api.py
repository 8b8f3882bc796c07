"""The page's routes over plain HTTP: what the page reads, what it may do with
the token, and every refusal (docs/page.md, docs/bad-input.md): a clear JSON
answer, nothing changed in the history, and nothing logged that holds the token."""

from __future__ import annotations

import logging
import socket
import sqlite3
import time
from pathlib import Path
from typing import Any

import pytest
import requests
from web_tier import PageController, start_page_controller, wait_until

from spark_watchdog.history.store import HistoryStore

pytestmark = pytest.mark.integration

ACTIONS = ("/v1/actions/hold", "/v1/actions/release", "/v1/actions/step-down")


def _holds(controller: PageController) -> list[tuple[str, str]]:
    return [(h.node, h.created_by) for h in controller.thread.store.active_holds()]


def _error(answer: requests.Response, status: int, *words: str) -> str:
    assert answer.status_code == status, (answer.status_code, answer.text)
    assert answer.headers["Content-Type"] == "application/json"
    message = str(answer.json()["error"])
    for word in words:
        assert word in message, message
    return message


def test_the_page_and_its_files_come_with_a_strict_policy(page_controller: PageController) -> None:
    page = requests.get(page_controller.url + "/", timeout=10)
    assert page.status_code == 200
    assert page.headers["Content-Type"] == "text/html; charset=utf-8"
    policy = page.headers["Content-Security-Policy"]
    assert "default-src 'self'" in policy and "frame-ancestors 'none'" in policy
    assert page.headers["X-Content-Type-Options"] == "nosniff"
    assert page.headers["Referrer-Policy"] == "no-referrer"
    assert "http://" not in page.text.replace('"http://www.w3.org', "")  # nothing from elsewhere
    script = requests.get(page_controller.url + "/static/page.js", timeout=10)
    assert script.headers["Content-Type"] == "text/javascript; charset=utf-8"
    assert "sessionStorage" in script.text and "localStorage" not in script.text
    css = requests.get(page_controller.url + "/static/page.css", timeout=10)
    assert css.headers["Content-Type"] == "text/css; charset=utf-8"
    # The page itself is / alone: /static/ has its CSS and JavaScript, as documented.
    for name in (
        "missing.js",
        "..%2Fpage_api.py",
        "web/page.js",
        "%2e%2e/index.html",
        "index.html",
    ):
        _error(
            requests.get(f"{page_controller.url}/static/{name}", timeout=10), 404, "no such file"
        )


def test_the_nodes_view_has_signal_ages_power_paths_and_serving(
    page_controller: PageController,
) -> None:
    body = requests.get(page_controller.url + "/v1/nodes", timeout=10).json()
    assert [n["name"] for n in body["nodes"]] == ["spark-1", "spark-2"]
    first = body["nodes"][0]
    assert first["power"] == [
        {"type": "snmp", "host": "127.0.0.1", "port": first["power"][0]["port"], "outlet": 1}
    ]
    assert first["signals"]["agent_progress"] > 0  # silent since the start
    assert first["signals"]["agent_answer"] is None  # never answered
    assert set(first["serving"]) == {
        "state",
        "profile",
        "requested",
        "effective",
        "effective_matches_profile",
    }
    assert body["serving_profile"]["safe_profile"] == "safe"
    assert body["breaker_open"] is False
    _error(requests.get(page_controller.url + "/v1/nodes?x=1", timeout=10), 400, "no query")


def test_incidents_are_listed_filtered_and_shown_whole(page_controller: PageController) -> None:
    store = page_controller.thread.store
    now = time.time()
    recorder = {
        "node": "spark-2",
        "fields": ["t", "mem_available_bytes", "gpu_power_w"],
        "samples": [[now - 10 + i, 8e9 - i * 1e8, 60.0 + i] for i in range(10)],
    }
    frozen = store.open_incident(
        "host_frozen", ["spark-2"], evidence={"flight_recorder": recorder}, detected_at=now
    )
    action = store.record_action("spark-2", "cycle", device="pdu", incident_id=frozen.id, rung=1)
    store.finish_action(action.id, "verified", verified_at=now + 3)
    store.open_incident("gpu_wedged", ["spark-1"], evidence={"why": "test"}, detected_at=now)
    url = page_controller.url + "/v1/incidents"
    every = requests.get(url, timeout=10).json()["incidents"]
    assert {i["kind"] for i in every} >= {"host_frozen", "gpu_wedged"}
    assert all("evidence" not in i for i in every)  # the list is short; a timeline has it
    assert next(i for i in every if i["id"] == frozen.id)["evidence_keys"] == ["flight_recorder"]
    by_node = requests.get(url, params={"node": "spark-2"}, timeout=10).json()["incidents"]
    assert [i["id"] for i in by_node] == [frozen.id]
    by_kind = requests.get(url, params={"kind": "gpu_wedged"}, timeout=10).json()["incidents"]
    assert [i["kind"] for i in by_kind] == ["gpu_wedged"]
    assert requests.get(url, params={"limit": 1}, timeout=10).json()["incidents"][0]["id"] > 0
    timeline = requests.get(f"{url}/{frozen.id}", timeout=10).json()
    assert timeline["incident"]["evidence"]["flight_recorder"]["samples"][0][2] == 60.0
    assert [(a["operation"], a["result"]) for a in timeline["actions"]] == [("cycle", "verified")]
    assert timeline["actions"][0]["verified_at"] is not None  # the read-back's time
    assert timeline["steps"][0]["step"] == "incident_opened"


def test_one_incident_with_an_absurd_time_blinds_no_listing(
    page_controller: PageController,
) -> None:
    store = page_controller.thread.store
    now = time.time()
    # A GPU fault's time in microseconds, as a controller wrote it before it
    # checked what its agents send (controller/look/intake.py).
    absurd = store.open_incident(
        "gpu_fault", ["spark-1"], evidence={}, detected_at=now, fault_onset=1.7e15
    )
    sane = store.open_incident("gpu_wedged", ["spark-2"], evidence={}, detected_at=now)
    raw = sqlite3.connect(store.path)
    with raw:  # and a time's column changed outside spark-watchdog
        raw.execute("UPDATE incidents SET opened_at = 'soon' WHERE id = ?", (absurd.id,))
    raw.close()
    url = page_controller.url + "/v1/incidents"
    answer = requests.get(url, timeout=10)
    assert answer.status_code == 200, answer.text
    listed = {i["id"]: i for i in answer.json()["incidents"]}
    assert {absurd.id, sane.id} <= set(listed)
    assert listed[absurd.id]["fault_onset"] is None and listed[absurd.id]["opened_at"] is None
    assert listed[absurd.id]["time_to_detect_s"] < 0  # a number, shown as it is
    assert listed[sane.id]["opened_at"] is not None
    timeline = requests.get(f"{url}/{absurd.id}", timeout=10)
    assert timeline.status_code == 200, timeline.text
    assert timeline.json()["incident"]["kind"] == "gpu_fault"


@pytest.mark.parametrize(
    ("query", "words"),
    [
        ("limit=0", ["limit", "1 to 500"]),
        ("limit=abc", ["limit"]),
        ("limit=501", ["limit"]),
        ("node=spark-9", ["no node 'spark-9'", "known: spark-1, spark-2"]),
        ("kind=Host-Frozen", ["kind"]),
        ("status=closed", ["status", "open or resolved"]),
        ("colour=red", ["unknown query parameter 'colour'"]),
        ("node=spark-1&node=spark-2", ["more than once"]),
        ("node", ["expected name=value pairs"]),
    ],
)
def test_a_bad_incident_query_is_a_clear_400(
    page_controller: PageController, query: str, words: list[str]
) -> None:
    _error(requests.get(f"{page_controller.url}/v1/incidents?{query}", timeout=10), 400, *words)


@pytest.mark.parametrize(
    ("raw", "status"), [("abc", 400), ("0", 400), ("-1", 400), ("1.5", 400), ("99999", 404)]
)
def test_a_bad_or_unknown_incident_id(
    page_controller: PageController, raw: str, status: int
) -> None:
    _error(
        requests.get(f"{page_controller.url}/v1/incidents/{raw}", timeout=10), status, "incident"
    )


def test_a_hold_from_the_page_is_in_the_history_and_holds_the_node(
    page_controller: PageController,
) -> None:
    base = page_controller.url
    answer = requests.post(
        base + "/v1/actions/hold",
        json={"node": "spark-1", "reason": "checking cables"},
        headers=page_controller.auth(),
        timeout=20,
    )
    assert answer.status_code == 200, answer.text
    assert answer.json()["hold"]["created_by"] == "page"
    assert ("spark-1", "page") in _holds(page_controller)
    # The next sweep applies it, as it does a hold from the CLI.

    def held() -> bool:
        nodes = requests.get(base + "/v1/status", timeout=5).json()["nodes"]
        return any(n["name"] == "spark-1" and n["state"] == "held" for n in nodes)

    wait_until(held, 30, "spark-1 held in /v1/status")
    # What `spark-watchdog status --db` reads: the history, another connection.
    with HistoryStore(page_controller.thread.config.history, read_only=True) as reader:
        assert [h.node for h in reader.active_holds()] == ["spark-1"]
    released = requests.post(
        base + "/v1/actions/release",
        json={"node": "spark-1"},
        headers=page_controller.auth(),
        timeout=20,
    )
    assert released.json()["released"]["released_by"] == "page"
    assert _holds(page_controller) == []
    again = requests.post(
        base + "/v1/actions/release",
        json={"node": "spark-1"},
        headers=page_controller.auth(),
        timeout=20,
    )
    assert again.json() == {"released": None}


def test_the_cluster_hold_is_cleared_from_the_page(page_controller: PageController) -> None:
    page_controller.thread.store.hold("*", "circuit breaker (test)", by="controller")
    answer = requests.post(
        page_controller.url + "/v1/actions/release",
        json={"node": "*"},
        headers=page_controller.auth(),
        timeout=20,
    )
    assert answer.json()["released"]["node"] == "*"
    assert _holds(page_controller) == []


def test_a_lone_controller_has_no_leader_to_step_down(page_controller: PageController) -> None:
    answer = requests.post(
        page_controller.url + "/v1/actions/step-down",
        json={},
        headers=page_controller.auth(),
        timeout=20,
    )
    _error(answer, 409, "not one of a pair")


@pytest.mark.parametrize(
    ("headers", "words"),
    [
        ({}, ["missing Authorization"]),
        ({"Authorization": "Bearer wrong-token"}, ["invalid bearer token"]),
        ({"Authorization": "Basic dXNlcjpwYXNz"}, ["expected Authorization: Bearer"]),
        ({"Authorization": "Bearer "}, ["expected Authorization: Bearer"]),
        ({"Cookie": "token=TOKEN; session=TOKEN"}, ["missing Authorization"]),
    ],
    ids=["none", "wrong", "basic", "empty", "cookie-only"],
)
def test_no_action_without_the_token(
    page_controller: PageController, headers: dict[str, str], words: list[str]
) -> None:
    headers = {k: v.replace("TOKEN", page_controller.token or "") for k, v in headers.items()}
    for path in ACTIONS:
        body = {"node": "spark-2", "reason": "x"} if path.endswith("hold") else {}
        if path.endswith("release"):
            body = {"node": "spark-2"}
        answer = requests.post(page_controller.url + path, json=body, headers=headers, timeout=20)
        _error(answer, 401, *words)
        assert answer.headers["WWW-Authenticate"] == 'Bearer realm="spark-watchdog"'
    assert _holds(page_controller) == []


@pytest.mark.parametrize(
    "headers",
    [
        {"Origin": "http://evil.example"},
        {"Origin": "null"},
        {"Origin": "http://127.0.0.1:1"},
        {"Sec-Fetch-Site": "cross-site"},
        {"Sec-Fetch-Site": "same-site"},
    ],
)
def test_a_forged_request_from_another_origin_is_refused(
    page_controller: PageController, headers: dict[str, str]
) -> None:
    answer = requests.post(
        page_controller.url + "/v1/actions/hold",
        json={"node": "spark-2", "reason": "forged"},
        headers={**page_controller.auth(), **headers},
        timeout=20,
    )
    _error(answer, 403, "refused")
    assert _holds(page_controller) == []


def test_the_page_s_own_origin_may_act(page_controller: PageController) -> None:
    origin = page_controller.url
    answer = requests.post(
        origin + "/v1/actions/release",
        json={"node": "spark-2"},
        headers={**page_controller.auth(), "Origin": origin, "Sec-Fetch-Site": "same-origin"},
        timeout=20,
    )
    assert answer.status_code == 200, answer.text


@pytest.mark.parametrize(
    ("path", "body", "status", "words"),
    [
        (
            "/v1/actions/hold",
            {"node": "spark-9", "reason": "typo"},
            404,
            ["no node 'spark-9'", "known: spark-1, spark-2"],
        ),
        ("/v1/actions/release", {"node": "spark-9"}, 404, ["no node 'spark-9'"]),
        ("/v1/actions/hold", {"node": "spark-1"}, 400, ["reason"]),
        ("/v1/actions/hold", {"node": "spark-1", "reason": "   "}, 400, ["reason"]),
        ("/v1/actions/hold", {"node": 7, "reason": "x"}, 400, ["node"]),
        ("/v1/actions/hold", {"node": "spark-1", "reason": "x" * 501}, 400, ["at most 500"]),
        (
            "/v1/actions/hold",
            {"node": "spark-1", "reason": "x", "until": 5},
            400,
            ["unknown field 'until'"],
        ),
        ("/v1/actions/step-down", {"force": True}, 400, ["unknown field 'force'"]),
    ],
)
def test_a_bad_action_changes_nothing(
    page_controller: PageController, path: str, body: dict[str, Any], status: int, words: list[str]
) -> None:
    answer = requests.post(
        page_controller.url + path, json=body, headers=page_controller.auth(), timeout=20
    )
    _error(answer, status, *words)
    assert _holds(page_controller) == []


def test_a_body_that_is_not_json_is_refused(page_controller: PageController) -> None:
    answer = requests.post(
        page_controller.url + "/v1/actions/hold",
        data=b"node=spark-1&reason=x",
        headers={**page_controller.auth(), "Content-Type": "application/x-www-form-urlencoded"},
        timeout=20,
    )
    _error(answer, 400, "not JSON")
    assert _holds(page_controller) == []


@pytest.mark.parametrize(
    "path",
    ["/", "/v1/status", "/metrics", "/static/page.js", "/v1/incidents", "/v1/actions/hold"],
)
@pytest.mark.parametrize("name", ["token", "access_token", "Authorization", "ANYTHING"])
def test_a_token_in_a_url_is_refused_on_every_path(
    page_controller: PageController, path: str, name: str
) -> None:
    token = page_controller.token
    assert token is not None
    query = {name: token} if name != "ANYTHING" else {"x": token}
    method = requests.post if path.startswith("/v1/actions") else requests.get
    answer = method(page_controller.url + path, params=query, timeout=20)
    message = _error(answer, 400, "never goes in a URL", "Authorization: Bearer")
    assert token not in message and token not in answer.text
    assert _holds(page_controller) == []


def test_the_token_is_never_logged(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, capfd: pytest.CaptureFixture[str]
) -> None:
    """Every way the token can reach the controller, and none of its logs holds it."""
    token = "never-logged-" + "7" * 24
    controller = start_page_controller(tmp_path / "c", token=token, nodes=1)
    try:
        with caplog.at_level(logging.DEBUG):
            base = controller.url
            requests.get(f"{base}/v1/status?token={token}", timeout=10)
            requests.post(f"{base}/v1/actions/hold?access_token={token}", json={}, timeout=10)
            requests.post(
                f"{base}/v1/actions/hold",
                json={"node": "spark-9", "reason": token},
                headers={"Authorization": f"Bearer {token}"},
                timeout=10,
            )
            requests.post(
                f"{base}/v1/actions/hold",
                json={"node": "spark-1", "reason": "x"},
                headers={"Authorization": f"Bearer {token}x"},
                timeout=10,
            )
            _raw(base, f"GET /{token} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {token}\r\n\r\n")
            _raw(base, f"BREW /v1/status?token={token} HTTP/1.1\r\n\r\n")
            _raw(base, f"GET /v1/status?token={token}\r\n\r\n")  # HTTP/0.9
            time.sleep(1)
    finally:
        controller.thread.stop()
    out, err = capfd.readouterr()
    # The controller's own lines (requests' client logs its URLs: not ours to judge).
    ours = [r for r in caplog.records if r.name.startswith("spark_watchdog")]
    logged = "\n".join(r.getMessage() for r in ours) + out + err
    assert token not in logged


def _raw(base: str, request: str) -> bytes:
    host, port = base.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as sock:
        sock.sendall(request.encode())
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
        return b"".join(chunks)


def test_without_a_token_configured_the_page_is_read_only(tmp_path: Path) -> None:
    controller = start_page_controller(tmp_path / "ro", token=None, nodes=1)
    try:
        for token in ("", "anything"):
            answer = requests.post(
                controller.url + "/v1/actions/hold",
                json={"node": "spark-1", "reason": "x"},
                headers={"Authorization": f"Bearer {token}"},
                timeout=20,
            )
            _error(answer, 403, "actions are off", "listen.token_file")
        assert requests.get(controller.url + "/v1/incidents", timeout=10).status_code == 200
        assert controller.thread.store.active_holds() == []
    finally:
        controller.thread.stop()


def test_an_unreadable_token_file_stops_the_controller_at_start(tmp_path: Path) -> None:
    from spark_watchdog.errors import ConfigError

    missing = tmp_path / "no-such-token"
    with pytest.raises(ConfigError) as refused:
        start_page_controller_with_file(tmp_path, missing)
    assert "listen.token_file" in str(refused.value)


def start_page_controller_with_file(root: Path, token_file: Path) -> None:
    from spark_watchdog.lab.lab_controller import ControllerThread

    ControllerThread(
        {
            "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9", "ssh_host": "127.0.0.1"}],
            "listen": {"address": "127.0.0.1", "port": 9, "token_file": str(token_file)},
            "history": str(root / "history.db"),
        }
    )


def test_an_event_stream_request_gets_the_ordinary_answer(page_controller: PageController) -> None:
    """The page polls; there is no event stream to reconnect to. A browser's
    reconnect headers, however malformed, change nothing."""
    for headers in (
        {"Accept": "text/event-stream", "Last-Event-ID": "\x7f" * 300},
        {"Accept": "text/event-stream", "Last-Event-ID": "-1", "Cache-Control": "no-cache"},
    ):
        answer = requests.get(page_controller.url + "/v1/status", headers=headers, timeout=10)
        assert answer.status_code == 200
        assert answer.headers["Content-Type"] == "application/json"


def test_controller_check_names_an_unreadable_page_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    import yaml

    from spark_watchdog.cli.main import main

    config = tmp_path / "controller.yaml"
    config.write_text(
        yaml.safe_dump(
            {
                "nodes": [{"name": "spark-1", "agent": "http://127.0.0.1:9", "ssh_host": "h"}],
                "listen": {"token_file": str(tmp_path / "no-such-token")},
                "history": str(tmp_path / "history.db"),
            }
        )
    )
    assert main(["controller", "--config", str(config), "--check"]) == 2
    assert "listen.token_file" in capsys.readouterr().err
