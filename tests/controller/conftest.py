"""Shared fixtures of the controller tests."""

from __future__ import annotations

import socket
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.lab.cluster import LabCluster
from spark_watchdog.lab.controller_pair import ControllerPair, wait_for
from spark_watchdog.lab.hardware.postgres_server import PostgresServer
from spark_watchdog.power.base import PowerState

LOG_LINES_SHOWN = 80


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Any:
    """A failed pair test shows what each controller logged (they run as
    processes of their own, whose output pytest does not capture)."""
    report: pytest.TestReport = yield
    made = getattr(item, "funcargs", {}).get("pair")
    if report.failed and call.when == "call" and isinstance(made, ControllerPair):
        for name in made.processes:
            lines = made.log(name).splitlines()[-LOG_LINES_SHOWN:]
            report.sections.append((f"controller {name} (last lines)", "\n".join(lines)))
    return report


@pytest.fixture
def silent_listener() -> Iterator[int]:
    """Accepts TCP connections and never says a word (a frozen host's kernel:
    the handshake completes, no SSH banner or HTTP answer follows)."""
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    yield int(sock.getsockname()[1])
    sock.close()


@pytest.fixture(scope="module")
def pair_lab(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LabCluster]:
    """A two-node lab cluster serving, for a module's controller-pair tests."""
    with LabCluster(tmp_path_factory.mktemp("lab"), size=2) as cluster:
        yield cluster.serving()


@pytest.fixture
def pair(
    pair_lab: LabCluster, postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> Iterator[ControllerPair]:
    """Controllers of a pair on a fresh database; afterwards every node thawed,
    powered and back, also after a test that failed with an outlet off: the
    module's next test starts on a whole cluster, not on what this one left."""
    made = ControllerPair(pair_lab, postgres_server, postgres_url, tmp_path)
    yield made
    made.close()
    assert pair_lab.pdu is not None
    for node in pair_lab.nodes:
        pair_lab.thaw(node)
        if pair_lab.pdu.standin.state(node.outlet) is PowerState.OFF:
            pair_lab.switch_by_hand(node, on=True)
    wait_for(lambda: all(pair_lab.agent_state(n) for n in pair_lab.nodes), 60, "agents back")
