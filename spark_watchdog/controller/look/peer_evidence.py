"""What a node's peers saw of it over their own path (docs/design.md, "Peers").

Each agent pulses its peers over a second network (the fabric the ranks talk
over) and reports, per peer, how long ago by its own monotonic clock it last
saw that peer's ``seq`` advance (``/v1/state``'s ``peers``). A node the
controller cannot reach, whose peers see it advancing, is alive: a broken
management path, not a frozen host. The monitor takes each report as it
comes (controller/look/monitor.py), so a sighting counts from the moment its
report reaches the controller, the send gate's last look included.

A sighting counts only when it comes from a peer the controller itself reads
as alive now (its own agent advanced within ``freeze_after``, in the
controller's own polls), and its age is counted from when the controller got
the report, plus the age the peer gave. A report that says anything else
(a peer silent, answering garbage or another node's name, a number that is
not one) is no evidence of anything. Pure: no I/O, time passed in.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Sighting:
    """A peer saw the node's agent advance at ``at`` (the controller's monotonic clock)."""

    at: float
    reporter: str
    via: str | None
    # "pulse": the reporter's agent pulsed it; "engine": the reporter is the head,
    # whose engine steps need this node's rank.
    kind: str = "pulse"

    def describe(self, now: float) -> str:
        ago = max(0.0, now - self.at)
        if self.kind == "engine":
            return (
                f"the head {self.reporter}'s engine stepped {ago:.1f}s ago, "
                "and every step needs this node's rank"
            )
        path = f" via {self.via}" if self.via else ""
        return f"{self.reporter} saw its agent advance {ago:.1f}s ago{path}"


class Reporter(Protocol):
    """What the controller holds of a node that may report on its peers."""

    @property
    def name(self) -> str: ...

    snapshot: dict[str, Any] | None
    snapshot_at: float | None  # when the controller got ``snapshot`` (monotonic)
    agent_progress_at: float | None  # the agent's last advancing answer (monotonic)


def sightings(
    reporters: Iterable[Reporter], nodes: Iterable[str], now: float, freeze_after: float
) -> dict[str, Sighting]:
    """The freshest sighting of each node by a peer the controller reads as alive now."""
    known = set(nodes)
    best: dict[str, Sighting] = {}
    for reporter in reporters:
        if not _alive_now(reporter, now, freeze_after):
            continue
        assert reporter.snapshot is not None and reporter.snapshot_at is not None
        peers = reporter.snapshot.get("peers")
        if not isinstance(peers, Mapping):
            continue
        for name, report in peers.items():
            if name == reporter.name or name not in known or not isinstance(report, Mapping):
                continue
            at = _seen_at(report, reporter.snapshot_at)
            if at is None or at > now:
                continue
            if name not in best or at > best[name].at:
                via = report.get("via")
                best[name] = Sighting(at, reporter.name, via if isinstance(via, str) else None)
    return best


def group_sightings(
    head: Reporter, group: Iterable[str], now: float, freeze_after: float
) -> dict[str, Sighting]:
    """Serving as proof of life: the head's engine stepped, and every step needs
    the rank of each node of its step group (its tensor- and pipeline-parallel
    group; docs/design.md, "Peers"), so each was alive then.

    The time is the head's ``probes.vllm.progress_ago_s`` (since its engine
    counters were last seen to move) counted back from when the report came,
    from a head the controller reads as alive now.
    """
    if not _alive_now(head, now, freeze_after):
        return {}
    assert head.snapshot is not None and head.snapshot_at is not None
    probes = head.snapshot.get("probes")
    vllm = probes.get("vllm") if isinstance(probes, Mapping) else None
    if not isinstance(vllm, Mapping):
        return {}
    at = _seen_at(vllm, head.snapshot_at)
    if at is None or at > now:
        return {}
    return {name: Sighting(at, head.name, None, "engine") for name in group if name != head.name}


def _alive_now(reporter: Reporter, now: float, freeze_after: float) -> bool:
    progress, got = reporter.agent_progress_at, reporter.snapshot_at
    if reporter.snapshot is None or progress is None or got is None:
        return False
    return now - progress < freeze_after and now - got < freeze_after


def _seen_at(report: Mapping[str, Any], got_at: float) -> float | None:
    """When (the controller's clock) the peer last saw the node advance; None: no evidence.

    Whatever the peer's last pulse got (``state``: an answer, silence,
    garbage, another node's name), ``progress_ago_s`` only ever counts from a
    well-formed pulse of the right node whose ``seq`` or boot id moved: an
    advance seen a second before the path went quiet is still life then.
    """
    ago = report.get("progress_ago_s")
    if isinstance(ago, bool) or not isinstance(ago, (int, float)):
        return None
    try:
        seconds = float(ago)
    except OverflowError:
        return None
    if not math.isfinite(seconds) or seconds < 0:
        return None
    return got_at - seconds
