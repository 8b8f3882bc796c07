"""The HTTP server's account of its connections (spark_watchdog/http/connections.py),
on a clock of the test's own: each phase's deadline as it is when a connection
enters it, the late closed in turn, the oldest evicted but never a running
route, the biggest holders shed."""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator

import pytest

from spark_watchdog.http.connection_log import ConnectionLog
from spark_watchdog.http.connections import Connection, ConnectionTable, Phase
from spark_watchdog.http.poll import Poller

HTTP_LOGGER = "spark_watchdog.http"


class _Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> _Clock:
    return _Clock()


@pytest.fixture
def deadlines() -> dict[str, float]:
    return {Phase.READING: 10.0, Phase.WRITING: 10.0, Phase.CLOSING: 1.0}


@pytest.fixture
def table(clock: _Clock, deadlines: dict[str, float]) -> Iterator[ConnectionTable]:
    poller = Poller()
    table = ConnectionTable(poller, clock, ConnectionLog(), deadlines.__getitem__)
    yield table
    table.close_all()
    poller.close()


@pytest.fixture
def peers() -> Iterator[list[socket.socket]]:
    ends: list[socket.socket] = []
    yield ends
    for end in ends:
        end.close()


def _open(table: ConnectionTable, peers: list[socket.socket], port: int) -> Connection:
    ours, theirs = socket.socketpair()
    peers.append(theirs)
    return table.open(ours, ("127.0.0.1", port))


def test_a_deadline_is_read_as_the_connection_enters_its_phase(
    table: ConnectionTable,
    peers: list[socket.socket],
    clock: _Clock,
    deadlines: dict[str, float],
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger=HTTP_LOGGER)
    reading = _open(table, peers, 4001)
    assert (reading.phase, reading.due) == (Phase.READING, 10.0)
    deadlines[Phase.WRITING] = 2.0
    clock.now = 1.0
    writing = _open(table, peers, 4002)
    writing.outbox = memoryview(b"x" * 100)
    table.held += 100
    table.enter(writing, Phase.WRITING)
    assert writing.due == 3.0
    assert table.next_due(60.0) == 3.0
    table.expire(2.9)
    assert len(table) == 2
    table.expire(3.0)
    assert writing.phase == Phase.CLOSED and len(table) == 1 and table.held == 0
    assert "100 bytes of its answer were not taken within 2 s" in caplog.text
    assert reading.phase == Phase.READING  # its own deadline, 10 s, is not yet
    table.expire(10.0)
    assert len(table) == 0


def test_the_oldest_waiting_is_evicted_never_a_running_route(
    table: ConnectionTable, peers: list[socket.socket], clock: _Clock
) -> None:
    running = _open(table, peers, 4001)
    clock.now = 1.0
    waiting = _open(table, peers, 4002)
    clock.now = 2.0
    table.enter(running, Phase.RUNNING)
    assert table.next_due(60.0) == 11.0  # a running route has no deadline of its own
    assert table.evict_oldest("full")
    assert waiting.phase == Phase.CLOSED
    assert not table.evict_oldest("full")
    assert running.phase == Phase.RUNNING and len(table) == 1


def test_past_the_limit_the_biggest_holders_are_shed(
    table: ConnectionTable, peers: list[socket.socket]
) -> None:
    sizes = {4001: 300, 4002: 500, 4003: 200}
    conns = {port: _open(table, peers, port) for port in sizes}
    for port, size in sizes.items():
        conns[port].inbox += b"a" * size
        table.held += size
    table.shed(600)
    assert [port for port, conn in conns.items() if conn.phase == Phase.CLOSED] == [4002]
    assert table.held == 500
    table.shed(250)
    assert [port for port, conn in conns.items() if conn.phase != Phase.CLOSED] == [4003]
    assert table.held == 200
