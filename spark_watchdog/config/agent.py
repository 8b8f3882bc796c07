"""The node agent's configuration (``config/agent.example.yaml`` documents it)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlsplit

from spark_watchdog.config.files import read_yaml
from spark_watchdog.config.schema import InvalidSetting, load, setting
from spark_watchdog.errors import ConfigError

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True)
class ListenConfig:
    address: str = setting("127.0.0.1")
    port: int = setting(9720, minimum=1, maximum=65535)


@dataclass(frozen=True)
class CanaryConfig:
    enabled: bool = setting(False)
    model: str | None = setting(None)
    timeout: float = setting(10.0, above=0)
    min_interval: float = setting(30.0, minimum=0)


@dataclass(frozen=True)
class VllmProbeConfig:
    enabled: bool = setting(True)
    url: str | None = setting("http://127.0.0.1:8000")
    interval: float = setting(2.0, above=0)
    timeout: float = setting(2.0, above=0)
    stall_after: float = setting(15.0, above=0)
    max_body_bytes: int = setting(8 * 1024 * 1024, minimum=1024)
    process_match: str | None = setting(None)
    canary: CanaryConfig = setting(default_factory=CanaryConfig)

    def __post_init__(self) -> None:
        if self.url is not None:
            parts = urlsplit(self.url)
            if parts.scheme not in ("http", "https") or not parts.hostname:
                raise InvalidSetting(
                    "url", f'expected an http(s)://host[:port] URL, got "{self.url}"'
                )
        if self.timeout > self.interval * 5:
            raise InvalidSetting(
                "timeout",
                f"expected at most 5 times interval ({self.interval * 5:g}), got {self.timeout:g}",
            )


@dataclass(frozen=True)
class GpuProbeConfig:
    enabled: bool = setting(True)
    interval: float = setting(2.0, above=0)
    deadline: float = setting(3.0, above=0)
    low_power_watts: float = setting(30.0, minimum=0)


@dataclass(frozen=True)
class JournalProbeConfig:
    enabled: bool = setting(True)
    interval: float = setting(60.0, above=0)
    directory: str | None = setting(None)
    tail_entries: int = setting(20, minimum=0, maximum=1000)
    evidence_per_kind: int = setting(20, minimum=1, maximum=10000)
    max_boots: int = setting(20, minimum=1, maximum=1000)


@dataclass(frozen=True)
class HostProbeConfig:
    proc_root: str = setting("/proc")


@dataclass(frozen=True)
class ProbesConfig:
    vllm: VllmProbeConfig = setting(default_factory=VllmProbeConfig)
    gpu: GpuProbeConfig = setting(default_factory=GpuProbeConfig)
    journal: JournalProbeConfig = setting(default_factory=JournalProbeConfig)
    host: HostProbeConfig = setting(default_factory=HostProbeConfig)


@dataclass(frozen=True)
class AgentConfig:
    node: str = setting()
    listen: ListenConfig = setting(default_factory=ListenConfig)
    loop_interval: float = setting(1.0, above=0, maximum=60)
    probes: ProbesConfig = setting(default_factory=ProbesConfig)

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.node):
            raise InvalidSetting(
                "node",
                "expected a host-like name (letters, digits, '.', '_', '-'; "
                f'at most 63 characters), got "{self.node}"',
            )


def parse_agent_config(data: object, source: str = "agent config") -> AgentConfig:
    """Validate already-parsed YAML data; raise ConfigError listing every problem."""
    problems: list[str] = []
    config = load(AgentConfig, data, problems)
    if config is None or problems:
        raise ConfigError(source, problems)
    return config


def load_agent_config(path: str | Path) -> AgentConfig:
    return parse_agent_config(read_yaml(path), str(path))
