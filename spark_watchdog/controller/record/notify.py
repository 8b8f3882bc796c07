"""Notifications: a generic JSON webhook and Alertmanager's POST /api/v2/alerts.

Deliveries run as background tasks with a bounded number of attempts, so a
slow or dead receiver never delays detection or recovery. Events: incident
opened, each power action, gave up, circuit breaker, recovered, and so on.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timezone
from typing import Any

from spark_watchdog.config.controller import NotifyConfig
from spark_watchdog.controller.look.http_client import HttpError, request

log = logging.getLogger("spark_watchdog.notify")

# Events that are problems an operator must see (Alertmanager severity).
CRITICAL = frozenset(
    {
        "gave_up",
        "circuit_breaker",
        "held",
        "ambiguous_power",
        "history_unwritable",
        "outlet_off",  # an outlet found off: a node dark that the controller will not switch on
        "unobservable",  # a node the controller cannot look at is not protected
        "unreachable",  # the management path to a live node is broken: not protected either
        "reboot_overdue",  # went down in order and did not come back within boot_timeout
        "clock_latched",  # a GPU latched on this boot: the fault is likely to return
        "clock_latch_not_cleared",  # ... and the controller could not clear it
        "watcher_in_doubt",  # its loop stalled or every node fell silent: silence not acted on
        "controllers_disagree",  # controllers on the Sparks keep two orders: none acts
    }
)


@dataclass(frozen=True)
class Event:
    kind: str  # incident_opened, power_action, gave_up, recovered, circuit_breaker, ...
    summary: str
    node: str | None = None
    incident_id: int | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    at: float = field(default_factory=time.time)

    def to_json(self) -> dict[str, Any]:
        return {
            "source": "spark-watchdog",
            "kind": self.kind,
            "summary": self.summary,
            "node": self.node,
            "incident_id": self.incident_id,
            "detail": self.detail,
            "at": datetime.fromtimestamp(self.at, timezone.utc).isoformat(),
        }

    def alert(self) -> dict[str, Any]:
        """One Alertmanager alert (api/v2 PostableAlert)."""
        labels = {
            "alertname": f"SparkWatchdog_{self.kind}",
            "severity": "critical" if self.kind in CRITICAL else "warning",
            "source": "spark-watchdog",
        }
        if self.node:
            labels["node"] = self.node
        annotations = {"summary": self.summary}
        if self.incident_id is not None:
            annotations["incident"] = str(self.incident_id)
        start = datetime.fromtimestamp(self.at, timezone.utc).isoformat()
        return {"labels": labels, "annotations": annotations, "startsAt": start}


# What a controller of a pair says about itself: sent even once it is deposed.
ABOUT_LEADERSHIP = frozenset({"leadership_taken", "leadership_lost"})


def _never() -> bool:
    return False


class Notifier:
    def __init__(self, config: NotifyConfig, quiet: Callable[[], bool] = _never) -> None:
        """``quiet``: true while nothing but ``ABOUT_LEADERSHIP`` may be sent (a
        deposed leader of a pair: what it would say about nodes is the new
        leader's to say, and would be wrong)."""
        self.config = config
        self._quiet = quiet
        self._tasks: set[asyncio.Task[None]] = set()
        self.delivered = 0
        self.failed = 0

    def send(self, event: Event) -> None:
        """Queue ``event`` to every receiver; returns at once."""
        if event.kind not in ABOUT_LEADERSHIP and self._quiet():
            log.info(
                "not sent, this controller does not lead any more: %s: %s",
                event.kind,
                event.summary,
            )
            return
        self.queue(event)

    def queue(self, event: Event) -> None:
        """Hand ``event`` to every receiver in the background (what ``send`` lets out)."""
        log.info("notify %s: %s", event.kind, event.summary, extra={"event": event.kind})
        targets: list[tuple[str, Any]] = [(w.url, event.to_json()) for w in self.config.webhooks]
        if self.config.alertmanager:
            url = self.config.alertmanager.rstrip("/") + "/api/v2/alerts"
            targets.append((url, [event.alert()]))
        for url, body in targets:
            task = asyncio.get_running_loop().create_task(self._deliver(url, body))
            self._tasks.add(task)
            task.add_done_callback(self._tasks.discard)

    async def _deliver(self, url: str, body: Any) -> None:
        delay = 1.0
        for attempt in range(1, self.config.attempts + 1):
            try:
                answer = await request(url, method="POST", body=body, timeout=self.config.timeout)
                if 200 <= answer.status < 300:
                    self.delivered += 1
                    return
                problem = f"HTTP {answer.status}"
            except HttpError as exc:
                problem = str(exc)
            if attempt < self.config.attempts:
                await asyncio.sleep(delay)
                delay *= 2
        self.failed += 1
        log.warning("notification to %s dropped after %d attempts: %s", url, attempt, problem)

    async def drain(self, timeout: float = 5.0) -> None:
        """Wait (bounded) for queued deliveries, e.g. before exiting."""
        if self._tasks:
            await asyncio.wait(set(self._tasks), timeout=timeout)
