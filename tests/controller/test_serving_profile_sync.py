"""The profile in force, as a running controller shows it, follows the history:
a person who picks one (``serving profile P``) or restarts serving with one
(``serving restart``) while the controller runs sees it in its status."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import pytest

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.lab.ports import free_port

pytestmark = pytest.mark.integration

# A deadline for a few ticks of 0.1 s on a loaded machine: generous, not a measure.
DEADLINE_S = 30.0


def test_a_profile_recorded_while_the_controller_runs_is_the_one_it_shows(
    tmp_path: Path,
) -> None:
    config = parse_controller_config(
        {
            "nodes": [{"name": "spark-1", "agent": f"http://127.0.0.1:{free_port()}"}],
            "detection": {"poll_interval": 0.1, "agent_timeout": 0.2},
            "listen": {"address": "127.0.0.1", "port": free_port()},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    store = HistoryStore(config.history)
    store.set_setting("serving_profile", "safe", by="controller")
    controller = Controller(config, store)

    async def shown_after(profile: str) -> str | None:
        deadline = time.monotonic() + DEADLINE_S
        while time.monotonic() < deadline:
            shown = (controller.published or {}).get("serving_profile")
            if controller.ticks > 0 and shown == profile:
                return profile
            await asyncio.sleep(0.05)
        return (controller.published or {}).get("serving_profile")

    async def scenario() -> tuple[str | None, str | None]:
        stop = asyncio.Event()
        task = asyncio.get_running_loop().create_task(controller.run(stop))
        try:
            at_start = await shown_after("safe")
            # What `serving restart --profile fast` records once it succeeded.
            store.set_setting("serving_profile", "fast", by="cli")
            return at_start, await shown_after("fast")
        finally:
            stop.set()
            await task

    try:
        assert asyncio.run(scenario()) == ("safe", "fast")
    finally:
        store.close()
