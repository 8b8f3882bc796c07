"""The simulated world as one controller process reaches it: each seam of
:class:`ControllerIO` (the agents, the SSH banner, the witness, power, the
serving restart, the forced reboot, the halt, the agent restart) over the
world, and every call checks first that the process asking still lives."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, cast

from spark_watchdog.config.controller import ControllerConfig, NodeConfig, SshDevice
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.io import ControllerIO, PowerFactory, RebootAttempt
from spark_watchdog.controller.look.http_client import HttpAnswer
from spark_watchdog.controller.look.witness import WitnessReport
from spark_watchdog.controller.pair.fence import Fence
from spark_watchdog.controller.serving.serving_restart import (
    ServingNode,
    ServingRestart,
    ServingRestartReport,
)
from spark_watchdog.power.base import (
    CommandSpacing,
    PowerTiming,
    SendGate,
    StepHook,
    VerifiedPower,
)
from spark_watchdog.power.paths import PowerPath
from spark_watchdog.power.send_window import SendWindow
from spark_watchdog.power.ssh_banner import BannerResult
from spark_watchdog.simulation.process import Incarnation, InjectedBug
from spark_watchdog.simulation.world import SimNode, World


class SimAgents:
    def __init__(self, world: World, incarnation: Incarnation) -> None:
        self.world = world
        self.incarnation = incarnation

    async def get(self, node: NodeConfig, path: str, timeout: float) -> HttpAnswer:
        self.incarnation.check()
        answer = await self.world.nodes[node.name].agent_get(path, timeout)
        self.incarnation.check()
        return answer


def sim_banner(world: World, incarnation: Incarnation) -> Any:
    async def check(host: str, port: int, timeout: float) -> BannerResult:
        incarnation.check()
        result = await world.nodes[host].banner(timeout)  # ssh_host is the node's name
        incarnation.check()
        return result

    return check


def sim_witness(world: World, incarnation: Incarnation) -> Any:
    async def check(targets: Sequence[str], timeout: float) -> WitnessReport:
        incarnation.check()
        if not targets:
            return WitnessReport(True, (), ())
        if world.witness_down or world.off_the_switch():
            await world.sleep(timeout)
            return WitnessReport(False, (), tuple(targets))
        return WitnessReport(True, tuple(targets), ())

    return check


class SimServingHttp:
    """The agents as the real serving restart asks them (controller/serving/serving_restart.py):
    their state, and their serving API with its faults."""

    def __init__(self, world: World, incarnation: Incarnation, agents: dict[str, str]) -> None:
        self.world = world
        self.incarnation = incarnation
        self.agents = agents  # each agent's base URL: its node

    async def __call__(
        self,
        url: str,
        *,
        method: str = "GET",
        timeout: float,
        body: Any = None,
        headers: dict[str, str] | None = None,
    ) -> HttpAnswer:
        self.incarnation.check()
        base = next(b for b in self.agents if url.startswith(b + "/"))
        node, path = self.world.nodes[self.agents[base]], url[len(base) :]
        if path == "/v1/state":
            answer = await node.agent_get(path, timeout)
        else:
            what = path.removeprefix("/v1/serving").strip("/")
            answer = await node.serving_call(method, what, body, timeout)
        self.incarnation.check()
        return answer


def sim_serving(
    world: World, incarnation: Incarnation, config: ControllerConfig, clock: Clock
) -> Any:
    """The real serving restart, against the simulated agents. A restart it
    calls succeeded while the head does not run the profile, or runs a config
    less safe than asked, breaks I11."""
    agents = {n.agent.rstrip("/"): n.name for n in config.nodes}
    http = SimServingHttp(world, incarnation, agents)

    async def run(
        head: ServingNode,
        workers: Sequence[ServingNode],
        token: str,
        timeout: float,
        profile: str,
        heard: Callable[[str], None],
    ) -> ServingRestartReport:
        incarnation.check()
        world.truth.serving_restarts.append(world.now())
        restart = ServingRestart(
            head, workers, token, timeout=timeout, http=http, clock=clock, heard=heard
        )
        report = await restart.run(profile)
        incarnation.check()
        node = world.nodes[head.name]
        running = node.rank_running and node.rank_profile == profile and not node.rank_unsafe
        if report.result == "succeeded" and not running:
            world.truth.violations.append(
                f"I11 at {world.now():.1f}s: a serving restart with {profile} reported "
                f"succeeded, but {head.name} runs {node.rank_profile} "
                f"(running {node.rank_running}, less safe than asked {node.rank_unsafe})"
            )
        return report

    return run


def sim_forced_reboot(world: World, incarnation: Incarnation) -> Any:
    """The host's sysrq reboot over SSH: usually a new boot a few seconds later;
    sometimes SSH cannot get in (nothing sent), the session hangs (it may have
    run), or the reboot itself hangs in the driver (the host goes silent)."""

    async def reboot(device: SshDevice) -> RebootAttempt:
        incarnation.check()
        node = world.nodes[device.host]
        _planted_ssh_bug(node)
        fate = world.rng.random()
        await world.sleep(world.rng.uniform(0.5, 3.0))
        incarnation.check()
        if node.phase != "up" or fate < 0.1 or _no_route(world, node):
            return RebootAttempt(False, "no connection")
        world.truth.reboots.append((world.now(), node.name, node.gpu_wedged))
        if fate < 0.2:
            node.freeze(None)  # hung in the driver on the way down: silent
            return RebootAttempt(None, "the session hung")
        node.phase, node.phase_until = "post", world.now() + world.rng.uniform(2.0, 8.0)
        return RebootAttempt(True, "dropped as the host went down")

    return reboot


def _no_route(world: World, node: SimNode) -> bool:
    """SSH from the asking process's host cannot reach ``node`` (controllers on
    the Sparks only: a controller on a host of its own gets through as before)."""
    return world.hosts is not None and world.cut_off(node)


def _planted_ssh_bug(node: SimNode) -> None:
    if node.ssh_bug:
        node.ssh_bug = False
        raise InjectedBug(f"{node.name}: a planted bug in the ssh session")


def sim_halt(world: World, incarnation: Incarnation) -> Any:
    """A clean halt over SSH: the host shuts down and stays down, silent (its
    outlet still on), until its power is cut; sometimes SSH cannot get in."""

    async def halt(device: SshDevice) -> RebootAttempt:
        incarnation.check()
        node = world.nodes[device.host]
        _planted_ssh_bug(node)
        fate = world.rng.random()
        await world.sleep(world.rng.uniform(0.5, 2.0))
        incarnation.check()
        if node.phase != "up" or fate < 0.1 or _no_route(world, node):
            return RebootAttempt(False, "no connection")
        world.truth.halts.append((world.now(), node.name, node.clock_latched, node.boot))
        node.planned_reboot(world.rng.uniform(1.0, 20.0), hang=False, halt=True)
        return RebootAttempt(True, "dropped as the host went down")

    return halt


def sim_agent_restart(world: World, incarnation: Incarnation) -> Any:
    async def restart(device: SshDevice) -> str:
        incarnation.check()
        node = world.nodes[device.host]
        await world.sleep(2.0)
        if _no_route(world, node):
            raise OSError(f"ssh {device.host}: connection timed out")
        if node.agent == "stuck":
            node.agent_until = world.now()
        return "restarted"

    return restart


def sim_power(
    world: World,
    incarnation: Incarnation,
    config: ControllerConfig,
    clock: Clock,
    spacing: CommandSpacing,
) -> PowerFactory:
    """A node's outlet as its verified power path, at the timing the controller gives."""

    def power(
        path: PowerPath,
        timing: PowerTiming,
        on_step: StepHook,
        gate: SendGate,
        window: SendWindow | None,
    ) -> VerifiedPower:
        outlet = world.outlets[path.node][0]
        outlet.incarnation = incarnation
        return VerifiedPower(
            outlet,
            timing,
            dry_run=config.guards.dry_run,
            on_step=on_step,
            gate=gate,
            send_window=window,
            clock=clock,
            spacing=spacing,
        )

    return power


def controller_io(
    world: World,
    config: ControllerConfig,
    incarnation: Incarnation,
    clock: Clock,
    fence: Fence,
    spacing: CommandSpacing,
) -> ControllerIO:
    """The simulated world as the process ``incarnation`` reaches it; ``clock``
    and ``fence``: a pair's (simulation/pair.py), else a lone controller's;
    ``spacing``: the run's own (virtual time starts at 0 in each run)."""

    async def inline(fn: Callable[[], Any]) -> Any:
        incarnation.check()
        return fn()

    return ControllerIO(
        clock=clock,
        agents=SimAgents(world, incarnation),
        banner=sim_banner(world, incarnation),
        witness=sim_witness(world, incarnation),
        power_factory=sim_power(world, incarnation, config, clock, spacing),
        serving=sim_serving(world, incarnation, config, clock),
        agent_restart=sim_agent_restart(world, incarnation),
        forced_reboot=sim_forced_reboot(world, incarnation),
        halt=sim_halt(world, incarnation),
        blocking=cast(Any, inline),
        fence=fence,
    )
