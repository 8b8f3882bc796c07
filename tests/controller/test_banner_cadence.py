"""While an agent is late, SSH banner checks start every LATE_BANNER_INTERVAL_S,
start to start: a check that times out must not push the next one back by
its own timeout (that made two misses take 2 x (interval + timeout))."""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import time
from pathlib import Path

import pytest

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO
from spark_watchdog.controller.look.monitor import LATE_BANNER_INTERVAL_S
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.ports import free_port
from spark_watchdog.power.ssh_banner import BannerResult, check_ssh_banner

pytestmark = pytest.mark.integration


def test_late_banner_checks_start_every_interval(tmp_path: Path, silent_listener: int) -> None:
    banner_timeout = 1.5
    config = parse_controller_config(
        {
            "nodes": [
                {
                    "name": "spark-3",
                    "agent": f"http://127.0.0.1:{free_port()}",  # refused: a silent agent
                    "ssh_host": "127.0.0.1",
                    "ssh_port": silent_listener,
                    "power": [],
                }
            ],
            "detection": {
                "poll_interval": 0.1,
                "agent_timeout": 0.2,
                "freeze_after": 4.0,
                "banner_timeout": banner_timeout,
                "banner_misses": 2,
            },
            "listen": {"address": "127.0.0.1", "port": free_port()},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    starts: list[float] = []

    async def recording(host: str, port: int, timeout: float) -> BannerResult:
        starts.append(time.monotonic())
        return await check_ssh_banner(host, port, timeout)

    store = HistoryStore(config.history)
    io = dataclasses.replace(ControllerIO.production(config), banner=recording)
    controller = Controller(config, store, io=io)

    async def scenario() -> None:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(controller.run(stop))
        await asyncio.sleep(3 * LATE_BANNER_INTERVAL_S + 2 * banner_timeout)
        stop.set()
        await task

    try:
        asyncio.run(scenario())
    finally:
        store.close()
    assert len(starts) >= 3, starts
    late = [b - a for a, b in itertools.pairwise(starts[1:])]  # after the start-up check
    # Start to start: the interval, plus at most a poll tick; never interval + timeout.
    assert all(gap < LATE_BANNER_INTERVAL_S + 0.5 for gap in late), late
    assert all(gap >= LATE_BANNER_INTERVAL_S - 0.05 for gap in late), late
    assert controller.watches["spark-3"].banner_misses >= 2
