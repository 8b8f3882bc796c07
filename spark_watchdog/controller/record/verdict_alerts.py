"""What a change of a node's verdict tells a person and counts for ``/metrics``
(docs/observability.md): the log line of every change, ``unobservable`` at
once, ``reboot_overdue`` for a node gone down in order and not back, and
``unreachable`` once that verdict has lasted ``freeze_after``. What the
controller does about a verdict is decided elsewhere
(controller/decide/decisions.py); these only tell."""

from __future__ import annotations

import logging
from collections.abc import Iterable

from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.notify import Event, Notifier
from spark_watchdog.controller.record.tallies import Tallies

log = logging.getLogger("spark_watchdog.controller")


class VerdictAlerts:
    def __init__(
        self, notifier: Notifier, clock: Clock, tallies: Tallies, freeze_after: float
    ) -> None:
        self.notifier, self.clock, self.tallies = notifier, clock, tallies
        self.freeze_after = freeze_after
        # Nodes called unreachable (monotonic time the verdict began); the alert
        # goes once the verdict has lasted freeze_after (tell_unreachable).
        self._unreachable_since: dict[str, float] = {}
        self._counted: dict[str, str] = {}

    def changed(self, watch: NodeWatch, before: Verdict) -> None:
        finding = watch.finding
        log.info(
            "%s: %s",
            watch.name,
            finding.summary,
            extra={"node": watch.name, "verdict": finding.verdict.value},
        )
        if finding.verdict is Verdict.UNOBSERVABLE:
            self.notifier.send(Event("unobservable", f"{watch.name} {finding.summary}", watch.name))
        if finding.verdict is Verdict.UNREACHABLE:
            self._unreachable_since[watch.name] = self.clock.monotonic()
        else:
            self._unreachable_since.pop(watch.name, None)
        handed_over = watch.off_seconds_override is not None  # halted for a clock latch
        if (
            before is Verdict.REBOOTING
            and finding.verdict is not Verdict.HEALTHY
            and not handed_over
        ):
            # Gone down in order, not back within boot_timeout: a person should look
            # (silent, it becomes host_frozen; still refusing, it is never fenced).
            self.notifier.send(
                Event("reboot_overdue", f"{watch.name} {finding.summary}", watch.name)
            )

    def tell_unreachable(self, watch: NodeWatch) -> None:
        """The ``unreachable`` alert, once the verdict has lasted ``freeze_after``.

        The path that broke is the controller's own to the node: its cable,
        switch port, NIC or VLAN. A host that freezes right after the
        controller last saw it is briefly unreachable too (its peers' or the
        head's last sightings are newer than the controller's own), until those
        are ``freeze_after`` old and it is host_frozen. So the alert waits:
        the verdict still standing ``freeze_after`` after it began means the
        node was seen alive after the controller lost it (docs/design.md, "Peers").
        """
        since = self._unreachable_since.get(watch.name)
        if since is None or self.clock.monotonic() - since < self.freeze_after:
            return
        del self._unreachable_since[watch.name]  # told once per spell
        self.notifier.send(
            Event(
                "unreachable",
                f"{watch.name} {watch.finding.summary}; check the management path to it "
                f"({watch.config.agent}, ssh {watch.config.banner_host})",
                watch.name,
            )
        )

    def count(self, watches: Iterable[NodeWatch]) -> None:
        """Each node's verdict changes, counted for ``/metrics`` once a tick."""
        for watch in watches:
            if self._counted.get(watch.name) != watch.verdict:
                self._counted[watch.name] = watch.verdict
                self.tallies.note_verdict(watch.name, watch.verdict)
