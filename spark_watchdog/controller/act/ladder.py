"""What the gentler ladders share (a wedged GPU: controller/act/wedged.py; a
clock-latched one: controller/act/unlatch.py): the part of the running
controller they use, a poll-until-done wait, the one boot wait, and an
incident of one node opened and ended through the incident log
(controller/record/incident_log.py; the serving faults' incidents too)."""

from __future__ import annotations

import logging
from collections.abc import Callable, Mapping
from typing import Any, Protocol

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.clock import Clock, wait_until
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record import incident_log
from spark_watchdog.controller.record.incident_log import Resolution
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.errors import IncidentAlreadyOpen
from spark_watchdog.history.records import Incident

log = logging.getLogger("spark_watchdog.controller.act.ladder")


class Timed(Protocol):
    """What a wait needs: the controller's clock and its config."""

    @property
    def clock(self) -> Clock: ...

    @property
    def config(self) -> ControllerConfig: ...


class Recorded(Timed, Protocol):
    """What an incident needs: the history besides the clock and the config."""

    @property
    def ledger(self) -> Ledger: ...


async def open_incident(
    host: Recorded,
    kind: str,
    watch: NodeWatch,
    evidence: Mapping[str, Any],
    fault_onset: float | None,
) -> Incident | None:
    """Open an incident of one node (flagged in dry run); None when one is open."""
    try:
        incident = await incident_log.open_incident(
            host.ledger,
            kind,
            [watch.name],
            evidence=evidence,
            fault_onset=fault_onset,
            dry_run=host.config.guards.dry_run,
        )
    except IncidentAlreadyOpen as exc:
        log.info("%s: %s incident not opened: %s", watch.name, kind, exc)
        return None
    return incident


async def wait_for(host: Timed, done: Callable[[], bool], seconds: float) -> bool:
    """Poll ``done`` at the controller's poll interval for up to ``seconds``."""
    return await wait_until(host.clock, done, seconds, host.config.detection.poll_interval)


async def new_boot(host: Timed, watch: NodeWatch, before: str | None, within: float) -> bool:
    """Whether the node's agent answers with a boot other than ``before`` within
    ``within`` s: the one boot wait of every ladder (a freeze's cycle, a forced
    reboot, a clock latch's long cut). A boot id not seen yet is no new boot."""
    tick = min(0.5, host.config.detection.poll_interval / 2)
    return await wait_until(host.clock, lambda: watch.booted_since(before), within, tick)


async def resolve(
    host: Recorded, incident_id: int, kind: str, resolution: Resolution, why: str
) -> str:
    """Close the incident with ``why`` recorded; returns the resolution."""
    await incident_log.resolve(host.ledger, incident_id, resolution, detail={"why": why})
    log.info("incident #%d (%s): %s: %s", incident_id, kind, resolution.value, why)
    return resolution.value
