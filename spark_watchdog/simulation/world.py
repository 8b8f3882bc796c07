"""The simulated world the real controller runs against: nodes, power, network.

Each ``SimNode`` is a small state machine of what a DGX Spark shows the
controller: an agent that answers (or is silent, refused, stuck, slow), an
SSH port (banner, no banner, refused, connect timeout), a boot id, and
whether its outlets give it power. ``SimOutlet`` is one PDU outlet with the
failure modes of real PDUs. Everything the controller is told is logged in
``Truth`` (simulation/truth.py) for the invariants, in virtual time; the
controller reaches the world through the seams of simulation/seams.py.
"""

from __future__ import annotations

import asyncio
import functools
import json
import math
import random
from collections.abc import Callable, Sequence
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.controller.look.http_client import (
    NO_NETWORK,
    REFUSED,
    SILENCE,
    UNRESOLVABLE,
    HttpAnswer,
    HttpError,
)
from spark_watchdog.errors import Ambiguous, Refused, Unreachable
from spark_watchdog.power import send_window
from spark_watchdog.power.base import TIMED_ON_MARGIN_S, PowerState, TimedOn
from spark_watchdog.power.ssh_banner import BannerResult
from spark_watchdog.simulation.fabric import (
    Engine,
    PeerEyes,
    PulseAttack,
    advance_loop,
    deliver,
    peer_report,
)
from spark_watchdog.simulation.hosts import HostNetwork
from spark_watchdog.simulation.process import PROCESS, Incarnation, InjectedBug, asking_host
from spark_watchdog.simulation.truth import Command, Truth
from spark_watchdog.xid import ends_the_context


class SimNode:
    """One DGX Spark as the controller sees it through the network."""

    def __init__(self, name: str, rng: random.Random, world: World) -> None:
        self.name = name
        self.rng = rng
        self.world = world
        self.boot = 0
        self.powered = True
        self.phase = "up"  # up | frozen | stopping | down | off | post | kernel | hung
        self.phase_until = float("inf")
        self.thaw_at = float("inf")
        self.seq = 0
        self.agent_started = 0
        self.agent = "ok"  # ok | crashed | stuck | slow
        self.agent_until = float("inf")
        self.dns_broken_until = -1.0
        self.loss = 0.0
        self.partitioned_until = -1.0  # the management link: what the controller uses
        self.fabric_down_until = -1.0  # the fabric link: what its peers pulse over
        self.eyes = PeerEyes()  # its agent's views of its peers (simulation/fabric.py)
        self.loop_at: float | None = None  # its agent loop's last count of seq
        self.hang_after_shutdown = False
        self.halt_after_shutdown = False
        self.gpu_wedged = False  # NVML reads time out until the next boot
        self.ssh_bug = False  # the next reboot or halt over SSH raises (a planted bug)
        # The GPU clock latch: survives reboots and short cuts; LATCH_CLEAR_S off clears it.
        self.clock_latched = False
        self.off_since = 0.0
        self.gpu_sticky = False  # ... or until power is cut (a reboot does not clear it)
        # (agent incarnation, wall time) of each kill by the node's memory guard.
        self.guard_kills: list[tuple[tuple[int, int], float]] = []
        # (agent incarnation, the fault as its agent reports it): GPU faults (Xids).
        self.faults_seen: list[tuple[tuple[int, int], dict[str, Any]]] = []
        # Its vLLM rank, as its agent's serving API drives it: running or not, the
        # profile it was last started with, a config not as safe as asked; and
        # the faults of the next serving command to this node.
        self.rank_running = True
        self.rank_started = 0.0  # world time its rank last started
        self.rank_profile: str | None = None
        self.rank_unsafe = False
        self.next_start_fails = False
        self.next_stop_hangs = False
        self.next_start_unsafe = False

    @property
    def boot_id(self) -> str:
        return f"{self.name}-boot-{self.boot}"

    @property
    def run(self) -> str:
        """Its agent's run, as its pulses name it: a new one at each agent start."""
        return f"{self.boot}-{self.agent_started}"

    def now(self) -> float:
        return self.world.now()

    # -- faults -------------------------------------------------------------

    def freeze(self, thaw_after: float | None) -> None:
        if self.phase == "up":
            self.phase = "frozen"
            self.thaw_at = float("inf") if thaw_after is None else self.now() + thaw_after

    def planned_reboot(self, shutdown_s: float, hang: bool, halt: bool = False) -> None:
        """A clean shutdown, then a new boot; ``hang``: stuck after it (the kernel
        still refuses SSH); ``halt``: halted (silent, until power is cut)."""
        if self.phase == "up":
            self.phase, self.phase_until = "stopping", self.now() + 2.0
            self.hang_after_shutdown = hang
            self.halt_after_shutdown = halt
            self._shutdown_s = shutdown_s

    def memory_kill(self, wall_base: float) -> None:
        """The node's memory guard kills its rank (the host stays up)."""
        if self.phase == "up":
            self.guard_kills.append(((self.boot, self.agent_started), wall_base + self.now()))

    def gpu_fault(self, wall_base: float, xid: int) -> None:
        """A GPU fault (an Xid): one that ends the rank's CUDA context stops it (the
        agent stops it at once); any other is reported as evidence only."""
        if self.phase != "up":
            return
        mine = (self.boot, self.agent_started)
        count = sum(1 for who, _ in self.faults_seen if who == mine)
        ends = ends_the_context(xid)
        fault = {
            "id": count + 1,
            "xid": xid,
            "at_unix": wall_base + self.now(),
            "gpu": 0,
            "result": "stopped" if ends and self.rank_running else "evidence",
        }
        self.faults_seen.append((mine, fault))
        if ends:
            self.rank_running = False

    def _gpu_faults(self) -> dict[str, Any]:
        mine = [f for who, f in self.faults_seen if who == (self.boot, self.agent_started)]
        return {"watcher": "on", "faults": mine[-16:], "dropped": max(0, len(mine) - 16)}

    def _memory_guard(self) -> dict[str, Any]:
        mine = [at for who, at in self.guard_kills if who == (self.boot, self.agent_started)]
        last = None
        if mine:
            last = {
                "id": len(mine),
                "at_unix": mine[-1],
                "result": "killed",
                "reasons": ["simulated collapse"],
            }
        return {"enabled": True, "kills": len(mine), "last_kill": last}

    def power_changed(self) -> None:
        now = self.now()
        if not self.powered:
            self.phase, self.phase_until = "off", float("inf")
            self.gpu_wedged = self.gpu_sticky = False
            self.thaw_at = float("inf")
            self.off_since = now
        elif self.phase == "off":
            if now - self.off_since >= LATCH_CLEAR_S:
                self.clock_latched = False  # minutes without AC clear it; a short cut does not
            self.phase, self.phase_until = "post", now + self.rng.uniform(2.0, 8.0)

    def step(self) -> None:
        """Advance time-driven phases (called before every look)."""
        now = self.now()
        if self.phase == "frozen" and now >= self.thaw_at:
            self.phase, self.thaw_at = "up", float("inf")
        if self.agent != "ok" and now >= self.agent_until:
            if self.agent == "crashed":
                self.agent_started += 1
                self.seq = 0
            self.agent = "ok"
        # Phases follow one another when each ends, looked at or not: a boot
        # that nobody watched (the controller was down) took no longer.
        while now >= self.phase_until:
            ended = self.phase_until
            if self.phase == "stopping":
                self.phase = "down"
                self.phase_until = ended + getattr(self, "_shutdown_s", 5.0)
            elif self.phase == "down":
                if self.halt_after_shutdown:
                    self.phase, self.phase_until = "halted", float("inf")
                elif self.hang_after_shutdown:
                    self.phase, self.phase_until = "hung", float("inf")
                else:
                    self.phase, self.phase_until = "post", ended + self.rng.uniform(2.0, 8.0)
            elif self.phase == "post":
                self.phase, self.phase_until = "kernel", ended + self.rng.uniform(1.0, 10.0)
            elif self.phase == "kernel":
                self.boot += 1
                self.gpu_wedged = self.gpu_wedged and self.gpu_sticky
                self.seq = 0
                self.agent, self.agent_started = "ok", 0
                self.phase, self.phase_until = "up", float("inf")
                # The agent starts its rank at boot, as it is configured.
                self.rank_running, self.rank_unsafe = True, False
            else:
                break
        advance_loop(self, now)

    # -- what the controller sees ------------------------------------------------

    def _blind(self) -> str | None:
        if self.world.controller_net_down:
            return NO_NETWORK
        if self.now() < self.dns_broken_until:
            return UNRESOLVABLE
        return None

    async def agent_get(self, path: str, timeout: float) -> HttpAnswer:
        self.step()
        blind = self._blind()
        if blind is not None:
            raise HttpError(f"{self.name}: cannot look ({blind})", blind)
        if self.rng.random() < self.loss or self.world.cut_off(self):
            await self.world.sleep(timeout)
            raise HttpError(f"{self.name}: lost", SILENCE)
        phase = self.phase
        if phase in ("kernel", "down", "hung") or (phase == "up" and self.agent == "crashed"):
            raise HttpError(f"{self.name}: connection refused", REFUSED)
        if phase in ("frozen", "off", "post", "halted"):
            await self.world.sleep(timeout)
            raise HttpError(f"{self.name}: no answer within {timeout:g}s", SILENCE)
        if self.agent == "slow":
            await self._slowly(timeout)
        if self.agent != "stuck":
            self.seq += 1
        self.world.note_life(self.name, self.now())
        if path != "/v1/boots" and self.world.peers_on:
            world = self.world
            peers, seen = peer_report(self, world.nodes.values(), self.now(), world)
            deliver(seen, self.agent != "stuck", world.note_life)
        body: dict[str, Any]
        if path == "/v1/boots":
            body = {"boots": []}
        else:
            body = {
                "seq": self.seq,
                "boot_id": self.boot_id,
                "started_at": f"agent-{self.boot}-{self.agent_started}",
                "stopping": {"since": self.now(), "system": True} if phase == "stopping" else None,
                "probes": {
                    "vllm": {"state": "progressing" if self.rank_running else "dead"},
                    "gpu": {"state": "timeout" if self.gpu_wedged else "ok"},
                },
                "memory_guard": self._memory_guard(),
                "gpu_clock_check": {
                    "enabled": True,
                    "state": "latched" if self.clock_latched else "ok",
                },
            }
            body["probes"]["vllm"]["observed_at"] = _agent_time(self.now())
            body["serving"] = self._serving_status()
            if self.faults_seen:
                body["gpu_faults"] = self._gpu_faults()
            if self.world.peers_on:
                body["peers"] = peers
                if self.name == self.world.head:
                    self._engine_report(body)
        return HttpAnswer(200, json.dumps(body).encode())

    async def _slowly(self, timeout: float) -> None:
        """A slow agent's delay before it answers, near its timeout or past it."""
        delay = self.rng.uniform(0.5, 1.3) * timeout
        if delay >= timeout:
            await self.world.sleep(timeout)
            raise HttpError(f"{self.name}: no answer within {timeout:g}s", SILENCE)
        await self.world.sleep(delay)
        self.step()
        # What befell it while it was slow to answer: the answer never comes.
        if self.world.cut_off(self):
            await self.world.sleep(timeout - delay)
            raise HttpError(f"{self.name}: lost", SILENCE)
        if self.phase not in ("up", "stopping") or self.agent == "crashed":
            raise HttpError(f"{self.name}: closed mid-answer", REFUSED)

    def _serving_status(self) -> dict[str, Any]:
        """``serving`` of its agent's state: when its rank started (a restart counts
        only reports on the rank it started), and a config less safe than asked."""
        status: dict[str, Any] = {"started_at": _agent_time(self.rank_started)}
        if self.rank_unsafe:
            status |= {"effective_safe": False, "effective_matches_profile": False}
        return status

    def _engine_report(self, body: dict[str, Any]) -> None:
        """The head's vLLM says when its engine last stepped: every rank was alive then."""
        now, world = self.now(), self.world
        ago = world.engine.report(world.nodes.values(), now)
        body["probes"]["vllm"]["progress_ago_s"] = ago
        if ago is not None and self.agent != "stuck":
            for name in world.nodes:
                if name != self.name:
                    world.note_life(name, now - ago)

    async def serving_call(self, method: str, what: str, body: Any, timeout: float) -> HttpAnswer:
        """The agent's serving API (``GET /v1/serving``, ``POST /v1/serving/<what>``)
        with its faults: a stop that never answers, a start whose rank exits, a
        rank that comes up with a config less safe than asked."""
        self.step()
        blind = self._blind()
        if blind is not None:
            raise HttpError(f"{self.name}: cannot look ({blind})", blind)
        silent = self.phase in ("frozen", "off", "post", "halted")
        if silent or self.rng.random() < self.loss or self.world.cut_off(self):
            await self.world.sleep(timeout)
            raise HttpError(f"{self.name}: no answer within {timeout:g}s", SILENCE)
        if self.phase != "up" or self.agent == "crashed":
            raise HttpError(f"{self.name}: connection refused", REFUSED)
        if method == "GET" and what == "":
            started = _agent_time(self.rank_started)
            return _json(
                200, {"enabled": True, "profiles": list(SIM_PROFILES), "started_at": started}
            )
        if what == "stop":
            if self.next_stop_hangs:
                self.next_stop_hangs = False
                await self.world.sleep(timeout)
                raise HttpError(f"{self.name}: no answer within {timeout:g}s", SILENCE)
            await self.world.sleep(self.rng.uniform(0.5, 3.0))
            self.rank_running = False
            return _json(200, {"state": "stopped"})
        if what == "start":
            await self.world.sleep(self.rng.uniform(0.5, 3.0))
            if self.next_start_fails:
                self.next_start_fails = False
                return _json(500, {"error": "the rank exited while starting"})
            profile = body.get("profile") if isinstance(body, dict) else None
            self.rank_running, self.rank_profile = True, profile
            self.rank_started = self.now()
            self.rank_unsafe, self.next_start_unsafe = self.next_start_unsafe, False
            return _json(200, {"state": "running"})
        if what == "canary":
            return _json(200, {"outcome": "ok" if self.rank_running else "failed"})
        return _json(404, {"error": f"no such endpoint: {what}"})

    async def banner(self, timeout: float) -> BannerResult:
        self.step()
        blind = self._blind()
        if blind is not None:
            return BannerResult("unresolvable" if blind == UNRESOLVABLE else "no_network")
        if self.rng.random() < self.loss or self.world.cut_off(self):
            await self.world.sleep(timeout)
            return BannerResult("connect_timeout")
        phase = self.phase
        if phase in ("kernel", "down", "hung"):
            self.world.note_life(self.name, self.now())
            return BannerResult("refused")
        if phase in ("off", "post", "halted"):
            await self.world.sleep(timeout)
            return BannerResult("connect_timeout")
        if phase == "frozen":
            await self.world.sleep(timeout)
            return BannerResult("no_banner", connect_s=0.001)
        self.world.note_life(self.name, self.now())
        return BannerResult("banner", banner="SSH-2.0-OpenSSH_9.6", connect_s=0.001)


# Seconds without power that clear a GPU clock latch in the simulation: longer
# than most ordinary cuts it draws, shorter than clock_latch_off_seconds.
LATCH_CLEAR_S = 90.0


@functools.lru_cache(maxsize=4096)  # a rank's start, written into every answer
def _agent_time(world_seconds: float) -> str:
    """A world time as an agent writes its times (ISO-8601 UTC)."""
    moment = datetime.fromtimestamp(AGENT_EPOCH + world_seconds, timezone.utc)
    return moment.isoformat(timespec="milliseconds")


# The agents' clock at the world's time 0.
AGENT_EPOCH = 1_700_000_000.0


# The profiles every simulated agent offers (GET /v1/serving).
SIM_PROFILES = ("safe", "fast")


def _json(status: int, body: Any) -> HttpAnswer:
    return HttpAnswer(status, json.dumps(body).encode())


class SimOutlet:
    """One PDU outlet, a PowerBackend with the faults of real devices."""

    def __init__(self, name: str, node: SimNode, world: World, rng: random.Random) -> None:
        self._name = name
        self.node = node
        self.world = world
        self.rng = rng
        self.state = PowerState.ON
        self.pending: tuple[float, PowerState] | None = None  # read-back lag
        self.down_until = -1.0
        self.slow = 0.0
        self.refusing_until = -1.0
        self.ambiguous_p = 0.0
        self.lag = 0.0
        self.bug = False
        self.incarnation: Incarnation | None = None
        # After a command whose answer never came, a read must come before the next.
        self.unsettled = False
        # Half the outlets can time their own on (a plug's flip-back timer);
        # some of those timers never fire, and the controller must send the on.
        self.self_timed = rng.random() < 0.5
        self.timer_fails = rng.random() < 0.2
        self.timer_generation = 0

    @property
    def name(self) -> str:
        return f"sim-pdu outlet {self._name}"

    @property
    def limiter_key(self) -> str:
        return "sim-pdu"

    def _settle(self) -> None:
        if self.pending is not None and self.world.now() >= self.pending[0]:
            self.set_state(self.pending[1])
            self.pending = None

    def set_state(self, state: PowerState) -> None:
        self.state = state
        self.node.step()
        self.node.powered = all(o.state is PowerState.ON for o in self.world.outlets_of(self.node))
        self.node.power_changed()

    def _reachable(self) -> None:
        if self.world.plug_cut() or self.world.now() < self.down_until:
            raise Unreachable(self.name, "no answer")

    def sender(self) -> Incarnation | None:
        """The controller process asking: the one running this code, else the
        last one that built a power path to the outlet."""
        return PROCESS.get() or self.incarnation

    async def read_state(self) -> PowerState:
        sender = self.sender()
        if sender is not None:
            sender.check()
        if self.slow:
            await self.world.sleep(self.slow)
        self._reachable()
        if self.bug:
            self.bug = False
            raise InjectedBug(f"{self.name}: a planted bug")
        self._settle()
        self.unsettled = False
        return self.state

    async def plan_timed_on(self, off_seconds: float) -> TimedOn:
        sender = self.sender()
        if sender is not None:
            sender.check()
        self._reachable()
        if not self.self_timed or off_seconds < 1:
            return TimedOn(None, "this outlet cannot time its own on")
        return TimedOn(math.ceil(off_seconds) + TIMED_ON_MARGIN_S, "sim flip-back timer")

    async def command_timed_off(self, on_after_s: float) -> None:
        await self.command(PowerState.OFF, on_after_s)

    def _timed_on(self, generation: int) -> None:
        if generation == self.timer_generation:
            self.world.truth.timed_ons.append((self.world.now(), self.node.name))
            self.set_state(PowerState.ON)

    async def aclose(self) -> None:
        """A simulated outlet holds no sockets."""

    async def command(self, target: PowerState, on_after_s: float | None = None) -> None:
        sender = self.sender()
        assert sender is not None
        sender.check()
        self._reachable()
        if self.world.now() < self.refusing_until:
            raise Refused(self.name, "the PDU said no")
        if self.unsettled:
            self.world.truth.violations.append(
                f"I2 at {self.world.now():.1f}s: {target.value} sent to {self.name} after an "
                "unknown outcome, without a read in between"
            )
        ambiguous = self.rng.random() < self.ambiguous_p
        landed = not ambiguous or self.rng.random() < 0.5
        # As a real backend: the send window asked right before the bytes leave.
        send_window.enforce(self.name)
        self.world.on_command(self, target, landed, sender.number)
        if landed:
            # A newer command replaces the flip-back timer, as on a Shelly.
            self.timer_generation += 1
            if on_after_s is not None and not self.timer_fails:
                assert self.world.loop is not None
                self.world.loop.call_later(on_after_s, self._timed_on, self.timer_generation)
            if self.lag:
                self.pending = (self.world.now() + self.lag, target)
            else:
                self.set_state(target)
        if ambiguous:
            self.unsettled = True
            await self.world.sleep(3600.0)  # the answer never comes: the caller's deadline hits
            raise Ambiguous(self.name, "no answer to the command")
        if self.slow:
            await self.world.sleep(self.slow)


class World:
    """The cluster, its network and its power, for one simulated run."""

    def __init__(self, names: Sequence[str], rng: random.Random, freeze_after: float) -> None:
        self.loop: asyncio.AbstractEventLoop | None = None
        self.rng = rng
        self.nodes = {n: SimNode(n, random.Random(rng.random()), self) for n in names}
        self.outlets: dict[str, list[SimOutlet]] = {
            n: [SimOutlet(f"{i + 1}", node, self, random.Random(rng.random()))]
            for i, (n, node) in enumerate(self.nodes.items())
        }
        self.truth = Truth(freeze_after)
        self.controller_net_down = False
        self.witness_down = False
        # The agents pulse each other over the fabric, and the head's engine
        # steps over it (simulation/fabric.py): its report is life for every rank.
        self.peers_on = False
        # Pulses sent from a node's fabric address by someone else, by node.
        self.pulse_attacks: dict[str, PulseAttack] = {}
        self.head = next(iter(self.nodes), None)  # the config's serving.head
        self.engine = Engine(self.linked)
        self.on_command_hook: Callable[[SimOutlet, PowerState, bool, int], None] | None = None
        # The network between the Sparks, where the controllers run on them; None:
        # the controller runs on a host of its own (simulation/hosts.py).
        self.hosts: HostNetwork | None = None

    def now(self) -> float:
        assert self.loop is not None
        return self.loop.time()

    async def sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    # -- the network as the asking controller process meets it (simulation/hosts.py)

    def cut_off(self, node: SimNode) -> bool:
        """The asking process's management path to ``node`` is down."""
        if self.hosts is None:
            return self.now() < node.partitioned_until
        return self.hosts.cut_off(asking_host(), node)

    def off_the_switch(self) -> bool:
        """The asking process cannot reach the switch (the witness, the plug)."""
        hosts, origin = self.hosts, asking_host()
        return self.controller_net_down or (hosts is not None and hosts.off_the_switch(origin))

    def plug_cut(self) -> bool:
        """The asking process cannot reach the plug."""
        hosts, origin = self.hosts, asking_host()
        return self.controller_net_down or (hosts is not None and hosts.plug_cut(origin))

    def linked(self, a: str, b: str) -> bool:
        """The fabric cable between two nodes is in."""
        return self.hosts is None or self.hosts.cable_up(a, b)

    def note_life(self, node: str, at: float) -> None:
        """The asking process was told ``node`` was alive at ``at``."""
        self.truth.note_life(node, at)
        if self.hosts is not None:
            self.hosts.note_life(asking_host(), node, at)

    def outlets_of(self, node: SimNode) -> list[SimOutlet]:
        return self.outlets[node.name]

    def on_command(self, outlet: SimOutlet, target: PowerState, landed: bool, number: int) -> None:
        if self.on_command_hook is not None:
            self.on_command_hook(outlet, target, landed, number)
        self.truth.commands.append(
            Command(self.now(), outlet.node.name, outlet.name, target, number, landed)
        )

    def person_switch(self, node: str, target: PowerState) -> None:
        outlet = self.outlets[node][0]
        outlet.timer_generation += 1  # a person at the plug cancels its timer
        outlet.set_state(target)
        self.truth.person_switches.append((self.now(), node, target))
