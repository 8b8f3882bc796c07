"""Which controller acts for a node when the controllers run on the Sparks themselves.

Pure: what this controller heard of the others (when, what they claim, their
order) comes in, a refusal or None goes out. The rules and why they give
one recovery per freeze: docs/design.md, "Controllers on the Sparks".

For a node, its *actors* are the controllers in order without its own. A
node whose own controller answered within ``freeze_after`` is alive. A
controller acts for it only when it does not run on it, is not listening
after a start or a gap in its own loop, hears no other controller claim it,
hears no other controller hold it (a person's hold on one Spark binds all),
has heard none of the actors before it for ``takeover_after``, and, where
the node runs a controller placed before it, the node has been silent for
``freeze_after + fence_delay`` (in mutual suspicion the earlier one cuts
first). A controller whose order another one contradicts acts on nothing.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from spark_watchdog.history.records import CLUSTER


@dataclass(frozen=True)
class Placement:
    """Where this controller runs and the order it belongs to (config/colocated.py)."""

    me: str
    order: tuple[str, ...]
    takeover_after: float
    fence_delay: float
    freeze_after: float
    # How long a claim outlives its controller's last answer beyond takeover_after:
    # the longest a cycle it may have sent takes to bring the node back (its off
    # hold and boot_timeout). A node it was recovering may be in POST meanwhile.
    claim_grace: float = 0.0


@dataclass(frozen=True)
class PeerHeard:
    """Another controller, as this one last heard it."""

    heard_at: float | None = None  # monotonic: its last answer whose loop had moved on
    claims: frozenset[str] = frozenset()  # nodes it has an incident or a ladder for
    order: tuple[str, ...] | None = None  # its order, as it said
    holds: frozenset[str] = frozenset()  # nodes its history holds; CLUSTER: the cluster


@dataclass(frozen=True)
class Standing:
    """What this controller knows of the others now."""

    now: float
    observing_until: float  # it acts on nothing before this (monotonic)
    peers: Mapping[str, PeerHeard]
    # When this controller last asked the others (None: not yet): a loop that
    # stood still half of takeover_after listens again before it acts.
    last_sweep: float | None = None


def actors(node: str, order: tuple[str, ...]) -> tuple[str, ...]:
    """The controllers that may act for ``node``, first responsible first."""
    return tuple(c for c in order if c != node)


def _heard(peer: PeerHeard | None, placement: Placement, now: float) -> float | None:
    """Seconds since ``peer`` was last heard, or None: silent for takeover_after."""
    if peer is None or peer.heard_at is None:
        return None
    ago = now - peer.heard_at
    return ago if ago < placement.takeover_after else None


def _common(placement: Placement, standing: Standing) -> str | None:
    """What stops this controller acting on anything at all."""
    last = standing.last_sweep
    if last is not None and standing.now - last >= placement.takeover_after / 2:
        # Woken in the middle of a step: what it heard is stale until it listens again.
        return (
            f"this controller's loop stood still {standing.now - last:.0f}s: it listens "
            "to the other controllers again before acting"
        )
    if standing.now < standing.observing_until:
        left = standing.observing_until - standing.now
        return (
            f"listening to the other controllers for {left:.0f}s more before acting "
            "(after a start, or a gap in this controller's own loop)"
        )
    for name in sorted(standing.peers):
        peer = standing.peers[name]
        heard = _heard(peer, placement, standing.now)
        if heard is not None and peer.order is not None and peer.order != placement.order:
            return (
                f"the controller on {name} has the order {', '.join(peer.order)}, this one "
                f"{', '.join(placement.order)}: acting on nothing until the configs agree"
            )
    return None


def refusal(node: str, placement: Placement, standing: Standing, silent_for: float) -> str | None:
    """Why this controller may not act for ``node`` now (None: it is the one).

    ``silent_for``: seconds since the node last showed life on any path.
    """
    if node == placement.me:
        after = actors(node, placement.order)
        return f"its own host: {' or '.join(after) or 'no other controller'} acts for it"
    if placement.me not in placement.order:
        return f"{placement.me} is not one of the controllers ({', '.join(placement.order)})"
    common = _common(placement, standing)
    if common is not None:
        return common
    now = standing.now
    own = standing.peers.get(node)
    if own is not None and own.heard_at is not None and now - own.heard_at < placement.freeze_after:
        # Its controller's loop moved on: the host runs, whatever its agent says.
        return f"its own controller answered {now - own.heard_at:.0f}s ago: the host is alive"
    claimed = claimed_elsewhere(node, placement, standing)
    if claimed is not None:
        return claimed
    for name in sorted(standing.peers):
        peer = standing.peers[name]
        heard = _heard(peer, placement, now)
        if heard is not None and {node, CLUSTER} & peer.holds:
            what = "the cluster" if CLUSTER in peer.holds else node
            return f"held in the history of the controller on {name} ({what})"
    for name in actors(node, placement.order):
        if name == placement.me:
            break
        heard = _heard(standing.peers.get(name), placement, now)
        if heard is not None:
            return f"the controller on {name} acts for it (heard {heard:.0f}s ago)"
    mine = placement.order.index(placement.me)
    if node in placement.order and placement.order.index(node) < mine:
        wait = placement.freeze_after + placement.fence_delay
        if silent_for < wait:
            return (
                f"fence delay: {node}'s controller is before this one in the order; "
                f"acting only after {wait:g}s of silence ({silent_for:.0f}s so far)"
            )
    return None


def claimed_elsewhere(node: str, placement: Placement, standing: Standing) -> str | None:
    """Which other controller is recovering ``node`` (None: none): its off may be
    in force, or the node in the boot after it. A claim stands while its
    controller is heard, and ``claim_grace`` past takeover_after after it fell
    silent (stopped right after its off, it cannot say the node is booting)."""
    stands = placement.takeover_after + placement.claim_grace
    for name in sorted(standing.peers):
        peer = standing.peers[name]
        if peer.heard_at is None or node not in peer.claims:
            continue
        ago = standing.now - peer.heard_at
        if ago < stands:
            return f"the controller on {name} is recovering it (heard {ago:.0f}s ago)"
    return None


def tells_of(node: str, placement: Placement, standing: Standing) -> bool:
    """Whether this controller is the one that alerts about ``node``: the first of
    its actors heard (itself counted), whatever holds its actions back now."""
    for name in actors(node, placement.order):
        if name == placement.me:
            return True
        if _heard(standing.peers.get(name), placement, standing.now) is not None:
            return False
    return False


def serving_refusal(placement: Placement, standing: Standing) -> str | None:
    """Why this controller may not restart serving for the cluster now: the first
    controller in order heard within takeover_after does it (itself counted),
    and not while another heard controller recovers a node (its recovery ends
    with a serving restart of its own)."""
    common = _common(placement, standing)
    if common is not None:
        return common
    for name in sorted(standing.peers):
        peer = standing.peers[name]
        heard = _heard(peer, placement, standing.now)
        if heard is not None and peer.claims:
            recovering = ", ".join(sorted(peer.claims))
            return f"the controller on {name} is recovering {recovering}: it restarts serving"
        if heard is not None and CLUSTER in peer.holds:
            return f"the cluster is held in the history of the controller on {name}"
    for name in placement.order:
        if name == placement.me:
            return None
        heard = _heard(standing.peers.get(name), placement, standing.now)
        if heard is not None:
            return f"the controller on {name} restarts serving (heard {heard:.0f}s ago)"
    return f"{placement.me} is not one of the controllers ({', '.join(placement.order)})"
