"""The written API (docs/api/*.openapi.yaml) against the real servers.

schemathesis generates requests for every documented operation (valid and
invalid bodies, missing and wrong credentials, undocumented methods) and checks
each answer: no 5xx, only documented statuses and content types, bodies and
headers that conform to the schema, 405 with Allow for other methods, 401
without the token. A second test keeps the documents and the servers' route
tables equal, so neither can change alone.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
import requests
import schemathesis
import yaml
from schemathesis.config import SchemathesisConfig

pytestmark = pytest.mark.integration

DOCS = Path(__file__).resolve().parents[2] / "docs" / "api"
AGENT_DOC = DOCS / "agent.openapi.yaml"
CONTROLLER_DOC = DOCS / "controller.openapi.yaml"
METHODS = ("get", "head", "post", "put", "delete", "patch", "options", "trace")

# Enough for every status of every operation to come up, bounded for CI: the
# examples each take a loopback round trip of a few milliseconds.
MAX_EXAMPLES = 50


# The controller's routes where a well-formed request can still be refused: a node
# or incident that does not exist (404), a node the controller does not watch in
# a query (400), a lone controller asked to step down (409), whitespace for a
# reason (400).
_CONTROLLER_REFUSALS = {
    "/v1/actions/hold": ["2xx", "400", "401", "404"],
    "/v1/actions/release": ["2xx", "400", "401", "404"],
    "/v1/actions/step-down": ["2xx", "401", "409"],
    "/v1/incidents": ["2xx", "400"],
    "/v1/incidents/{id}": ["2xx", "404"],
    "/static/{name}": ["2xx", "404"],
}


def _config(serving: bool = True, standby: bool = False) -> SchemathesisConfig:
    checks: dict[str, Any] = {}
    if not serving or standby:
        # With serving control off the POST routes answer 404 to every request,
        # token or none (the document's ServingDisabled); a standby of a pair
        # answers 503 to the page's actions: this check wants a 401 for a
        # request without the token.
        checks["missing_required_header"] = {"enabled": False}
    if standby:
        # A standby's documented answer to the page's reads and actions is a 503
        # (the leader has them); the status codes are still checked against the document.
        checks["not_a_server_error"] = {"enabled": False}
        checks["positive_data_acceptance"] = {"enabled": False}
    return SchemathesisConfig.from_dict(
        {
            "request-timeout": 20,
            # A loaded CI machine is slow, not wrong.
            "suppress-health-check": ["too_slow"],
            "generation": {"max-examples": MAX_EXAMPLES, "database": "none"},
            "phases": {"stateful": {"enabled": False}},
            "checks": checks,
            "operations": [
                {
                    # A well-formed body that names a profile this agent does not
                    # have is refused with a 400 that lists the known ones.
                    "include-path": "/v1/serving/start",
                    "checks": {
                        "positive_data_acceptance": {
                            "expected-statuses": ["2xx", "400", "401", "404", "409"]
                        }
                    },
                },
                *(
                    {
                        "include-path": path,
                        "checks": {"positive_data_acceptance": {"expected-statuses": statuses}},
                    }
                    for path, statuses in _CONTROLLER_REFUSALS.items()
                ),
            ],
        }
    )


# The servers start (and pick their ports and token) when the tests run, after
# the schemas are loaded: the base URL goes to each call, the token through this.
_TOKEN: dict[str, str | None] = {"agent": None, "controller": None}

agent_api = schemathesis.openapi.from_path(AGENT_DOC, config=_config())
plain_agent_api = schemathesis.openapi.from_path(AGENT_DOC, config=_config(serving=False))
controller_api = schemathesis.openapi.from_path(CONTROLLER_DOC, config=_config())
# A standby answers the page's actions 503, token or none.
standby_api = schemathesis.openapi.from_path(CONTROLLER_DOC, config=_config(standby=True))


@agent_api.auth(refresh_interval=None)
class _BearerToken:
    def get(self, case: Any, ctx: Any) -> str | None:
        return _TOKEN["agent"]

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@controller_api.auth(refresh_interval=None)
class _ControllerToken:
    def get(self, case: Any, ctx: Any) -> str | None:
        return _TOKEN["controller"]

    def set(self, case: Any, data: str, ctx: Any) -> None:
        case.headers = {**(case.headers or {}), "Authorization": f"Bearer {data}"}


@pytest.fixture(scope="module")
def agent_url(agent_server: Any) -> str:
    # Resolved before schemathesis draws the first case, so the token is there.
    _TOKEN["agent"] = agent_server.token
    return str(agent_server.base_url)


@pytest.fixture(scope="module")
def controller_url(controller_server: Any) -> str:
    _TOKEN["controller"] = controller_server.token
    return str(controller_server.base_url)


@agent_api.parametrize()
def test_the_agent_answers_as_documented(case: Any, agent_url: str) -> None:
    case.call_and_validate(base_url=agent_url)


@plain_agent_api.parametrize()
def test_an_agent_without_serving_control_answers_as_documented(
    case: Any, plain_agent_server: Any
) -> None:
    case.call_and_validate(base_url=plain_agent_server.base_url)


@controller_api.parametrize()
def test_the_controller_answers_as_documented(case: Any, controller_url: str) -> None:
    case.call_and_validate(base_url=controller_url)


@standby_api.parametrize()
def test_a_standby_of_a_pair_answers_as_documented(case: Any, standby_server: Any) -> None:
    case.call_and_validate(base_url=standby_server.base_url)


# --- the documents and the servers cannot drift apart ------------------------------


def _documented(path: Path) -> dict[str, tuple[str, ...]]:
    document = yaml.safe_load(path.read_text())
    return {
        route: tuple(sorted(m.upper() for m in item if m in METHODS))
        for route, item in document["paths"].items()
    }


def _served(operations: dict[str, tuple[str, ...]]) -> dict[str, tuple[str, ...]]:
    return {route: tuple(sorted(methods)) for route, methods in operations.items()}


def test_the_agent_document_lists_exactly_the_routes_the_agent_serves(
    agent_server: Any, plain_agent_server: Any
) -> None:
    documented = _documented(AGENT_DOC)
    assert _served(agent_server.endpoint.operations()) == documented
    assert _served(plain_agent_server.endpoint.operations()) == documented


def test_the_controller_document_lists_exactly_the_routes_the_controller_serves(
    controller_server: Any,
) -> None:
    assert _served(controller_server.endpoint.operations()) == _documented(CONTROLLER_DOC)


def test_a_standby_serves_the_controller_s_routes(standby_server: Any) -> None:
    assert _served(standby_server.endpoint.operations()) == _documented(CONTROLLER_DOC)
    status = requests.get(f"{standby_server.base_url}/v1/status", timeout=10).json()
    assert status["standby"]["leader"]["epoch"] == 3
    metrics = requests.get(f"{standby_server.base_url}/metrics", timeout=10).text
    assert "\nspark_watchdog_controller_leader_epoch 0.0\n" in metrics
    assert "\nspark_watchdog_controller_seen_leader_epoch 3.0\n" in metrics


@pytest.mark.parametrize("doc", [AGENT_DOC, CONTROLLER_DOC], ids=["agent", "controller"])
def test_every_operation_documents_its_errors_as_json(doc: Path) -> None:
    document = yaml.safe_load(doc.read_text())
    for route, item in document["paths"].items():
        for method, operation in item.items():
            responses = operation["responses"]
            assert "503" in responses, (route, method)
            for status, response in responses.items():
                if "$ref" in response:
                    name = response["$ref"].rsplit("/", 1)[1]
                    response = document["components"]["responses"][name]
                if method == "head" or int(status) < 400:
                    continue
                assert list(response["content"]) == ["application/json"], (route, method, status)


def test_the_agent_routes_answer_with_the_documented_content_types(agent_server: Any) -> None:
    document = yaml.safe_load(AGENT_DOC.read_text())
    for route, item in document["paths"].items():
        if "get" not in item:
            continue
        answer = requests.get(agent_server.base_url + route, timeout=10)
        documented = next(iter(item["get"]["responses"]["200"]["content"]))
        assert answer.status_code == 200, route
        assert answer.headers["Content-Type"].split(";")[0] == documented, route


def test_the_agent_reports_peers_that_are_no_evidence(agent_server: Any) -> None:
    """A peer nothing answers for and one that answers as another node (the
    answers themselves are checked against the document above)."""
    deadline = time.monotonic() + 60
    while True:
        peers = requests.get(f"{agent_server.base_url}/v1/state", timeout=5).json()["peers"]
        states = {name: peer["state"] for name, peer in peers.items()}
        if states == {"spark-2": "silent", "spark-3": "wrong_node"}:
            break
        assert time.monotonic() < deadline, states
        time.sleep(0.1)
    for peer in peers.values():
        assert peer["progress_ago_s"] is None and peer["seq"] is None and peer["error"]
