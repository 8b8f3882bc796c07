"""The controller's configuration: nodes, their power paths, and the policy.

``config/controller.example.yaml`` documents every key. Power devices are
tagged by ``type``; each type accepts only its own keys. Secrets are only
``*_file`` keys (a path, or a credential name under $CREDENTIALS_DIRECTORY).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Literal
from urllib.parse import urlsplit

from spark_watchdog.config.addresses import (
    check_bind_address,
    check_host,
    check_http_url,
    check_tcp_target,
)
from spark_watchdog.config.colocated import Around, ColocatedConfig, check_colocated
from spark_watchdog.config.files import read_yaml
from spark_watchdog.config.history_location import check_url, is_postgres_url
from spark_watchdog.config.power_device_types import PhysicalTarget, power_device_type
from spark_watchdog.config.power_devices import (
    EXEC_NOT_SENT_EXIT as EXEC_NOT_SENT_EXIT,
)
from spark_watchdog.config.power_devices import (
    FORCED_REBOOT as FORCED_REBOOT,
)
from spark_watchdog.config.power_devices import (
    AuthProtocol as AuthProtocol,
)
from spark_watchdog.config.power_devices import (
    ExecDevice as ExecDevice,
)
from spark_watchdog.config.power_devices import (
    HomeAssistantDevice as HomeAssistantDevice,
)
from spark_watchdog.config.power_devices import (
    IpmiDevice as IpmiDevice,
)
from spark_watchdog.config.power_devices import (
    KasaDevice as KasaDevice,
)
from spark_watchdog.config.power_devices import (
    NutDevice as NutDevice,
)
from spark_watchdog.config.power_devices import (
    PowerDevice as PowerDevice,
)
from spark_watchdog.config.power_devices import (
    PrivProtocol as PrivProtocol,
)
from spark_watchdog.config.power_devices import (
    RedfishDevice as RedfishDevice,
)
from spark_watchdog.config.power_devices import (
    ShellyDevice as ShellyDevice,
)
from spark_watchdog.config.power_devices import (
    ShellyGen1Device as ShellyGen1Device,
)
from spark_watchdog.config.power_devices import (
    SnmpDevice as SnmpDevice,
)
from spark_watchdog.config.power_devices import (
    SshDevice as SshDevice,
)
from spark_watchdog.config.power_devices import (
    TasmotaDevice as TasmotaDevice,
)
from spark_watchdog.config.power_devices import (
    check_url_key as check_url_key,
)
from spark_watchdog.config.power_devices import kasa_library_missing, power_programs_unusable
from spark_watchdog.config.schema import InvalidSetting, load, setting
from spark_watchdog.errors import ConfigError
from spark_watchdog.redact import redact_message

_NODE_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,62}$")


@dataclass(frozen=True, kw_only=True)
class NodeConfig:
    name: str = setting()
    agent: str = setting()
    ssh_host: str | None = setting(None)
    ssh_port: int = setting(22, minimum=1, maximum=65535)
    power: tuple[PowerDevice, ...] = setting(default_factory=tuple)

    def __post_init__(self) -> None:
        if not _NODE_NAME.match(self.name):
            raise InvalidSetting("name", f'expected a host-like name, got "{self.name}"')
        check_url_key("agent", self.agent)
        if self.ssh_host is not None:
            check_host("ssh_host", self.ssh_host)

    @property
    def banner_host(self) -> str:
        """Where the SSH banner is read: ssh_host, else the agent's host."""
        return self.ssh_host or (urlsplit(self.agent).hostname or "")


@dataclass(frozen=True, kw_only=True)
class PolicyConfig:
    # GB10 "clock latch" clears only after 30-60 s without AC (tsw2k docs/GOTCHAS.md).
    power_off_seconds: float = setting(60.0, minimum=0, maximum=3600)
    power_timeout: float = setting(30.0, above=0, maximum=600)
    power_poll_interval: float = setting(1.0, above=0, maximum=60)
    min_command_interval: float = setting(2.0, minimum=0, maximum=3600)
    # Where the device can time a cycle (Shelly toggle_after, a Tasmota backlog,
    # an APC outlet reboot), the off arms it to switch on again by itself.
    self_timed_on: bool = setting(True)
    # Seconds of AC off that clear a GPU clock latch the agent found after a boot:
    # the node is halted over ssh, then the power path holds its AC off this long
    # (at least power_off_seconds) once it is silent. 0: alert only.
    clock_latch_off_seconds: float = setting(180.0, minimum=0, maximum=86400)


@dataclass(frozen=True, kw_only=True)
class DetectionConfig:
    # How often every agent's /v1/state is pulled.
    poll_interval: float = setting(1.0, above=0, maximum=60)
    # How long one pull may take.
    agent_timeout: float = setting(0.8, above=0, maximum=60)
    # Agent silence (no answer with an advancing seq) before a node can be host_frozen.
    freeze_after: float = setting(8.0, above=0, maximum=3600)
    # Consecutive missing SSH banners needed for host_frozen.
    banner_misses: int = setting(2, minimum=1, maximum=100)
    # Seconds to wait for an SSH banner.
    banner_timeout: float = setting(2.0, above=0, maximum=60)
    # Banner checks of a node whose agent answers (late agents are checked every poll).
    banner_interval: float = setting(15.0, above=0, maximum=3600)
    # Seconds of GPU reads timing out, on a node whose agent answers, before it is gpu_wedged.
    gpu_wedged_after: float = setting(30.0, above=0, maximum=86400)
    # Seconds of each node's snapshots kept and written into its incidents; 0 = none.
    flight_recorder_seconds: float = setting(120.0, minimum=0, maximum=3600)


@dataclass(frozen=True, kw_only=True)
class GuardsConfig:
    # Power cycles allowed per node in budget_window before the node is held.
    node_budget: int = setting(3, minimum=0, maximum=1000)
    # Power cycles allowed across the cluster in budget_window.
    cluster_budget: int = setting(8, minimum=0, maximum=10_000)
    # The budgets' window in seconds (6 h).
    budget_window: float = setting(21600.0, above=0, maximum=30 * 86400)
    # Power actions running at once; nodes frozen together are recovered one after another.
    max_concurrent_power_actions: int = setting(1, minimum=1, maximum=1000)
    # Above this fraction of nodes in host-level trouble at once, trip the circuit breaker.
    max_unhealthy_fraction: float = setting(0.5, above=0, maximum=1)
    # Seconds the breaker stays open (no fencing) before it latches into a cluster hold.
    breaker_latch_after: float = setting(30.0, minimum=0, maximum=86400)
    # Seconds to wait for the agent to answer with a new boot id after power is restored.
    boot_timeout: float = setting(300.0, above=0, maximum=86400)
    # A node with this many host_frozen incidents within suspect_window is flagged
    # hardware_suspect (status, metrics, an alert): power cycles only treat the symptom.
    suspect_freezes: int = setting(3, minimum=1, maximum=1000)
    suspect_window: float = setting(86400.0, above=0, maximum=30 * 86400)
    # Decide, record and notify, but send nothing to any device.
    dry_run: bool = setting(False)


# What the launcher's commands may name, each as ``{name}``; ``{vllm_args}``
# alone in an argument expands to several.
# docs/serving.md, "a cluster launcher"
LAUNCHER_PLACEHOLDERS = (
    "profile",
    "vllm_args",
    "compilation_config",
    "speculative_config",
    "extra_args",
)
# A placeholder: a name in braces. Other braces (a JSON argument) are the
# operator's own text.
PLACEHOLDER = re.compile(r"\{([a-z_]+)\}")
_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


@dataclass(frozen=True, kw_only=True)
class LauncherSshConfig:
    """How the controller logs in to ``launcher.run_on``'s node (its ``ssh_host``)."""

    user: str = setting()
    # A private key file (or credential name); ssh reads it, the controller never does.
    key_file: str = setting()
    # The node's host key, pinned: an unknown or changed key is refused.
    known_hosts_file: str = setting()
    connect_timeout: float = setting(5.0, above=0, maximum=300)

    def __post_init__(self) -> None:
        if not self.user or self.user.startswith("-") or any(c.isspace() for c in self.user):
            raise InvalidSetting(
                "user",
                f"expected a user name without whitespace, not starting with '-', "
                f"got {self.user!r}",
            )


@dataclass(frozen=True, kw_only=True)
class LauncherConfig:
    """Who stops and starts the ranks in a serving restart (docs/serving.md)."""

    # agents: each node's agent (POST /v1/serving/stop|start), in vLLM's order.
    # command: the cluster's own launcher (spark-vllm-docker, sparkrun, a script).
    type: Literal["agents", "command"] = setting("agents")
    # agents: the start order. native: workers first, the head last (vLLM's own
    # multi-node); ray: the head first (it runs the Ray head), then the workers.
    order: Literal["native", "ray"] = setting("native")
    # command: the launcher's stop and start, each an argv (no shell).
    stop: tuple[str, ...] = setting(())
    start: tuple[str, ...] = setting(())
    # command: where they run: "controller" (this host) or a node's name (over SSH).
    run_on: str = setting("controller")
    ssh: LauncherSshConfig | None = setting(None)
    # command: seconds each may take before it is killed (and the restart fails).
    stop_timeout: float = setting(300.0, above=0, maximum=86400)
    start_timeout: float = setting(600.0, above=0, maximum=86400)
    working_directory: str | None = setting(None)
    environment: dict[str, str] = setting(default_factory=dict)

    def __post_init__(self) -> None:
        if self.type == "agents":
            self._check_agents_only()
            return
        for key in ("stop", "start"):
            _check_launcher_argv(key, getattr(self, key))
        if self.run_on == "controller" and self.ssh is not None:
            raise InvalidSetting("ssh", 'only for run_on a node; run_on is "controller"')
        if self.run_on != "controller" and self.ssh is None:
            raise InvalidSetting(
                "ssh",
                f"required to run the launcher on {self.run_on}: user, key_file, known_hosts_file",
            )
        if self.working_directory is not None and not self.working_directory.startswith("/"):
            raise InvalidSetting(
                "working_directory", f'expected an absolute path, got "{self.working_directory}"'
            )
        for key in self.environment:
            if not _ENV_NAME.match(key):
                raise InvalidSetting(
                    f"environment.{key}",
                    "expected an environment variable name ([A-Za-z_][A-Za-z0-9_]*)",
                )

    def _check_agents_only(self) -> None:
        """A launcher of type agents takes none of the command launcher's settings."""
        for key in ("stop", "start"):
            if getattr(self, key):
                raise InvalidSetting(
                    key, 'only a launcher of type "command" runs commands; set type: command'
                )
        given = [
            key
            for key, unset in (
                ("run_on", self.run_on == "controller"),
                ("ssh", self.ssh is None),
                ("working_directory", self.working_directory is None),
                ("environment", not self.environment),
            )
            if not unset
        ]
        if given:
            raise InvalidSetting(
                given[0],
                'only for a launcher of type "command" (the agents restart the ranks '
                "themselves); set type: command, or remove it",
            )


def _check_launcher_argv(key: str, argv: tuple[str, ...]) -> None:
    """``stop``/``start``: an argv whose placeholders are known, {vllm_args} on its own."""
    if not argv or not argv[0].strip():
        raise InvalidSetting(key, "required with type command: the launcher's argv as a list")
    for i, argument in enumerate(argv):
        for name in PLACEHOLDER.findall(argument):
            if name not in LAUNCHER_PLACEHOLDERS:
                raise InvalidSetting(
                    f"{key}[{i}]",
                    f'unknown placeholder "{{{name}}}"; known: '
                    + ", ".join(f"{{{n}}}" for n in LAUNCHER_PLACEHOLDERS),
                )
        if "{vllm_args}" in argument and argument != "{vllm_args}":
            raise InvalidSetting(
                f"{key}[{i}]",
                '"{vllm_args}" expands to several arguments: give it as an argument of its own',
            )


@dataclass(frozen=True, kw_only=True)
class ServingConfig:
    # Node whose rank serves the HTTP API (rank 0); its vLLM state decides serving verdicts.
    head: str | None = setting(None)
    # Profile the cluster switches to after an incident, until an operator switches back.
    safe_profile: str = setting("safe")
    # File holding the bearer token of the agents' serving endpoints.
    token_file: str | None = setting(None)
    # Seconds for the head to answer /health 200 and progress (or a canary) after a restart.
    start_timeout: float = setting(600.0, above=0, maximum=86400)
    # Restart serving automatically on serving_stalled / serving_dead.
    auto_restart: bool = setting(True)
    # Seconds after a serving restart before another automatic one (no restart loop).
    restart_cooldown: float = setting(60.0, minimum=0, maximum=86400)
    # Automatic serving restarts allowed in restart_budget_window; then a person decides
    # (restart loops leak unified memory until the host dies: docs/design.md, "Memory guard").
    restart_budget: int = setting(6, minimum=1, maximum=1000)
    restart_budget_window: float = setting(3600.0, above=0, maximum=30 * 86400)
    # Who stops and starts the ranks: the agents (the default) or the cluster's launcher.
    launcher: LauncherConfig = setting(default_factory=LauncherConfig)
    # Nodes whose ranks every engine step of the head needs (its tensor- and
    # pipeline-parallel group): while the head's engine steps, each of them is
    # alive (docs/design.md, "Peers"). Empty (the default): the head's steps
    # prove nothing of other nodes. Name a node only if no step can happen
    # without its rank, under every profile: one named wrongly is never fenced
    # while the head steps, frozen or not.
    step_group: tuple[str, ...] = setting(default_factory=tuple)

    def step_nodes(self) -> tuple[str, ...]:
        """The nodes the head's engine steps prove alive; () without a head."""
        return () if self.head is None else self.step_group


@dataclass(frozen=True, kw_only=True)
class WebhookConfig:
    # URL that receives a JSON POST per event.
    url: str = setting()

    def __post_init__(self) -> None:
        check_http_url("url", self.url, base=False)


@dataclass(frozen=True, kw_only=True)
class NotifyConfig:
    # Generic JSON webhooks.
    webhooks: tuple[WebhookConfig, ...] = setting(default_factory=tuple)
    # Alertmanager base URL (alerts go to POST /api/v2/alerts), or null.
    alertmanager: str | None = setting(None)
    # Attempts per notification before it is dropped (and logged).
    attempts: int = setting(3, minimum=1, maximum=10)
    # Seconds one delivery may take.
    timeout: float = setting(5.0, above=0, maximum=300)

    def __post_init__(self) -> None:
        if self.alertmanager is not None:
            check_url_key("alertmanager", self.alertmanager)


@dataclass(frozen=True, kw_only=True)
class ControllerListenConfig:
    # Address for GET /v1/status and /metrics.
    address: str = setting("127.0.0.1")
    # TCP port.
    port: int = setting(9721, minimum=1, maximum=65535)
    # File (or systemd credential name) holding the bearer token of the page's
    # actions (hold, release, step down: docs/page.md); none: the page is read-only.
    token_file: str | None = setting(None)

    def __post_init__(self) -> None:
        check_bind_address("address", self.address)


# Seconds of lease a leader's write needs beyond two send deadlines
# (history/leadership.py): the last byte of a command leaves before expiry,
# not at it, with room for the database host's clock to run a little fast.
FENCE_MARGIN_S = 1.0


@dataclass(frozen=True, kw_only=True)
class LeadershipConfig:
    # The controller pair on a PostgreSQL history (docs/design.md, "Controller pair").
    # Seconds a leader's lease lasts, by the database's clock.
    lease: float = setting(20.0, above=0, maximum=3600)
    # Seconds between the leader's renewals (and a standby's tries).
    renew_every: float = setting(2.0, above=0, maximum=3600)
    # Seconds without a renewal after which the leader stops everything and exits.
    give_up_after: float = setting(8.0, above=0, maximum=3600)
    # Seconds after a step's transaction began within which its command may leave;
    # every power device's timeout must be within it.
    send_deadline: float = setting(5.0, above=0, maximum=3600)
    # Seconds a new leader waits before it acts.
    settle: float = setting(2.0, minimum=0, maximum=3600)

    def __post_init__(self) -> None:
        if self.renew_every >= self.give_up_after:
            raise InvalidSetting(
                "leadership.renew_every",
                f"must be below give_up_after ({self.give_up_after:g}s), got {self.renew_every:g}",
            )
        needed = self.give_up_after + 2 * self.send_deadline + FENCE_MARGIN_S
        if needed > self.lease:
            raise InvalidSetting(
                "leadership.lease",
                f"must be at least give_up_after + 2 x send_deadline + {FENCE_MARGIN_S:g} "
                f"({needed:g}s), got {self.lease:g}: a command may leave up to two send "
                "deadlines after its step began",
            )


def device_timeout(device: PowerDevice) -> float:
    """The longest a command to the device may take to leave after its gate (its type's
    ``send_time``, config/power_device_types.py): SNMP resends on a timeout; HTTPS
    shakes hands before the request."""
    return power_device_type(device).send_time(device)


def power_libraries_missing(config: ControllerConfig) -> list[str]:
    """The power paths whose library is an extra not installed here (python-kasa), or
    whose program cannot run (an ``exec`` command missing, a directory, not executable):
    ``--check`` and a start refuse them, rather than the first cycle failing."""
    paths = [
        (f"nodes[{n}].power[{p}]", device)
        for n, node in enumerate(config.nodes)
        for p, device in enumerate(node.power)
    ]
    return kasa_library_missing(paths) + power_programs_unusable(paths)


def pair_refusal(device: PowerDevice) -> str | None:
    """Why the device cannot serve a controller pair (None: it can): after the gate
    its command must be one request, with nothing to look up first."""
    return power_device_type(device).pair_refusal(device)


def _physical_targets(device: PowerDevice) -> list[PhysicalTarget]:
    """(identity, description, what) of each physical thing ``device`` switches, by its
    type's entry in config/power_device_types.py.

    Two entries with one identity cut the same power. SSH paths switch no
    power of their own and have none.
    """
    return power_device_type(device).physical_targets(device)


def _check_outlets_unshared(nodes: tuple[NodeConfig, ...]) -> None:
    """Refuse two power entries that switch one physical outlet, plug, BMC or system."""
    seen: dict[tuple[str, ...], tuple[int, str]] = {}
    for i, node in enumerate(nodes):
        for j, device in enumerate(node.power):
            key = f"nodes[{i}].power[{j}]"
            for identity, described, what in _physical_targets(device):
                first = seen.get(identity)
                if first is None:
                    seen[identity] = (i, key)
                    continue
                first_node, first_key = first
                if first_key == key:
                    why = f"{described} is listed twice in {key}"
                elif first_node == i:
                    why = (
                        f"{described} is already {first_key} of this node; "
                        f"a second path to one {what} is no fallback"
                    )
                else:
                    why = (
                        f"{described} is already {first_key} ({nodes[first_node].name}); "
                        f"two nodes on one {what} would cut both"
                    )
                raise InvalidSetting(key, why)


@dataclass(frozen=True, kw_only=True)
class ControllerConfig:
    nodes: tuple[NodeConfig, ...] = setting()
    policy: PolicyConfig = setting(default_factory=PolicyConfig)
    detection: DetectionConfig = setting(default_factory=DetectionConfig)
    guards: GuardsConfig = setting(default_factory=GuardsConfig)
    serving: ServingConfig = setting(default_factory=ServingConfig)
    notify: NotifyConfig = setting(default_factory=NotifyConfig)
    listen: ControllerListenConfig = setting(default_factory=ControllerListenConfig)
    # The freeze history: an SQLite file, or postgresql://user@host:port/database
    # (config/history_location.py), whose password is in history_password_file.
    history: str = setting("/var/lib/spark-watchdog/history.db")
    history_password_file: str | None = setting(None)
    leadership: LeadershipConfig = setting(default_factory=LeadershipConfig)
    # Targets the controller must reach before it fences anything: tcp://host:port.
    witness: tuple[str, ...] = setting(default_factory=tuple)
    # Controllers on the Sparks themselves, in order (config/colocated.py); None:
    # one controller on a host of its own (or the pair).
    colocated: ColocatedConfig | None = setting(None)

    def __post_init__(self) -> None:
        names = [n.name for n in self.nodes]
        for i, name in enumerate(names):
            if name in names[:i]:
                raise InvalidSetting(f"nodes[{i}].name", f'duplicate node name "{name}"')
        if not self.nodes:
            raise InvalidSetting("nodes", "expected at least one node")
        if self.serving.head is not None and self.serving.head not in names:
            raise InvalidSetting(
                "serving.head", f'expected one of the node names, got "{self.serving.head}"'
            )
        for i, name in enumerate(self.serving.step_group):
            if name not in names:
                raise InvalidSetting(
                    f"serving.step_group[{i}]",
                    f'expected one of the node names ({", ".join(names)}), got "{name}"',
                )
        run_on = self.serving.launcher.run_on
        if self.serving.launcher.type == "command" and run_on != "controller":
            if run_on not in names:
                raise InvalidSetting(
                    "serving.launcher.run_on",
                    f'expected "controller" or a node name ({", ".join(names)}), got "{run_on}"',
                )
            if self.node(run_on).ssh_host is None:
                raise InvalidSetting(
                    "serving.launcher.run_on",
                    f"node {run_on} has no ssh_host: give it one to run the launcher there",
                )
        if is_postgres_url(self.history):
            problems = check_url(self.history)
            if problems:
                raise InvalidSetting("history", "; ".join(problems))
            _check_device_timeouts(self.nodes, self.leadership.send_deadline)
        elif self.history_password_file is not None:
            raise InvalidSetting(
                "history_password_file",
                "only a postgresql:// history has a password; the history is a file here",
            )
        for i, target in enumerate(self.witness):
            check_tcp_target(f"witness[{i}]", target)
        _check_outlets_unshared(self.nodes)
        if self.colocated is not None:
            check_colocated(self.colocated, self._around())

    def _around(self) -> Around:
        """What the order of controllers on the Sparks is checked against."""
        return Around(
            nodes={n.name: (n.agent, n.ssh_host) for n in self.nodes},
            freeze_after=self.detection.freeze_after,
            listen_address=self.listen.address,
            listen_port=self.listen.port,
            witness=self.witness,
            postgres=is_postgres_url(self.history),
        )

    def node(self, name: str) -> NodeConfig:
        for node in self.nodes:
            if node.name == name:
                return node
        known = ", ".join(n.name for n in self.nodes)
        raise KeyError(f'no node "{name}" in the config; known: {known}')


def _check_device_timeouts(nodes: tuple[NodeConfig, ...], send_deadline: float) -> None:
    """In a pair, a command leaves within send_deadline of its gate: no socket may wait longer."""
    for n, node in enumerate(nodes):
        for p, device in enumerate(node.power):
            refusal = pair_refusal(device)
            if refusal is not None:
                raise InvalidSetting(f"nodes[{n}].power[{p}]", refusal)
            took = device_timeout(device)
            if took > send_deadline:
                key = "connect_timeout" if isinstance(device, SshDevice) else "timeout"
                raise InvalidSetting(
                    f"nodes[{n}].power[{p}].{key}",
                    f"a command may take {took:g}s to leave, more than leadership.send_deadline "
                    f"({send_deadline:g}s): lower the timeout (and retries), or raise "
                    "send_deadline together with leadership.lease",
                )


def parse_controller_config(data: object, source: str = "controller config") -> ControllerConfig:
    problems: list[str] = []
    config = load(ControllerConfig, data, problems)
    if config is None or problems:
        # A message may quote a URL the operator wrote (a plug's, a BMC's, the
        # history's): its credentials never reach a terminal or a log.
        raise ConfigError(source, [redact_message(p) for p in problems])
    return config


def load_controller_config(path: str | Path) -> ControllerConfig:
    return parse_controller_config(read_yaml(path), str(path))
