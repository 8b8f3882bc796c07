"""An agent restart as a part of its own (controller/act/agent_restart.py), built
from only what it works with: the config, a real history, the notifier, a
clock and the one I/O seam it uses (the restart over SSH)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, cast

from spark_watchdog.config.controller import SshDevice, parse_controller_config
from spark_watchdog.controller.act.agent_restart import AGENT_RESTART_COOLDOWN_S, AgentRestarts
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.history.store import HistoryStore


class Told:
    def __init__(self) -> None:
        self.kinds: list[str] = []

    def send(self, event: Event) -> None:
        self.kinds.append(event.kind)


class Clock:
    now = 100.0

    def monotonic(self) -> float:
        return self.now

    def time(self) -> float:
        return 1_800_000_000.0 + self.now


class Ssh:
    """The I/O seam: what was restarted, and whether the history had it first."""

    def __init__(self, store: HistoryStore) -> None:
        self.store = store
        self.sent: list[str] = []
        self.recorded_first: list[bool] = []

    async def agent_restart(self, device: SshDevice) -> str:
        actions = self.store.actions(node="spark-1", limit=5)
        self.recorded_first.append(any(a.operation == "agent_restart" for a in actions))
        self.sent.append(device.host)
        return "restarted"


async def _restart(tmp_path: Path, *, dry_run: bool) -> tuple[Told, Ssh, NodeWatch, AgentRestarts]:
    key, hosts = tmp_path / "key", tmp_path / "known_hosts"
    key.write_text("k\n")
    key.chmod(0o600)
    hosts.write_text("h\n")
    config = parse_controller_config(
        {
            "nodes": [
                {
                    "name": "spark-1",
                    "agent": "http://127.0.0.1:9",
                    "ssh_host": "127.0.0.1",
                    "power": [
                        {
                            "type": "ssh",
                            "host": "127.0.0.1",
                            "user": "watchdog",
                            "key_file": str(key),
                            "known_hosts_file": str(hosts),
                        }
                    ],
                }
            ],
            "guards": {"dry_run": dry_run},
            "history": str(tmp_path / "history.db"),
        },
        "test",
    )
    store, told, clock = HistoryStore(config.history), Told(), Clock()

    async def inline(fn: Any) -> Any:
        return fn()

    ssh = Ssh(store)
    ledger = Ledger(store, cast(Notifier, told), inline)
    restarts = AgentRestarts(config, ledger, cast(Notifier, told), cast(Any, clock), cast(Any, ssh))
    watch = NodeWatch(config.nodes[0], clock.now)
    restarts.restart(watch)
    for task in list(restarts.tasks.values()):
        await task
    return told, ssh, watch, restarts


def test_a_restart_is_alerted_recorded_before_it_is_sent_and_then_cools_down(
    tmp_path: Path,
) -> None:
    told, ssh, watch, restarts = asyncio.run(_restart(tmp_path, dry_run=False))
    assert told.kinds == ["agent_down"]
    assert ssh.sent == ["127.0.0.1"] and ssh.recorded_first == [True]
    now = Clock.now
    assert restarts.cooling(watch, now + AGENT_RESTART_COOLDOWN_S - 1)
    assert not restarts.cooling(watch, now + AGENT_RESTART_COOLDOWN_S)
    assert not restarts.running("spark-1")


def test_in_dry_run_it_is_alerted_and_nothing_is_sent(tmp_path: Path) -> None:
    told, ssh, _, _ = asyncio.run(_restart(tmp_path, dry_run=True))
    assert told.kinds == ["agent_down"]
    assert ssh.sent == []
