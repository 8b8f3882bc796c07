"""The network between the Sparks, as each of them sees it, where the
controllers run on the Sparks themselves:
docs/simulation.md, "Controllers on the Sparks".

Each host has a management link to the one switch (``SimNode.partitioned_until``)
and a fabric link (``SimNode.fabric_down_until``); each pair of hosts is joined
by a fabric cable. The witness and the plug hang on the switch, and the plug
may be out of one host's reach alone (a route, a firewall rule). A request
leaves from the host of the controller process that makes it (its
:class:`Incarnation`'s ``host``): to its own host it never leaves the machine;
to another host's management address it needs both management links and the
switch; to its fabric address, both fabric links and their cable. What each
host's controllers were told of the nodes' life is kept apart (``seen_by``):
invariant I1 holds each sender to what it could see.

Without this network (``World.hosts`` None) a request comes from a controller
on a host of its own, as before: a node's management link alone decides.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Protocol

from spark_watchdog.simulation.truth import Truth


class Host(Protocol):
    """A simulated node, as far as its links go (simulation/world.py's SimNode)."""

    name: str
    partitioned_until: float  # its management link dark until then
    fabric_down_until: float  # its fabric link dark until then


class HostNetwork:
    """The switch, the plug's reach from each host, the fabric cables, and
    what each host's controllers were told of the nodes' life."""

    def __init__(
        self, now: Callable[[], float], hosts: Iterable[Host], freeze_after: float
    ) -> None:
        self.now = now
        self.hosts = {h.name: h for h in hosts}
        self.freeze_after = freeze_after
        self.switch_down_until = -1.0
        self.plug_cut_until: dict[str, float] = {}  # host -> the plug out of its reach
        self.cable_cut_until: dict[frozenset[str], float] = {}
        self.seen_by: dict[str, Truth] = {}

    # -- the paths -----------------------------------------------------------------

    def switch_up(self) -> bool:
        return self.now() >= self.switch_down_until

    def on_the_switch(self, host: str) -> bool:
        """The host's management link and the switch are up."""
        return self.switch_up() and self.now() >= self.hosts[host].partitioned_until

    def cut_off(self, origin: str | None, target: Host) -> bool:
        """The management path from ``origin`` (None: a host off the cluster) to
        ``target`` is down."""
        if origin is None:
            return self.now() < target.partitioned_until
        if origin == target.name:
            return False  # its own address: the request never leaves the host
        return not (self.on_the_switch(origin) and self.on_the_switch(target.name))

    def off_the_switch(self, origin: str | None) -> bool:
        """``origin`` cannot reach the switch (the witness, the plug)."""
        return origin is not None and not self.on_the_switch(origin)

    def plug_cut(self, origin: str | None) -> bool:
        """``origin`` cannot reach the plug."""
        if origin is None:
            return False
        return self.off_the_switch(origin) or self.now() < self.plug_cut_until.get(origin, -1.0)

    def cable_up(self, a: str, b: str) -> bool:
        return self.now() >= self.cable_cut_until.get(frozenset((a, b)), -1.0)

    def fabric_path(self, a: str, b: str) -> bool:
        """The fabric path between two hosts: both links and their cable up."""
        now = self.now()
        ends = (self.hosts[a], self.hosts[b])
        return all(now >= h.fabric_down_until for h in ends) and self.cable_up(a, b)

    def heard_path(self, a: str, b: str) -> bool:
        """Some path joins the two hosts (management or fabric)."""
        return not self.cut_off(a, self.hosts[b]) or self.fabric_path(a, b)

    # -- faults --------------------------------------------------------------------

    def pull_cable(self, a: str, b: str, until: float) -> None:
        key = frozenset((a, b))
        self.cable_cut_until[key] = max(self.cable_cut_until.get(key, -1.0), until)

    def cut_plug(self, host: str, until: float) -> None:
        self.plug_cut_until[host] = max(self.plug_cut_until.get(host, -1.0), until)

    def switch_down(self, until: float) -> None:
        self.switch_down_until = max(self.switch_down_until, until)

    def disturbed(self) -> bool:
        """A fault of this network is on now (the fabric's cables aside)."""
        now = self.now()
        return not self.switch_up() or any(t > now for t in self.plug_cut_until.values())

    def heal(self) -> None:
        """The quiet tail: the switch, every plug route and every cable back."""
        self.switch_down_until = -1.0
        self.plug_cut_until.clear()
        self.cable_cut_until.clear()

    # -- what each host was told -----------------------------------------------------

    def note_life(self, origin: str | None, node: str, at: float) -> None:
        """The controller on ``origin`` was told ``node`` was alive at ``at``."""
        if origin is not None:
            self.sighted(origin).note_life(node, at)

    def sighted(self, host: str) -> Truth:
        """What the controllers on ``host`` were told (only ``life`` is kept)."""
        found = self.seen_by.get(host)
        if found is None:
            found = self.seen_by[host] = Truth(self.freeze_after)
        return found
