"""The controllers on the Sparks of a simulated run (simulation/colocated.py):
each one's process across its restarts, and its own I/O, which meets the
world from its host (simulation/hosts.py) and asks the other controllers'
``/v1/status``: what each one last published (as the real status page serves
it) while it runs, is not stopped and a path joins their hosts; else silence,
or a refusal. SSH from it is checked never to reach its own host (I15)."""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol, TypeVar
from urllib.parse import urlsplit

from spark_watchdog.config.controller import ControllerConfig, SshDevice
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.daemon import Controller
from spark_watchdog.controller.io import ControllerIO, ControllerStatus
from spark_watchdog.controller.look.http_client import REFUSED, SILENCE, HttpAnswer, HttpError
from spark_watchdog.controller.pair.fence import LONE
from spark_watchdog.history.store import HistoryStore
from spark_watchdog.power.base import CommandSpacing
from spark_watchdog.simulation.process import Incarnation
from spark_watchdog.simulation.seams import controller_io
from spark_watchdog.simulation.world import World

T = TypeVar("T")

# Phases in which a host answers nothing at all (simulation/world.py).
SILENT = frozenset({"frozen", "off", "post", "halted"})
FABRIC = "-fabric"  # a controller's fabric URL names its node so: http://spark-2-fabric:9721


@dataclass
class Placed:
    """The controller on one Spark, across its restarts."""

    host: str
    store: HistoryStore
    spacing: CommandSpacing
    incarnation: Incarnation = field(default_factory=lambda: Incarnation(0, alive=False))
    controller: Controller | None = None
    stopped_by: set[str] = field(default_factory=set)  # "host" (frozen) or "fault" (SIGSTOP)
    restart_at: float | None = None  # systemd starts it again then
    retired: list[tuple[float, int]] = field(default_factory=list)  # earlier serving restarts
    said: tuple[dict[str, Any], bytes] | None = None  # its last status, and as JSON

    def running(self) -> bool:
        return self.incarnation.alive and not self.stopped_by

    def answer(self) -> bytes:
        """Its ``/v1/status``: what it published after its last tick."""
        assert self.controller is not None
        published = self.controller.published
        if self.said is None or self.said[0] is not published:
            self.said = (published, json.dumps(published).encode())
        return self.said[1]

    def serving_restarts(self) -> list[float]:
        """When each of its processes restarted serving for a fault."""
        now = [] if self.controller is None else self.controller.serving.budget.fault_restarts
        return sorted(at for at, _ in dict.fromkeys([*self.retired, *now]))


class OwnHost(Protocol):
    """I15's check (simulation/colocated_checks.py)."""

    def own_host(self, host: str | None, node: str, where: str) -> None: ...


def placed_io(
    world: World,
    config: ControllerConfig,
    clock: Clock,
    placed: Placed,
    everyone: Mapping[str, Placed],
    checks: OwnHost,
) -> ControllerIO:
    """The world from ``placed``'s host, and the other controllers (``everyone``)."""
    incarnation = placed.incarnation
    io = controller_io(world, config, incarnation, clock, LONE, placed.spacing)

    def not_its_own(
        seam: Callable[[SshDevice], Awaitable[T]], what: str
    ) -> Callable[[SshDevice], Awaitable[T]]:
        async def call(device: SshDevice) -> T:
            where = f"at {world.now():.1f}s: {what} of {device.host}"
            checks.own_host(incarnation.host, device.host, where)
            return await seam(device)

        return call

    return dataclasses.replace(
        io,
        controllers=_asker(world, incarnation, everyone),
        forced_reboot=not_its_own(io.forced_reboot, "forced reboot"),
        halt=not_its_own(io.halt, "halt"),
        agent_restart=not_its_own(io.agent_restart, "agent restart"),
    )


def _asker(
    world: World, incarnation: Incarnation, everyone: Mapping[str, Placed]
) -> ControllerStatus:
    async def ask(url: str, timeout: float) -> HttpAnswer:
        incarnation.check()
        answer = await _status(world, everyone, incarnation.host, url, timeout)
        incarnation.check()
        return answer

    return ask


async def _status(
    world: World, everyone: Mapping[str, Placed], origin: str | None, url: str, timeout: float
) -> HttpAnswer:
    """Another controller's ``/v1/status`` at ``url``, asked from ``origin``."""
    name = urlsplit(url).hostname or ""
    target = name.removesuffix(FABRIC)
    node, placed = world.nodes[target], everyone.get(target)
    node.step()
    network = world.hosts
    assert network is not None and origin is not None
    if name != target:
        reached = network.fabric_path(origin, target)
    else:
        reached = not network.cut_off(origin, node)
    if not reached or node.phase in SILENT or (placed is not None and placed.stopped_by):
        await world.sleep(timeout)
        raise HttpError(f"{url}: no answer within {timeout:g}s", SILENCE)
    if node.phase != "up" or placed is None or not placed.incarnation.alive:
        raise HttpError(f"{url}: connection refused", REFUSED)
    return HttpAnswer(200, placed.answer())
