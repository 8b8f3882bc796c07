"""Is each config valid? The same loaders and messages as the daemons use.

A file that cannot be read at all is a usage error (exit 2): there is
nothing to check. A file that reads but does not validate is a failed check,
listing every problem the loader found, and the checks that need it are
skipped.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from spark_watchdog.config.agent import AgentConfig, parse_agent_config
from spark_watchdog.config.controller import ControllerConfig, parse_controller_config
from spark_watchdog.config.files import read_yaml
from spark_watchdog.doctor.result import Finding, fail, ok, warn
from spark_watchdog.errors import ConfigError


class ConfigUnreadable(Exception):
    """The config file does not exist or cannot be read."""


def _require_readable(path: Path, flag: str) -> None:
    """A regular file (a FIFO would block the open; /dev/zero never ends) that opens."""
    try:
        info = os.stat(path)
        if not stat.S_ISREG(info.st_mode):
            raise ConfigUnreadable(f"{flag} {path}: not a regular file; pass a YAML file")
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
        os.close(fd)
    except FileNotFoundError:
        raise ConfigUnreadable(f"{flag} {path}: file not found") from None
    except OSError as exc:
        raise ConfigUnreadable(f"{flag} {path}: cannot read it ({exc.strerror or exc})") from None


def load_agent(path: Path) -> tuple[Finding, AgentConfig | None]:
    """Validate the agent config. The serving token is not read here (the
    daemon's loader does that too): the token-file check reports on it, so a
    missing token does not hide every other node check."""
    _require_readable(path, "--agent-config")
    try:
        config = parse_agent_config(read_yaml(path), str(path))
    except ConfigError as exc:
        return fail(
            str(exc),
            "correct each key named above; config/agent.example.yaml documents every key, "
            f"and `spark-watchdog agent --config {path} --check` checks the file again",
        ), None
    serving = "serving enabled" if config.serving.enabled else "serving not managed by the agent"
    return ok(f"{path}: valid (node {config.node}, {serving})"), config


def load_controller(path: Path) -> tuple[Finding, ControllerConfig | None]:
    _require_readable(path, "--controller-config")
    try:
        config = parse_controller_config(read_yaml(path), str(path))
    except ConfigError as exc:
        return fail(
            str(exc),
            "correct each key named above; config/controller.example.yaml documents every "
            f"key, and `spark-watchdog controller --config {path} --check` checks it again",
        ), None
    names = ", ".join(node.name for node in config.nodes)
    valid = f"{path}: valid ({len(config.nodes)} node(s): {names})"
    if config.guards.dry_run:
        return warn(
            f"{valid}; but guards.dry_run is true: the controller decides and records, "
            "and never sends a power command",
            "set guards.dry_run: false once `spark-watchdog history` shows the decisions "
            "you expect",
        ), config
    return ok(valid), config
