"""Which checks run for a node and for a controller, with their deadlines; and the run."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from spark_watchdog.config.agent import AgentConfig
from spark_watchdog.config.controller import ControllerConfig, NodeConfig
from spark_watchdog.doctor import hw_watchdog
from spark_watchdog.doctor.clock_skew import SAMPLE_GAP_S, SAMPLES, check_clock_skew
from spark_watchdog.doctor.colocated_checks import ASK_TIMEOUT_S, check_controller
from spark_watchdog.doctor.config_checks import load_agent, load_controller
from spark_watchdog.doctor.controller_checks import (
    AGENT_PATIENCE_S,
    WITNESS_TIMEOUT_S,
    check_agent,
    check_banner,
    check_witness_targets,
)
from spark_watchdog.doctor.docker_checks import check_docker
from spark_watchdog.doctor.journal_checks import (
    check_persistent,
    check_previous_boot,
    check_sync_interval,
)
from spark_watchdog.doctor.launcher_checks import REMOTE_TIMEOUT_S, check_launcher
from spark_watchdog.doctor.node_checks import (
    check_gpu,
    check_peer_pulses,
    check_restart_policy,
    check_vllm,
)
from spark_watchdog.doctor.peer_checks import check_peers
from spark_watchdog.doctor.power_check import (
    check_power_coverage,
    check_power_path,
    power_timeout_s,
)
from spark_watchdog.doctor.result import Check, DoctorReport, Finding, skip
from spark_watchdog.doctor.runner import PlannedCheck, Progress, in_daemon_thread, run_plan
from spark_watchdog.doctor.secret_files import (
    SecretReference,
    agent_secrets,
    check_secret_file,
    controller_secrets,
)
from spark_watchdog.power.paths import power_paths
from spark_watchdog.probes.gpu import GpuProbe

# Reading a big journal (20 boots of kernel lines) takes seconds, not minutes.
JOURNAL_TIMEOUT_S = 60.0
QUICK_TIMEOUT_S = 10.0


@dataclass(frozen=True)
class NodeHost:
    """Where a node's system files are (``root``) and how systemd is asked.

    The defaults are the real machine; tests give a tree and a runner of their own.
    """

    root: Path = Path("/")
    run_systemd: hw_watchdog.Runner = field(default=hw_watchdog._run)


def _blocking(work: Callable[[], Finding]) -> Callable[[], Awaitable[Finding]]:
    return lambda: in_daemon_thread(work)


def _secret_checks(prefix: str, secrets: list[SecretReference], root: Path) -> list[PlannedCheck]:
    return [
        PlannedCheck(
            f"{prefix}.secret.{secret.key_path}",
            f"secret file {secret.key_path}",
            QUICK_TIMEOUT_S,
            _blocking(partial(check_secret_file, secret, root=root)),
        )
        for secret in secrets
    ]


def _journal_plan(config: AgentConfig, host: NodeHost) -> list[PlannedCheck]:
    """The journal's checks: its storage, journald's sync interval, the previous boot."""
    journal = config.probes.journal
    return [
        PlannedCheck(
            "node.journal.persistent",
            "the journal's storage",
            QUICK_TIMEOUT_S,
            _blocking(partial(check_persistent, journal.directory, host.root)),
        ),
        PlannedCheck(
            "node.journal.sync_interval",
            "journald's sync interval",
            QUICK_TIMEOUT_S,
            _blocking(partial(check_sync_interval, host.root)),
        ),
        PlannedCheck(
            "node.journal.previous_boot",
            "the previous boot in the journal",
            JOURNAL_TIMEOUT_S,
            _blocking(partial(check_previous_boot, journal)),
        ),
    ]


def node_plan(config: AgentConfig, host: NodeHost | None = None) -> list[PlannedCheck]:
    host = host or NodeHost()
    gpu, vllm = config.probes.gpu, config.probes.vllm
    plan = [
        *_journal_plan(config, host),
        PlannedCheck(
            "node.watchdog",
            "the hardware watchdog",
            QUICK_TIMEOUT_S + 5.0,  # two systemd queries of at most 5 s each
            _blocking(partial(hw_watchdog.check_hardware_watchdog, host.root, host.run_systemd)),
        ),
        PlannedCheck(
            "node.gpu",
            "NVML",
            gpu.deadline + GpuProbe.start_allowance_s + 5.0,  # a fresh worker, then a margin
            partial(check_gpu, config),
        ),
        PlannedCheck(
            "node.vllm",
            f"vLLM at {vllm.url}",
            vllm.timeout + 5.0,
            _blocking(partial(check_vllm, config)),
        ),
        PlannedCheck(
            "node.peers",
            "the peers' pulses",
            len(config.peers) * config.peering.timeout * 2 + 5.0,  # a retry each at most
            _blocking(partial(check_peer_pulses, config)),
        ),
        _constant("node.serving.restart_policy", check_restart_policy(config.serving.command)),
        PlannedCheck(
            "node.serving.docker",
            "the rank's container",
            config.serving.docker.api_timeout * 3 + 5.0,  # ping, inspect, image
            _blocking(partial(check_docker, config)),
        ),
    ]
    secrets = agent_secrets(config)
    if not secrets:
        plan.append(_constant("node.secret.serving.token_file", _no_token()))
    return plan + _secret_checks("node", secrets, host.root)


def _no_token() -> Finding:
    return skip("no serving.token_file: the agent does not manage serving, so it has no token")


def _constant(name: str, finding: Finding) -> PlannedCheck:
    async def run() -> Finding:
        return finding

    return PlannedCheck(name, name, QUICK_TIMEOUT_S, run)


def _node_plan(config: ControllerConfig, node: NodeConfig) -> list[PlannedCheck]:
    """What the controller checks of one node: its agent, clock, SSH banner, power."""
    detection = config.detection
    plan: list[PlannedCheck] = []
    name = node.name
    paths = power_paths(config, node)
    plan += [
        PlannedCheck(
            f"controller.agent.{name}",
            f"the agent of {name}",
            AGENT_PATIENCE_S + 2.0,
            partial(check_agent, node, detection),
        ),
        PlannedCheck(
            f"controller.clock.{name}",
            f"the clock of {name}",
            SAMPLES * (AGENT_PATIENCE_S + SAMPLE_GAP_S) + 2.0,
            partial(check_clock_skew, node),
        ),
        PlannedCheck(
            f"controller.ssh.{name}",
            f"the SSH banner of {name}",
            detection.banner_timeout + 3.0,
            partial(check_banner, node, detection),
        ),
        _constant(f"controller.power.{name}", check_power_coverage(name, paths)),
    ]
    for path in paths:
        which = f" (path {path.index + 1})" if len(paths) > 1 else ""
        plan.append(
            PlannedCheck(
                f"controller.power.{name}.{path.index + 1}",
                f"the power device of {name}{which}",
                power_timeout_s(config, path),
                partial(check_power_path, config, path),
            )
        )
    return plan


def controller_plan(config: ControllerConfig, root: Path = Path("/")) -> list[PlannedCheck]:
    plan: list[PlannedCheck] = []
    for node in config.nodes:
        plan += _node_plan(config, node)
    plan.append(
        PlannedCheck(
            "controller.serving.launcher",
            "the cluster launcher's commands",
            REMOTE_TIMEOUT_S * 2 + 3.0,
            partial(check_launcher, config),
        )
    )
    plan.append(
        PlannedCheck(
            "controller.peers",
            "the agents' watch on each other over a second path",
            AGENT_PATIENCE_S + 2.0,
            partial(check_peers, config),
        )
    )
    plan.append(
        PlannedCheck(
            "controller.witness",
            "the witness targets",
            WITNESS_TIMEOUT_S + 3.0,
            partial(check_witness_targets, config.witness),
        )
    )
    plan += _colocated_plan(config)
    return plan + _secret_checks("controller", controller_secrets(config), root)


def _colocated_plan(config: ControllerConfig) -> list[PlannedCheck]:
    """Controllers on the Sparks: each of the order asked on all its URLs at once."""
    if config.colocated is None:
        return []
    return [
        PlannedCheck(
            f"controller.colocated.{placed.node}",
            f"the controller on {placed.node}",
            ASK_TIMEOUT_S + 2.0,
            partial(check_controller, config, placed),
        )
        for placed in config.colocated.controllers
    ]


def diagnose(
    agent_config: Path | None,
    controller_config: Path | None,
    progress: Progress | None = None,
    host: NodeHost | None = None,
) -> DoctorReport:
    """Load the configs (raises ConfigUnreadable for a file that cannot be read at
    all, before any check runs), then run every check that applies."""
    host = host or NodeHost()
    checks: list[Check] = []
    plan: list[PlannedCheck] = []
    loaded_agent = load_agent(agent_config) if agent_config is not None else None
    loaded_controller = (
        load_controller(controller_config) if controller_config is not None else None
    )
    if loaded_agent is not None:
        finding, agent = loaded_agent
        checks.append(Check.named("config.agent", finding))
        if agent is not None:
            plan += node_plan(agent, host)
        else:
            checks.append(
                Check.named("node", skip("node checks not run: the agent config is invalid"))
            )
    if loaded_controller is not None:
        finding, controller = loaded_controller
        checks.append(Check.named("config.controller", finding))
        if controller is not None:
            plan += controller_plan(controller, host.root)
        else:
            checks.append(
                Check.named("controller", skip("controller checks not run: its config is invalid"))
            )
    checks += asyncio.run(run_plan(plan, progress))
    return DoctorReport(tuple(checks))
