"""The second path in the simulation: each agent pulses its peers over the
fabric, and says what it saw in its answers (docs/design.md, "Peers").

A node's management link (what the controller polls and banners over) and
its fabric link fail apart: ``SimNode.partitioned_until`` and
``fabric_down_until``. A pulse reaches a peer when both ends' fabric links
are up, the asking agent runs and the peer's agent answers; it sees the
peer advance when the peer's agent loop runs (not stuck). The model is
lazy: an agent's pulses are judged when the controller asks it, from the
world as it is then (between two asks a peer's pulse would have seen no
more than what the next ask finds, give or take one pulse).

What a report tells the controller goes into ``Truth.life`` when the report
is delivered by an agent that advanced with it (the only reporter the
controller believes): I1 then holds the controller to every path.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any, Protocol

ANSWERING = frozenset({"ok", "stuck", "slow"})  # an agent that answers a pulse


class Pulsing(Protocol):
    """A simulated node, as far as its fabric link and its pulses go."""

    name: str
    phase: str
    agent: str
    fabric_down_until: float
    peers_seen: dict[str, float]

    def step(self) -> None: ...


def fabric_up(node: Pulsing, now: float) -> bool:
    return now >= node.fabric_down_until


def peer_report(node: Pulsing, nodes: Iterable[Pulsing], now: float) -> dict[str, Any]:
    """What ``node``'s agent says of each peer in ``/v1/state`` now; its pulses noted."""
    report: dict[str, Any] = {}
    asking = node.phase == "up" and node.agent in ANSWERING and fabric_up(node, now)
    for peer in nodes:
        if peer is node:
            continue
        peer.step()
        reached = asking and fabric_up(peer, now) and peer.phase == "up" and peer.agent in ANSWERING
        if reached and peer.agent != "stuck":
            node.peers_seen[peer.name] = now
        seen = node.peers_seen.get(peer.name)
        report[peer.name] = {
            "via": f"http://{peer.name}-fabric:9720",
            "state": "ok" if reached else "silent",
            "progress_ago_s": None if seen is None else round(now - seen, 6),
        }
    return report


def deliver(
    report: dict[str, Any], now: float, believed: bool, note_life: Callable[[str, float], None]
) -> None:
    """The report reached the controller: a believed one is life for each peer it saw
    (``note_life(node, at)``: ``Truth.note_life``)."""
    if not believed:
        return
    for name, said in report.items():
        ago = said["progress_ago_s"]
        if ago is not None:
            note_life(name, now - ago)


class Engine:
    """The head's engine over its step group (every node's rank, talking over
    the fabric): it steps while every rank runs on a live host and every
    fabric link is up. Judged lazily, when the controller asks the head."""

    def __init__(self) -> None:
        self.stepped_at: float | None = None

    def report(self, group: Iterable[Any], now: float) -> float | None:
        """``progress_ago_s`` of the head's vLLM report now."""
        nodes = list(group)
        for node in nodes:
            node.step()
        if all(
            n.phase == "up" and n.rank_running and n.agent != "crashed" and fabric_up(n, now)
            for n in nodes
        ):
            self.stepped_at = now
        return None if self.stepped_at is None else round(now - self.stepped_at, 6)
