"""The second path in the simulation: each agent pulses its peers over the
fabric, and says what it saw in its answers (docs/design.md, "Peers").

A node's management link (what the controller polls and banners over) and
its fabric link fail apart: ``SimNode.partitioned_until`` and
``fabric_down_until``. A pulse reaches a peer when both ends' fabric links
are up, the asking agent runs and the peer's agent answers. The model is
lazy: an agent's pulses are taken when the controller asks it, from the
world as it is then (between two asks a peer's pulse would have seen no
more than what the next ask finds, give or take one pulse).

Each agent keeps the real :class:`~spark_watchdog.agent.peers.PeerView` of
each peer, fed the peer's real pulses (its ``seq`` counts loops of its
agent's run, from 0 again after an agent restart or a boot), and whatever
an attacker at the peer's address sends it (:class:`PulseAttack`: replays
of the peer's old pulses, forged seqs and made-up runs). What its answer
says of each peer is what that view says.

What the controller is told, for the invariants, is what a correct watch
would have said (:meth:`PeerEyes.take`'s specification: a run of the peer
seen advancing, from its real pulses only), delivered when the reporting
agent advanced with it (the only reporter the controller believes): I1 then
holds the controller to every path, and a view that misses a live peer (the
agent restart the specification sees, a forged pulse that blinds it) shows
as a violation, not as a quiet wait.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from spark_watchdog.agent.peers import PeerView
from spark_watchdog.probes.pulse import Pulse, PulseAnswer, parse_pulse, pulse_bytes

ANSWERING = frozenset({"ok", "stuck", "slow"})  # an agent that answers a pulse
LOOP_S = 1.0  # a simulated agent's loop: its seq rises once a second while it runs
# Pulses a peer's sender remembers for a replay: its latest, and the last of each run.
MAX_REMEMBERED = 32


class Pulsing(Protocol):
    """A simulated node, as far as its fabric link and its pulses go."""

    name: str
    phase: str
    agent: str
    seq: int
    agent_started: int
    fabric_down_until: float
    eyes: PeerEyes

    @property
    def boot_id(self) -> str: ...

    @property
    def run(self) -> str: ...

    def step(self) -> None: ...


def fabric_up(node: Pulsing, now: float) -> bool:
    return now >= node.fabric_down_until


@dataclass
class PulseAttack:
    """Pulses sent from a peer's address by someone else, until ``until``:
    ``replay`` (the peer's own old pulses, of any boot or run) or ``forge``
    (its run's seq far ahead, made-up runs, a seq of 31 digits)."""

    kind: str
    until: float
    rng: random.Random

    def pulses(self, peer: Pulsing, sent: list[Pulse]) -> list[Pulse]:
        """What the attacker sends one asker in one round."""
        if self.kind == "replay":
            return [self.rng.choice(sent)] if sent else []
        rng = self.rng
        # Its run's seq further ahead than a day of loops (one within a loop's
        # reach blinds for as long as a fabric that drops it: docs/design.md).
        ahead = peer.seq + rng.randint(10**6, 10**17)
        forged = [
            pulse_bytes(peer.name, ahead, peer.boot_id, peer.run),
            pulse_bytes(peer.name, rng.randint(0, 10**6), peer.boot_id, f"made-up-{rng.random()}"),
            b'{"node":"%s","seq":%s,"boot_id":"%s"}'
            % (peer.name.encode(), b"9" * 31, peer.boot_id.encode()),
        ]
        parsed = (parse_pulse(body) for body in forged)  # as the agent's server reads them
        return [pulse for pulse in parsed if pulse is not None]


@dataclass
class PeerEyes:
    """One agent's views of its peers (the real ones, for its answers), what a
    correct watch would have seen (for the invariants), and the pulses it sent."""

    incarnation: tuple[str, int] | None = None
    views: dict[str, PeerView] = field(default_factory=dict)
    runs: dict[str, tuple[tuple[str, str], int]] = field(default_factory=dict)
    seen: dict[str, float] = field(default_factory=dict)  # peer -> advanced (specification)
    sent: list[Pulse] = field(default_factory=list)  # its own pulses, for replays

    def restart_if(self, incarnation: tuple[str, int]) -> None:
        """A new agent process remembers nothing of its peers."""
        if incarnation != self.incarnation:
            self.incarnation = incarnation
            self.views.clear()
            self.runs.clear()
            self.seen.clear()

    def view(self, peer: str) -> PeerView:
        found = self.views.get(peer)
        if found is None:
            found = self.views[peer] = PeerView(peer, f"http://{peer}-fabric:9720")
        return found

    def take(self, peer: Pulsing, pulse: Pulse, now: float) -> None:
        """A real pulse of ``peer``: the view takes it, and the specification
        says the peer advanced when its run's seq rose since the last one."""
        self.view(peer.name).note(PulseAnswer("ok", pulse), now)
        key, last = (pulse.boot_id or "", pulse.run or ""), self.runs.get(peer.name)
        if last is not None and last[0] == key and pulse.seq > last[1]:
            self.seen[peer.name] = now
        self.runs[peer.name] = (key, pulse.seq)

    def sends(self, pulse: Pulse) -> None:
        """This agent's own pulse, as a peer took it (kept for replays)."""
        if self.sent and self.sent[-1][1:] == pulse[1:]:
            return
        if len(self.sent) >= MAX_REMEMBERED:
            # Keep the last pulse of each run; drop the oldest of the rest.
            lasts = {(p.boot_id, p.run): i for i, p in enumerate(self.sent)}
            kept = set(lasts.values())
            drop = next((i for i in range(len(self.sent)) if i not in kept), 0)
            del self.sent[drop]
        self.sent.append(pulse)


def advance_loop(node: Any, now: float) -> None:
    """The agent's loop counts its seq while it runs (up, not stuck or crashed)."""
    if node.phase == "up" and node.agent in ("ok", "slow"):
        if node.loop_at is None:
            node.loop_at = now
        loops = int((now - node.loop_at) / LOOP_S)
        node.seq += loops
        node.loop_at += loops * LOOP_S
    else:
        node.loop_at = None


class Fabric(Protocol):
    """The world, as far as the fabric goes: who sends pulses from whose
    address, and which cables are in (simulation/world.py)."""

    pulse_attacks: dict[str, PulseAttack]

    def linked(self, a: str, b: str) -> bool: ...


def peer_report(
    node: Pulsing,
    nodes: Iterable[Pulsing],
    now: float,
    fabric: Fabric | None = None,
) -> tuple[dict[str, Any], dict[str, float]]:
    """What ``node``'s agent says of each peer in ``/v1/state`` now (its real
    views), and when a correct watch would have seen each advance last."""
    attacks = {} if fabric is None else fabric.pulse_attacks
    eyes = node.eyes
    eyes.restart_if((node.boot_id, node.agent_started))
    report: dict[str, Any] = {}
    asking = node.phase == "up" and node.agent in ANSWERING and fabric_up(node, now)
    for peer in nodes:
        if peer is node:
            continue
        peer.step()
        view = eyes.view(peer.name)
        cabled = fabric is None or fabric.linked(node.name, peer.name)
        reached = cabled and asking and fabric_up(peer, now)
        reached = reached and peer.phase == "up" and peer.agent in ANSWERING
        if reached:
            pulse = Pulse(peer.name, peer.seq, peer.boot_id, peer.run)
            peer.eyes.sends(pulse)
            eyes.take(peer, pulse, now)
        elif asking:
            view.note(PulseAnswer("silent", error="no answer within the timeout"), now)
        attack = attacks.get(peer.name)
        if asking and attack is not None and now < attack.until:
            for forged in attack.pulses(peer, peer.eyes.sent):
                view.note(PulseAnswer("ok", forged), now)
        at = view.progress_at
        report[peer.name] = {
            "via": view.via,
            "state": view.state,
            "progress_ago_s": None if at is None else round(max(0.0, now - at), 6),
        }
    return report, dict(eyes.seen)


def deliver(
    seen: dict[str, float], believed: bool, note_life: Callable[[str, float], None]
) -> None:
    """The report reached the controller: a believed one is life for each peer
    a correct watch saw advance (``note_life(node, at)``: ``Truth.note_life``)."""
    if not believed:
        return
    for name, at in seen.items():
        note_life(name, at)


class Engine:
    """The head's engine over its step group (every node's rank, talking over
    the fabric): it steps while every rank runs on a live host and every
    fabric link and cable is up. Judged lazily, when the controller asks the head."""

    def __init__(self, linked: Callable[[str, str], bool] | None = None) -> None:
        self.stepped_at: float | None = None
        self.linked = linked  # whether the cable between two nodes is in (None: always)

    def report(self, group: Iterable[Any], now: float) -> float | None:
        """``progress_ago_s`` of the head's vLLM report now."""
        nodes = list(group)
        for node in nodes:
            node.step()
        if all(
            n.phase == "up" and n.rank_running and n.agent != "crashed" and fabric_up(n, now)
            for n in nodes
        ) and self._cabled(nodes):
            self.stepped_at = now
        return None if self.stepped_at is None else round(now - self.stepped_at, 6)

    def _cabled(self, nodes: list[Any]) -> bool:
        linked = self.linked
        if linked is None:
            return True
        return all(linked(a.name, b.name) for i, a in enumerate(nodes) for b in nodes[i + 1 :])
