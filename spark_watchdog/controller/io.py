"""Everything the controller does to the outside world, behind narrow seams.

The controller receives one ``ControllerIO``: its clock, how it asks an
agent, checks an SSH banner and its witness, builds a power path, restarts
serving, restarts an agent over SSH, force-reboots a wedged host over SSH,
runs a blocking history call, and how far it may act (its fence: a pair's
lease).
``production`` wires the real ones; the simulation (tests/simulation)
wires its own, on virtual time, so the real controller code runs under
thousands of random faults.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from typing import Protocol, TypeVar

from spark_watchdog.config.controller import ControllerConfig, NodeConfig, SshDevice
from spark_watchdog.controller.clock import Clock, SystemClock
from spark_watchdog.controller.look.http_client import HttpAnswer, request
from spark_watchdog.controller.look.witness import WitnessReport, check_witness
from spark_watchdog.controller.pair.fence import LONE, Fence
from spark_watchdog.controller.serving.serving_restart import (
    ServingNode,
    ServingRestart,
    ServingRestartReport,
)
from spark_watchdog.errors import ConfigError
from spark_watchdog.power.base import PowerTiming, SendGate, StepHook, VerifiedPower
from spark_watchdog.power.paths import PowerPath, build_backend, read_device_secrets
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.power.ssh_banner import BannerResult, check_ssh_banner

T = TypeVar("T")


@dataclass(frozen=True)
class RebootAttempt:
    """How a forced reboot command went: ``sent`` True (it ran, or the session
    dropped as the host went down), False (certainly not: no connection, key
    refused, the command failed), None (it may have left)."""

    sent: bool | None
    detail: str


ForcedReboot = Callable[[SshDevice], Awaitable[RebootAttempt]]


class AgentClient(Protocol):
    async def get(self, node: NodeConfig, path: str, timeout: float) -> HttpAnswer:
        """GET ``path`` of the node's agent; raises HttpError (with its kind) on no answer."""
        ...


class Blocking(Protocol):
    """Runs one blocking call (a history read or write) without stalling the loop."""

    async def __call__(self, fn: Callable[[], T]) -> T: ...


BannerCheck = Callable[[str, int, float], Awaitable[BannerResult]]
WitnessCheck = Callable[[Sequence[str], float], Awaitable[WitnessReport]]
# A verified power path: the path and its timing (worked out once at the start,
# controller/act/power_actions.py), its write-ahead hook, its gate and its send window.
PowerFactory = Callable[
    [PowerPath, PowerTiming, StepHook, SendGate, SendWindow | None], VerifiedPower
]
# head, workers, token, timeout, profile, and what to tell of each node whose
# agent answers (a sign of life: controller/look/node_watch.py).
ServingRunner = Callable[
    [ServingNode, Sequence[ServingNode], str, float, str, Callable[[str], None]],
    Awaitable[ServingRestartReport],
]
AgentRestart = Callable[[SshDevice], Awaitable[str]]
# Another controller's /v1/status at one of its URLs (controller/look/controller_peers.py).
ControllerStatus = Callable[[str, float], Awaitable[HttpAnswer]]


async def ask_controller(url: str, timeout: float) -> HttpAnswer:
    return await request(f"{url.rstrip('/')}/v1/status", timeout=timeout)


@dataclass(frozen=True)
class ControllerIO:
    clock: Clock
    agents: AgentClient
    banner: BannerCheck
    witness: WitnessCheck
    power_factory: PowerFactory
    serving: ServingRunner
    agent_restart: AgentRestart
    blocking: Blocking
    forced_reboot: ForcedReboot
    halt: ForcedReboot
    # How far it may act: alone, always; in a pair, its lease (controller/pair/fence.py).
    fence: Fence = LONE
    # The other controllers, where they run on the Sparks themselves.
    controllers: ControllerStatus = ask_controller

    @classmethod
    def production(
        cls, config: ControllerConfig, clock: Clock | None = None, fence: Fence = LONE
    ) -> ControllerIO:
        """The real seams; ``clock`` defaults to the system's, ``fence`` to a lone controller's."""
        clock = clock or SystemClock()
        return cls(
            clock=clock,
            agents=HttpAgents(),
            banner=check_ssh_banner,
            witness=check_witness,
            power_factory=device_power_factory(config, clock),
            serving=serving_runner(config),
            agent_restart=restart_agent_over_ssh,
            blocking=in_thread,
            forced_reboot=forced_reboot_over_ssh,
            halt=halt_over_ssh,
            fence=fence,
        )


class HttpAgents:
    async def get(self, node: NodeConfig, path: str, timeout: float) -> HttpAnswer:
        return await request(f"{node.agent.rstrip('/')}{path}", timeout=timeout)


async def in_thread(fn: Callable[[], T]) -> T:
    return await asyncio.to_thread(fn)


def device_power_factory(config: ControllerConfig, clock: Clock) -> PowerFactory:
    def make(
        path: PowerPath,
        timing: PowerTiming,
        on_step: StepHook,
        gate: SendGate,
        window: SendWindow | None,
    ) -> VerifiedPower:
        backend = build_backend(path, read_device_secrets(path))
        return VerifiedPower(
            backend,
            timing,
            dry_run=config.guards.dry_run,
            on_step=on_step,
            gate=gate,
            send_window=window,
            clock=clock,
        )

    return make


def serving_restart_for(
    config: ControllerConfig,
    head: ServingNode,
    workers: Sequence[ServingNode],
    token: str,
    timeout: float,
    heard: Callable[[str], None] | None = None,
) -> ServingRestart:
    """The restart ``serving.launcher`` names: through the agents, or the cluster's
    own launcher (its commands run here or over SSH on a node)."""
    launcher = config.serving.launcher
    if launcher.type == "agents":
        return ServingRestart(
            head, workers, token, timeout=timeout, order=launcher.order, heard=heard
        )
    from spark_watchdog.controller.serving.cluster_launcher import LauncherRestart
    from spark_watchdog.controller.serving.launcher_commands import (
        CommandRunner,
        LocalRunner,
        SshRunner,
    )

    runner: CommandRunner
    if launcher.run_on == "controller":
        runner = LocalRunner(launcher.working_directory)
    else:
        node = config.node(launcher.run_on)
        assert launcher.ssh is not None and node.ssh_host is not None  # checked at load
        runner = SshRunner(node.ssh_host, node.ssh_port, launcher.ssh, launcher.working_directory)
    return LauncherRestart(
        head, workers, token, launcher=launcher, runner=runner, timeout=timeout, heard=heard
    )


def serving_runner(config: ControllerConfig) -> ServingRunner:
    async def run(
        head: ServingNode,
        workers: Sequence[ServingNode],
        token: str,
        timeout: float,
        profile: str,
        heard: Callable[[str], None],
    ) -> ServingRestartReport:
        try:
            restart = serving_restart_for(config, head, workers, token, timeout, heard)
        except (ConfigError, ValueError) as exc:  # e.g. a credential name that does not resolve
            return ServingRestartReport(profile, "failed", f"{exc}; nothing was run")
        return await restart.run(profile)

    return run


async def restart_agent_over_ssh(device: SshDevice) -> str:
    from spark_watchdog.power.ssh_reboot import ssh_command_for

    command = ssh_command_for(device)
    result = await command.run("sudo systemctl restart spark-watchdog-agent", timeout=30.0)
    return f"{command.target}: {result.outcome}"


async def forced_reboot_over_ssh(device: SshDevice) -> RebootAttempt:
    """Run the device's ``forced_command``; how far it got, honestly."""
    return await _goodbye_command(device, device.forced_command)


async def halt_over_ssh(device: SshDevice) -> RebootAttempt:
    """Run the device's ``halt_command``; how far it got, honestly."""
    return await _goodbye_command(device, device.halt_command)


async def _goodbye_command(device: SshDevice, command: str) -> RebootAttempt:
    """A command after which the host goes away: a dropped session counts as sent."""
    from spark_watchdog.power.ssh_reboot import run_ssh_command

    result = await run_ssh_command(device, command)
    if result.outcome == "dropped" or (result.outcome == "exited" and result.exit_status == 0):
        return RebootAttempt(True, result.detail)
    if result.outcome == "exited":
        return RebootAttempt(False, f"the command failed: {result.detail}")
    if result.outcome == "timeout" and result.command_sent is not False:
        return RebootAttempt(None, result.detail)
    if result.outcome == "failed" and result.command_sent is not False:
        return RebootAttempt(None, result.detail)
    return RebootAttempt(False, result.detail)
