"""The configuration of one simulated run: four nodes behind a PDU and SSH,
the policy, guards and serving limits drawn from the run's random stream
(the same seed, the same configuration), with a test's overrides on top
(simulation/run.py)."""

from __future__ import annotations

import functools
import json
import os
import random
import tempfile
from typing import Any

from spark_watchdog.config.controller import ControllerConfig, parse_controller_config


@functools.lru_cache(maxsize=512)
def _parse(text: str) -> ControllerConfig:
    """Configs repeat across seeds; validating one takes longer than a short run's tick."""
    return parse_controller_config(json.loads(text), "simulation")


_TOKEN: list[str] = []


def _token_file() -> str:
    """A serving token file, so serving restarts run (and can be checked in dry run)."""
    if not _TOKEN:
        fd, path = tempfile.mkstemp(prefix="spark-watchdog-sim-token-")
        os.write(fd, b"simulated-token\n")
        os.close(fd)
        _TOKEN.append(path)
    return _TOKEN[0]


def _nodes(names: list[str]) -> list[dict[str, Any]]:
    """Each node on its PDU outlet, then SSH (its second power path)."""
    return [
        {
            "name": name,
            "agent": f"http://{name}:9720",
            "ssh_host": name,
            "power": [
                {
                    "type": "snmp",
                    "host": "pdu",
                    "outlet": i + 1,
                    "community_file": "/dev/null",
                },
                {
                    "type": "ssh",
                    "host": name,
                    "user": "root",
                    "key_file": "/dev/null",
                    "known_hosts_file": "/dev/null",
                },
            ],
        }
        for i, name in enumerate(names)
    ]


def random_config(
    rng: random.Random, names: list[str], dry_run: bool, overrides: dict[str, Any]
) -> ControllerConfig:
    """The run's configuration, drawn from ``rng`` (in this order: a seed replays it)."""
    off = rng.choice([5.0, 10.0, 30.0, 60.0])
    nodes = _nodes(names)
    window = rng.choice([600.0, 1800.0, 21600.0])
    data: dict[str, Any] = {
        "nodes": nodes,
        "policy": {
            "power_off_seconds": off,
            "power_timeout": rng.choice([5.0, 15.0]),
            "min_command_interval": rng.choice([0.0, 2.0]),
        },
        "detection": {"freeze_after": rng.choice([4.0, 8.0])},
        "guards": {
            "node_budget": rng.choice([1, 2, 3]),
            "cluster_budget": rng.choice([2, 4, 8]),
            "budget_window": window,
            "max_concurrent_power_actions": rng.choice([1, 1, 2]),
            "boot_timeout": rng.choice([45.0, 90.0]),
            "breaker_latch_after": rng.choice([0.0, 30.0]),
            "dry_run": dry_run,
        },
        "serving": {
            "head": names[0],
            "token_file": _token_file(),
            "restart_cooldown": rng.choice([0.0, 10.0, 60.0]),
            "restart_budget": rng.choice([1, 2, 6]),
            "restart_budget_window": rng.choice([300.0, 3600.0]),
            # One engine over every node: each step needs every rank (simulation/fabric.py).
            "step_group": list(names),
        },
        "witness": ["tcp://gateway:53"],
        "history": ":memory:",
    }
    for section, values in overrides.items():
        data[section] = {**data.get(section, {}), **values}
    return _parse(json.dumps(data, sort_keys=True))
