"""A token in a URL is refused on every path of both servers, as
docs/page.md, "The token" says: the agent's (its serving token) and the
controller's (its page token), over real HTTP on loopback, wherever in the
target it hides and however it is encoded; the refusal never echoes it and no
log line holds it."""

from __future__ import annotations

import asyncio
import logging
import socket
import sys
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
import requests
from web_tier import start_page_controller

from spark_watchdog.agent.daemon import Agent
from spark_watchdog.bearer import credential_in_target, token_matcher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.lab.ports import free_port
from spark_watchdog.sdnotify import SystemdNotifier

pytestmark = pytest.mark.integration

AGENT_TOKEN = "agent-" + uuid.uuid4().hex
PAGE_TOKEN = "page-" + uuid.uuid4().hex


def _hiding_places(token: str) -> list[str]:
    """Targets that carry ``token`` (or a credential) somewhere other than a header."""
    once = quote(token, safe="")
    twice = quote(once, safe="")
    return [
        f"/v1/status?token={token}",
        f"/v1/status?ACCESS_TOKEN={token}",
        f"/v1/status?Access-Token={token}",
        f"/v1/status?x-api-key={token}",
        f"/v1/status;token={token}",
        f"/v1/status/;jsessionid=1;auth={token}",
        f"/v1/status?q=Bearer%20{once}",
        f"/v1/status?q=bEaReR+{once}",
        f"/v1/status?q={quote('Bearer ' + token, safe='')}",
        f"/v1/status?x={token}",
        f"/v1/status?{token}",
        f"/v1/status?a=1&b={once}",
        f"/v1/status?a=1;b={token}",
        f"/v1/status#access_token={token}",
        f"/v1/status#{token}",
        f"/v1/status%3Ftoken%3D{once}",
        f"/v1/status%253Ftoken%253D{twice}",
        f"/v1/status?%74oken={token}",
        f"/{token}",
        f"/v1/{once}/status",
        f"/v1/status?x={quote(twice, safe='')}",
        f"http://user:{token}@127.0.0.1/v1/status",
    ]


def _raw(port: int, request: bytes) -> tuple[int, bytes]:
    """Send ``request`` as is (requests would normalise the target); the status and the answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as sock:
        sock.sendall(request)
        chunks = []
        while chunk := sock.recv(65536):
            chunks.append(chunk)
    answer = b"".join(chunks)
    return int(answer.split(b" ", 2)[1]), answer


def _assert_refused(port: int, token: str, method: str, target: str) -> None:
    request = f"{method} {target} HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n".encode()
    status, answer = _raw(port, request)
    assert status == 400, (method, target, answer[:300])
    assert b"never goes in a URL" in answer and b"Authorization: Bearer" in answer
    for shown in (token, quote(token, safe=""), token.upper()):
        assert shown.encode() not in answer


# -- the agent ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def agent_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    """A real agent with serving control on (never started), its probes off."""
    root = tmp_path_factory.mktemp("agent")
    token_file = root / "serving-token"
    token_file.write_text(AGENT_TOKEN + "\n")
    token_file.chmod(0o600)
    port = free_port()
    config = parse_agent_config(
        {
            "node": "spark-1",
            "listen": {"address": "127.0.0.1", "port": port},
            "probes": {"gpu": {"enabled": False}, "journal": {"enabled": False}},
            "serving": {
                "enabled": True,
                "command": [sys.executable, "-c", "import time; time.sleep(60)"],
                "token_file": str(token_file),
                "log_file": str(root / "serving.log"),
            },
        }
    )
    agent = Agent(config, notifier=SystemdNotifier({}))
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()
    thread = threading.Thread(target=lambda: loop.run_until_complete(agent.run(stop)), daemon=True)
    thread.start()
    deadline = time.monotonic() + 60  # generous: a loaded 2-core machine
    while not agent.ready.is_set() and time.monotonic() < deadline:
        time.sleep(0.05)
    assert agent.ready.is_set(), "the agent never became ready"
    try:
        yield port
    finally:
        loop.call_soon_threadsafe(stop.set)
        thread.join(90)
        assert not thread.is_alive(), "the agent did not stop"


@pytest.mark.parametrize("method", ["GET", "POST", "PUT", "BREW"])
def test_the_agent_refuses_a_token_anywhere_in_a_url(agent_port: int, method: str) -> None:
    for target in _hiding_places(AGENT_TOKEN):
        _assert_refused(agent_port, AGENT_TOKEN, method, target)
    for target in ("/v1/serving/stop?token=x", f"/v1/serving/stop?t={AGENT_TOKEN}"):
        _assert_refused(agent_port, AGENT_TOKEN, method, target)
    # Nothing was started or stopped by any of them.
    state = requests.get(f"http://127.0.0.1:{agent_port}/v1/serving", timeout=20).json()
    assert state["state"] == "not_started"


def test_the_agent_answers_plain_urls_as_before(agent_port: int) -> None:
    base = f"http://127.0.0.1:{agent_port}"
    assert requests.get(f"{base}/v1/state", timeout=20).status_code == 200
    missing = requests.get(f"{base}/v1/no-such-path", timeout=20)
    assert missing.status_code == 404 and "no such path" in missing.json()["error"]
    # A wrong token in the URL under a neutral name is not the token: an ordinary 404.
    other = requests.get(f"{base}/v1/state/{uuid.uuid4().hex}", timeout=20)
    assert other.status_code == 404


# -- the controller ----------------------------------------------------------------


@pytest.fixture(scope="module")
def controller_port(tmp_path_factory: pytest.TempPathFactory) -> Iterator[int]:
    controller = start_page_controller(tmp_path_factory.mktemp("page"), token=PAGE_TOKEN, nodes=1)
    try:
        yield int(controller.url.rsplit(":", 1)[1])
    finally:
        controller.thread.stop()


@pytest.mark.parametrize("method", ["GET", "HEAD", "POST", "DELETE", "BREW"])
def test_the_controller_refuses_a_token_anywhere_in_a_url(
    controller_port: int, method: str
) -> None:
    for target in _hiding_places(PAGE_TOKEN):
        for place in (target, target.replace("/v1/status", "/v1/actions/hold", 1)):
            _assert_refused(controller_port, PAGE_TOKEN, method, place)


def test_the_controller_answers_plain_urls_as_before(controller_port: int) -> None:
    base = f"http://127.0.0.1:{controller_port}"
    assert requests.get(f"{base}/v1/status", timeout=20).status_code == 200
    listed = requests.get(f"{base}/v1/incidents?status=open&limit=5", timeout=20)
    assert listed.status_code == 200, listed.text
    assert requests.get(f"{base}/static/page.js", timeout=20).status_code == 200


def test_a_refused_url_leaves_no_log_line_with_the_token(
    controller_port: int,
    agent_port: int,
    caplog: pytest.LogCaptureFixture,
    capfd: pytest.CaptureFixture[str],
) -> None:
    with caplog.at_level(logging.DEBUG):
        for port, token in ((controller_port, PAGE_TOKEN), (agent_port, AGENT_TOKEN)):
            for target in _hiding_places(token):
                _raw(port, f"GET {target} HTTP/1.1 extra\r\n\r\n".encode())  # bad syntax too
                _raw(port, f"GET {target}\r\n\r\n".encode())  # HTTP/0.9
    out, err = capfd.readouterr()
    logged = "\n".join(r.getMessage() for r in caplog.records) + out + err
    assert PAGE_TOKEN not in logged and AGENT_TOKEN not in logged


# -- the check itself ---------------------------------------------------------------

_PLAIN = [
    "/v1/state",
    "/v1/incidents?status=open&limit=5&node=spark-2",
    "/v1/incidents/20240101T000000Z-spark-1-1",
    "/static/page.js",
    "/v1/nodes",
    "/metrics",
]


@pytest.mark.parametrize("target", _PLAIN)
def test_the_product_s_own_urls_carry_no_credential(target: str) -> None:
    assert not credential_in_target(target, token_matcher(b"s3cret"))


def test_more_encoding_than_any_client_uses_is_refused() -> None:
    hidden = "token=x"
    for _ in range(12):
        hidden = quote(hidden, safe="")
    assert credential_in_target(f"/v1/state?{hidden}")


Matcher = Callable[[str], bool]


def test_the_token_matches_whole_parts_only() -> None:
    is_token: Matcher = token_matcher(b"s3cret")
    assert is_token(" s3cret ") and not is_token("s3cre") and not is_token("")
    assert not credential_in_target("/v1/state?x=s3cretx", is_token)
    assert credential_in_target("/v1/state?x=s3cret", is_token)


def test_a_path_named_like_a_credential_is_not_one(tmp_path: Path) -> None:
    # Only a name=value part names something; a bare path word is a value.
    assert not credential_in_target("/v1/tokens/list")
    assert credential_in_target("/v1/x/token=abc")
