"""The stand-in's tensor-parallel group (lab/hardware/rank_group.py): the head
steps only while every rank answers it, as a real TP engine's all-reduce needs."""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator

import pytest
import requests

from spark_watchdog.lab.hardware.rank_group import (
    ASK_TIMEOUT_S,
    GroupReach,
    RankEndpoint,
    parse_address,
)
from spark_watchdog.lab.hardware.vllm_standin import VllmStandin
from spark_watchdog.lab.ports import LOOPBACK, free_port

# Generous: CI is a loaded 2-core machine.
DEADLINE_S = 30.0


def eventually(check: Callable[[], bool], what: str, timeout: float = DEADLINE_S) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not within {timeout:g}s: {what}")
        time.sleep(0.05)


@pytest.fixture
def reach_of() -> Iterator[Callable[..., GroupReach]]:
    made: list[GroupReach] = []

    def make(*ranks: tuple[str, int]) -> GroupReach:
        made.append(GroupReach(ranks).start())
        return made[-1]

    yield make
    for reach in made:
        reach.stop()


def test_addresses_are_host_and_port() -> None:
    assert parse_address("203.0.113.2:4321") == ("203.0.113.2", 4321)
    for wrong in ("203.0.113.2", ":80", "host:0", "host:http", "host:70000"):
        with pytest.raises(ValueError, match="HOST:PORT"):
            parse_address(wrong)


def test_the_group_answers_while_every_rank_does(reach_of: Callable[..., GroupReach]) -> None:
    first = RankEndpoint(LOOPBACK, 0).start()
    second = RankEndpoint(LOOPBACK, 0).start()
    try:
        reach = reach_of(first.address, second.address)
        eventually(reach.answers, "both ranks answer")
        gone = second.address
        second.stop()
        eventually(lambda: not reach.answers(), "the group stops answering without a rank")
        assert reach.silent() == [gone]
        second = RankEndpoint(*gone).start()  # the rank starts again, same address
        eventually(reach.answers, "the group answers again")
    finally:
        first.stop()
        second.stop()


def test_a_rank_that_takes_the_connection_but_never_answers_is_silent(
    reach_of: Callable[..., GroupReach],
) -> None:
    """A frozen rank: its kernel completes the handshake, its process answers nothing."""
    listener = socket.create_server((LOOPBACK, 0))
    listener.settimeout(DEADLINE_S)
    try:
        reach = reach_of(listener.getsockname()[:2])
        asked, _ = listener.accept()
        asked.settimeout(DEADLINE_S)
        assert asked.recv(1) == b"s"
        # A second connection: the first ask went unanswered for ASK_TIMEOUT_S and was given up.
        again, _ = listener.accept()
        assert not reach.answers()
        asked.close()
        again.close()
    finally:
        listener.close()
    assert ASK_TIMEOUT_S < DEADLINE_S


def test_the_engine_steps_only_while_its_group_answers() -> None:
    group = threading.Event()
    with VllmStandin(step_rate=100.0, group=group.is_set) as standin:
        time.sleep(0.5)
        assert standin.engine_steps() == 0, "stepped without its group"
        group.set()
        eventually(lambda: standin.engine_steps() > 5, "steps with the group answering")
        group.clear()
        time.sleep(0.1)  # a step already under way ends
        held = standin.engine_steps()
        time.sleep(0.5)
        assert standin.engine_steps() == held, "stepped after its group went silent"


def test_a_completion_waits_for_the_group() -> None:
    group = threading.Event()
    with VllmStandin(step_rate=50.0, group=group.is_set) as standin:
        body = {"model": standin.model, "prompt": "ping", "max_tokens": 1}
        with pytest.raises(requests.ReadTimeout):
            requests.post(f"{standin.url}/v1/completions", json=body, timeout=1.5)
        group.set()
        answer = requests.post(f"{standin.url}/v1/completions", json=body, timeout=DEADLINE_S)
        assert answer.status_code == 200


@pytest.mark.integration
def test_a_stopped_worker_process_stalls_the_head_process() -> None:
    """As the lab runs them: a headless rank with --fabric-listen, a head with --fabric-rank."""
    port = free_port()
    command = [sys.executable, "-m", "spark_watchdog.lab.hardware", "vllm"]
    worker = subprocess.Popen([*command, "--headless", "--fabric-listen", f"{LOOPBACK}:{port}"])
    head_port = free_port()
    head = subprocess.Popen(
        [*command, "--port", str(head_port), "--fabric-rank", f"{LOOPBACK}:{port}"],
        stdout=subprocess.DEVNULL,
    )
    url = f"http://{LOOPBACK}:{head_port}/_standin/mode"

    def steps() -> int:
        try:
            return int(requests.get(url, timeout=2).json()["engines"][0]["steps"])
        except requests.RequestException:
            return -1

    def steady() -> bool:
        before = steps()
        time.sleep(1.5)
        return before >= 0 and steps() == before

    try:
        eventually(lambda: steps() > 10, "the head steps with its worker answering")
        worker.send_signal(signal.SIGSTOP)  # frozen: the kernel still takes connections
        eventually(steady, "the head stops stepping")
        worker.send_signal(signal.SIGCONT)
        resumed = steps()
        eventually(lambda: steps() > resumed + 10, "the head steps again")
    finally:
        for process in (head, worker):
            process.send_signal(signal.SIGCONT)
            process.terminate()
            assert process.wait(timeout=DEADLINE_S) == 0
