"""The node agent's configuration (``config/agent.example.yaml`` documents it)."""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal
from urllib.parse import urlsplit

from spark_watchdog.config.addresses import check_bind_address, check_http_url
from spark_watchdog.config.files import read_yaml
from spark_watchdog.config.launch_values import (
    SHM_SIZE_MAX,
    SHM_SIZE_MIN,
    check_container_user,
    check_image_reference,
    printable,
    size_bytes,
)
from spark_watchdog.config.schema import InvalidSetting, load, setting
from spark_watchdog.config.secrets import check_secret
from spark_watchdog.errors import ConfigError
from spark_watchdog.profiles import (
    BUILTIN_PROFILES,
    SAFE,
    Profile,
    ProfileError,
    apply_profile,
)
from spark_watchdog.redact import redact_argv

# The shortest heartbeat: a peer's seq rises by at most one per this many
# seconds (agent/peer_sightings.py; docs/design.md, "Peers").
MIN_LOOP_INTERVAL = 0.1

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")
_PROFILE_NAME = _NODE_NAME
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True)
class ListenConfig:
    address: str = setting("127.0.0.1")
    port: int = setting(9720, minimum=1, maximum=65535)

    def __post_init__(self) -> None:
        check_bind_address("address", self.address)


@dataclass(frozen=True)
class CanaryConfig:
    enabled: bool = setting(True)
    model: str | None = setting(None)
    # An idle head answers a 1-token request in milliseconds on the CPU build (not
    # yet measured on a Spark); two misses in a row are needed (docs/vllm.md), so
    # an idle hang shows in about
    # idle_after + 2 x timeout + two scrapes: about 12-25 s at these defaults.
    timeout: float = setting(5.0, above=0, maximum=600)
    min_interval: float = setting(30.0, minimum=0, maximum=86400)
    # Seconds of a quiet head (no request, no engine step) before a canary; 0 = never.
    idle_after: float = setting(10.0, minimum=0, maximum=86400)
    # File (or credential name) holding the server's API key (vLLM's --api-key or
    # VLLM_API_KEY): sent as a bearer token with the canary; /health and /metrics
    # need none.
    api_key_file: str | None = setting(None)


@dataclass(frozen=True)
class VllmProbeConfig:
    enabled: bool = setting(True)
    url: str | None = setting("http://127.0.0.1:8000")
    interval: float = setting(2.0, above=0, maximum=3600)
    timeout: float = setting(2.0, above=0, maximum=600)
    stall_after: float = setting(15.0, above=0, maximum=86400)
    dead_after: float = setting(5.0, minimum=0, maximum=86400)
    max_body_bytes: int = setting(8 * 1024 * 1024, minimum=1024, maximum=256 * 1024 * 1024)
    process_match: str | None = setting(None)
    canary: CanaryConfig = setting(default_factory=CanaryConfig)

    def __post_init__(self) -> None:
        if self.url is not None:
            check_http_url("url", self.url)
        if self.timeout > self.interval * 5:
            raise InvalidSetting(
                "timeout",
                f"expected at most 5 times interval ({self.interval * 5:g}), got {self.timeout:g}",
            )


@dataclass(frozen=True)
class GpuProbeConfig:
    enabled: bool = setting(True)
    interval: float = setting(2.0, above=0, maximum=3600)
    deadline: float = setting(3.0, above=0, maximum=600)
    low_power_watts: float = setting(30.0, minimum=0, maximum=10_000)


@dataclass(frozen=True)
class JournalProbeConfig:
    enabled: bool = setting(True)
    interval: float = setting(60.0, above=0, maximum=86400)
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
class MemoryGuardConfig:
    """The memory guard (:mod:`spark_watchdog.agent.memory_guard`); sizes in GiB."""

    enabled: bool = setting(True)
    floor_gib: float = setting(1.0, minimum=0, maximum=4096)
    watch_below_gib: float = setting(6.0, above=0, maximum=4096)
    lead_time: float = setting(4.0, above=0, maximum=600)
    min_fall_gib_per_s: float = setting(0.25, above=0, maximum=4096)
    slope_window: float = setting(3.0, above=0, maximum=60)
    psi_full: float = setting(20.0, minimum=0, maximum=100)
    no_memory_per_min: float = setting(60.0, minimum=0, maximum=1_000_000)
    confirm: int = setting(2, minimum=1, maximum=60)
    rearm_after: float = setting(30.0, minimum=0, maximum=86400)

    def __post_init__(self) -> None:
        if self.floor_gib >= self.watch_below_gib:
            raise InvalidSetting(
                "floor_gib",
                f"expected less than watch_below_gib ({self.watch_below_gib:g}), "
                f"got {self.floor_gib:g}",
            )


@dataclass(frozen=True)
class GpuClockCheckConfig:
    """The post-boot clock-latch check (:mod:`spark_watchdog.agent.clock_check`)."""

    enabled: bool = setting(True)
    floor_mhz: int = setting(1400, minimum=1, maximum=100_000)
    busy_util_pct: int = setting(60, minimum=1, maximum=100)
    busy_samples: int = setting(10, minimum=1, maximum=10_000)
    window: float = setting(1800.0, above=0, maximum=7 * 86400)


@dataclass(frozen=True)
class ServingProfileConfig:
    """One named profile; ``{}`` / ``[]`` change nothing."""

    speculative_config: dict[str, Any] = setting(default_factory=dict)
    compilation_config: dict[str, Any] = setting(default_factory=dict)
    extra_args: tuple[str, ...] = setting(())


_CONTAINER_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
_LABEL_KEY = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._/-]{0,127}$")


@dataclass(frozen=True)
class DockerServingConfig:
    """``serving.runtime: docker``: the rank as one container of the local
    Docker Engine, created from ``image`` with ``serving.command`` as its
    command (docs/serving.md)."""

    image: str | None = setting(None)
    # The one container of this node's rank: the agent creates, stops, kills and
    # removes it, and adopts one of this name that it finds already there.
    name: str = setting("spark-watchdog-rank")
    # Or adopt a container by its labels (a compose service, a launcher's container).
    adopt_labels: dict[str, str] = setting(default_factory=dict)
    socket: str = setting("/var/run/docker.sock")
    # Seconds for one call of the Engine API (create, kill, inspect).
    api_timeout: int = setting(10, minimum=1, maximum=120)
    privileged: bool = setting(False)
    gpus: Literal["all", "none"] = setting("all")
    ipc: Literal["host", "private"] = setting("host")
    # Docker's size grammar (16g, 512m), from 1m to 1t (docs/serving.md).
    shm_size: str | None = setting(None)
    # HOST:CONTAINER[:ro|rw], both absolute: the model files and vLLM's compile
    # cache belong here, so that a restart does not pay for them again.
    volumes: tuple[str, ...] = setting(())
    user: str | None = setting(None)
    # Only "no": a daemon restarting the rank behind the watchdog's back undoes
    # every safe restart (and brought rank 0 back against a stale rank 1).
    restart_policy: str = setting("no")

    def __post_init__(self) -> None:
        if self.image is not None and not self.image.strip():
            raise InvalidSetting("image", "expected an image reference, got an empty string")
        if self.image is not None:
            check_image_reference("image", self.image)
        if self.shm_size is not None:
            size_bytes("shm_size", self.shm_size, SHM_SIZE_MIN, SHM_SIZE_MAX)
        if self.user is not None:
            check_container_user("user", self.user)
        if not _CONTAINER_NAME.match(self.name):
            raise InvalidSetting(
                "name",
                "expected a container name (letters, digits, '_', '.', '-'; "
                f'starting with a letter or digit), got "{self.name}"',
            )
        for key in self.adopt_labels:
            if not _LABEL_KEY.match(key):
                raise InvalidSetting(f"adopt_labels.{key}", "expected a label key")
        if not os.path.isabs(self.socket):
            raise InvalidSetting("socket", f'expected an absolute path, got "{self.socket}"')
        if self.restart_policy != "no":
            raise InvalidSetting(
                "restart_policy",
                f'"{self.restart_policy}" would let the Docker daemon restart the rank behind '
                'the watchdog\'s back and undo every safe restart; set it to "no" (and drop '
                "restart: from a compose file whose container the agent adopts)",
            )
        self._check_volumes()

    def _check_volumes(self) -> None:
        for i, volume in enumerate(self.volumes):
            parts = volume.split(":")
            if (
                len(parts) not in (2, 3)
                or not all(os.path.isabs(part) for part in parts[:2])
                or (len(parts) == 3 and parts[2] not in ("ro", "rw"))
            ):
                raise InvalidSetting(
                    f"volumes[{i}]",
                    "expected HOST:CONTAINER or HOST:CONTAINER:ro (absolute paths), "
                    f'got "{volume}"',
                )

    @property
    def shm_size_bytes(self) -> int | None:
        """``shm_size`` in bytes (checked at load), as it is handed to the Engine."""
        if self.shm_size is None:
            return None
        return size_bytes("shm_size", self.shm_size, SHM_SIZE_MIN, SHM_SIZE_MAX)


@dataclass(frozen=True)
class ServingConfig:
    enabled: bool = setting(False)
    # What holds the rank: a process group the agent forks, or a Docker container.
    runtime: Literal["process", "docker"] = setting("process")
    docker: DockerServingConfig = setting(default_factory=DockerServingConfig)
    command: tuple[str, ...] = setting(())
    profiles: dict[str, ServingProfileConfig] = setting(default_factory=dict)
    default_profile: str = setting(SAFE)
    token_file: str | None = setting(None)
    log_file: str = setting("/var/lib/spark-watchdog/serving.log")
    stop_timeout: float = setting(30.0, above=0, maximum=3600)
    working_directory: str | None = setting(None)
    environment: dict[str, str] = setting(default_factory=dict)
    # Flags whose values are hidden (***) wherever the argv is shown or stored.
    secret_flags: tuple[str, ...] = setting(())
    # Before a stop: the Python stacks of the rank's processes (py-spy), within this budget.
    stack_dump: bool = setting(True)
    stack_dump_timeout: float = setting(5.0, above=0, maximum=60)

    def __post_init__(self) -> None:
        known = self._check_profiles()
        for key in self.environment:
            if not _ENV_NAME.match(key):
                raise InvalidSetting(
                    f"environment.{key}",
                    "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                )
        if not self.enabled:
            return
        self._check_launch()
        # A command a profile cannot be merged into is a config error now, not a
        # failed restart in the middle of an incident.
        for name, profile in sorted(known.items()):
            try:
                apply_profile(self.command, profile)
            except ProfileError as exc:
                raise InvalidSetting("command", f"profile {name}: {exc}") from None

    def _check_profiles(self) -> dict[str, Profile]:
        """Secret flags, profile names, profiles free of secrets, the default among them.

        Returns every profile (built-in and configured) by name.
        """
        for i, flag in enumerate(self.secret_flags):
            if not flag.startswith("-") or "=" in flag or " " in flag:
                raise InvalidSetting(
                    f"secret_flags[{i}]", f'expected a flag like "--api-key", got "{flag}"'
                )
        for name in self.profiles:
            if not _PROFILE_NAME.match(name):
                raise InvalidSetting(
                    f"profiles.{name}",
                    "expected a profile name of letters, digits, '.', '_', '-' "
                    "(at most 63 characters)",
                )
        for name, configured in sorted(self.profiles.items()):
            extra = list(configured.extra_args)
            if redact_argv(extra, self.secret_flags) != extra:
                raise InvalidSetting(
                    f"profiles.{name}.extra_args",
                    "carries a secret value: a profile's settings are shown by GET /v1/serving "
                    "to anyone who reaches the agent, and handed to the cluster's launcher; "
                    "keep the secret in serving.command (shown as ***) or in the server's "
                    "environment (e.g. VLLM_API_KEY)",
                )
        known = self.all_profiles()
        if self.default_profile not in known:
            raise InvalidSetting(
                "default_profile",
                f'expected one of {", ".join(sorted(known))}, got "{self.default_profile}"',
            )
        return known

    def _check_launch(self) -> None:
        """What an enabled launcher needs: a command (or a container to re-create),
        a token, absolute paths, an image for a docker command."""
        if not self.command and not self.recreates_found_container:
            raise InvalidSetting(
                "command",
                "required when serving is enabled: the rank's launch argv as a list "
                "(with runtime docker, leave out both command and docker.image to re-create "
                "the container the cluster's launcher started from its own spec)",
            )
        if self.token_file is None:
            raise InvalidSetting(
                "token_file",
                "required when serving is enabled: a file (or systemd credential name) "
                "holding the bearer token the controller sends",
            )
        if not os.path.isabs(self.log_file):
            raise InvalidSetting("log_file", f'expected an absolute path, got "{self.log_file}"')
        if self.runtime == "docker" and self.docker.image is None and self.command:
            raise InvalidSetting(
                "docker.image",
                "required with serving.command when serving.runtime is docker: the image the "
                "rank's container is created from (the one your docker run or compose file "
                "names); or leave out both to re-create the launcher's container from its spec",
            )
        if self.working_directory is not None and not os.path.isabs(self.working_directory):
            raise InvalidSetting(
                "working_directory", f'expected an absolute path, got "{self.working_directory}"'
            )

    @property
    def recreates_found_container(self) -> bool:
        """The rank is the container the cluster's launcher started (found by
        ``docker.name`` or ``docker.adopt_labels``); a start re-creates it from
        its own spec with the profile merged (docs/serving.md)."""
        return self.runtime == "docker" and not self.command and self.docker.image is None

    def all_profiles(self) -> dict[str, Profile]:
        """Built-in profiles (safe, plain) overlaid by the configured ones."""
        merged = dict(BUILTIN_PROFILES)
        for name, p in self.profiles.items():
            merged[name] = Profile(
                name, p.speculative_config, p.compilation_config, tuple(p.extra_args)
            )
        return merged


@dataclass(frozen=True)
class PeerConfig:
    """Another node's agent, asked for its pulse over a path that is not the management one."""

    name: str = setting()
    # The peer agent's base URL on the fabric (its ConnectX-7 address), not its management one.
    url: str = setting()

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.name):
            raise InvalidSetting("name", f'expected a node name, got "{self.name}"')
        _refuse_peer_credentials("url", self.url)
        check_http_url("url", self.url)


def _refuse_peer_credentials(key: str, url: str) -> None:
    """A peer's URL carries no ``user:password@``, query or fragment: pulses are
    unauthenticated, and the URL is shown in ``/v1/state`` (to anyone who reaches
    the agent) and in the agent's log. Refused without showing what was there."""
    scheme, _, rest = url.partition("://")
    authority = re.split(r"[/?#]", rest, maxsplit=1)[0]
    host = authority.rpartition("@")[2].partition(";")[0]
    if "@" in authority:
        raise InvalidSetting(
            key,
            "expected the peer agent's URL without a user or password: pulses carry no "
            "credentials, and the URL is shown in /v1/state and the agent's log; remove "
            f'"USER:PASSWORD@" (got "{printable(scheme)}://***@{printable(host)}...")',
        )
    if any(mark in rest for mark in "?#;"):
        raise InvalidSetting(
            key,
            "expected the peer agent's base URL without a query, fragment or ;parameters "
            "(pulses carry no token, and the URL is shown in /v1/state and the agent's log), "
            f'got "{printable(scheme)}://{printable(host)}/***"',
        )


@dataclass(frozen=True)
class PeeringConfig:
    """How often and how patiently the peers are asked (docs/design.md, "Peers")."""

    interval: float = setting(1.0, above=0, maximum=60)
    timeout: float = setting(0.5, above=0, maximum=10)

    def __post_init__(self) -> None:
        if self.timeout > self.interval:
            raise InvalidSetting(
                "timeout",
                f"expected at most interval ({self.interval:g} s), got {self.timeout:g}",
            )


@dataclass(frozen=True)
class AgentConfig:
    node: str = setting()
    listen: ListenConfig = setting(default_factory=ListenConfig)
    # Peers read a seq rising faster than one a MIN_LOOP_INTERVAL as forged.
    loop_interval: float = setting(1.0, minimum=MIN_LOOP_INTERVAL, maximum=60)
    # Well inside the unit's TimeoutStopSec=15s, after which systemd SIGKILLs.
    shutdown_linger: float = setting(3.0, minimum=0, maximum=10)
    probes: ProbesConfig = setting(default_factory=ProbesConfig)
    serving: ServingConfig = setting(default_factory=ServingConfig)
    memory_guard: MemoryGuardConfig = setting(default_factory=MemoryGuardConfig)
    gpu_clock_check: GpuClockCheckConfig = setting(default_factory=GpuClockCheckConfig)
    peers: tuple[PeerConfig, ...] = setting(())
    peering: PeeringConfig = setting(default_factory=PeeringConfig)

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.node):
            raise InvalidSetting(
                "node",
                "expected a host-like name (letters, digits, '.', '_', '-'; "
                f'at most 63 characters), got "{self.node}"',
            )
        _check_peers(self.node, self.peers)
        window = self.memory_guard.slope_window
        if self.memory_guard.enabled and window < 2 * self.loop_interval:
            raise InvalidSetting(
                "memory_guard.slope_window",
                f"expected at least twice loop_interval ({2 * self.loop_interval:g} s: "
                f"a slope needs three readings), got {window:g}",
            )


def _check_peers(node: str, peers: tuple[PeerConfig, ...]) -> None:
    seen: set[str] = set()
    for i, peer in enumerate(peers):
        if peer.name == node:
            raise InvalidSetting(
                f"peers[{i}].name",
                f'"{peer.name}" is this node itself (node: {node}): list the other nodes only',
            )
        if peer.name in seen:
            raise InvalidSetting(f"peers[{i}].name", f'"{peer.name}" is listed twice')
        seen.add(peer.name)


def peers_on_management(config: AgentConfig) -> list[str]:
    """The peers whose URL is on this agent's own listen address: not a second path.

    Only knowable when the agent listens on one address (not 0.0.0.0 or ::).
    """
    listen = config.listen.address
    if listen in ("0.0.0.0", "::", ""):
        return []
    return [
        peer.name
        for peer in config.peers
        if (urlsplit(peer.url).hostname or "").lower() == listen.lower()
    ]


def parse_agent_config(data: object, source: str = "agent config") -> AgentConfig:
    """Validate already-parsed YAML data; raise ConfigError listing every problem."""
    problems: list[str] = []
    config = load(AgentConfig, data, problems)
    if config is None or problems:
        raise ConfigError(source, problems)
    return config


def load_agent_config(path: str | Path, environ: Mapping[str, str] | None = None) -> AgentConfig:
    """Load and validate for a start: the token and API key files, when named, must be
    private, non-blank files now (a missing token is a config error, exit 2, not a 401 at the
    first restart). ``agent --check`` checks it with
    :func:`spark_watchdog.config.secret_refs.check_secrets` instead."""
    config = parse_agent_config(read_yaml(path), str(path))
    named = {
        "serving.token_file": config.serving.token_file,
        "probes.vllm.canary.api_key_file": config.probes.vllm.canary.api_key_file,
    }
    for key, reference in named.items():
        if reference is None:
            continue
        try:
            check_secret(key, reference, environ)
        except ConfigError as exc:
            raise ConfigError(str(path), exc.problems) from None
    return config
