"""What the freeze ladder works with (controller/act/recovery.py), and what a
rung and a resumed cycle use of their ladder (controller/act/rung.py,
controller/act/left_cycle.py): written once here, so that each of them depends
on this and not on the others."""

from __future__ import annotations

import enum
from dataclasses import dataclass
from typing import Any, Protocol

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.power_actions import PowerActions
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.decide.node_states import NodeEvent
from spark_watchdog.controller.look.monitor import Monitor
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.controller.serving.serving_policy import ServingRestarts


class RungOutcome(enum.Enum):
    RECOVERED = "recovered"  # a new boot id: the incident is resolved
    FALSE_ALARM = "false_alarm"  # the host showed life before anything was cut
    NEXT = "next"  # this rung failed or the boot never came: the next rung, if any
    HELD = "held"  # a person decides (ambiguity, a guard, the ladder ran out)
    # The circuit breaker refused the rung before anything was sent: it waits for
    # the breaker, then starts again from its preflight (recovery.FreezeLadder._wait_out_breaker).
    BREAKER = "breaker"
    # A resumed off never seen to land (the outlet on, no new boot within
    # boot_timeout): the same rung once more, fresh, through its preflight.
    AGAIN = "again"


@dataclass(frozen=True)
class FreezeTools:
    """What the freeze ladder works with, and nothing else."""

    config: ControllerConfig
    clock: Clock
    ledger: Ledger
    notifier: Notifier
    monitor: Monitor  # the last look before a cut, the boots after it
    holds: Holds
    power: PowerActions
    serving: ServingRestarts  # serving again once the node is back


class LadderSteps(Protocol):
    """What a rung uses of its ladder: the incident's node and record."""

    tools: FreezeTools
    watch: NodeWatch
    incident_id: int

    def boot_wait_left(self, started_at: float | None) -> float: ...

    async def await_new_boot(
        self, boot_before: str | None, timeout: float, *, resumed: bool = False
    ) -> RungOutcome: ...

    async def hold_and_close(self, reason: str, event: NodeEvent) -> None: ...

    def tell(self, kind: str, summary: str, detail: dict[str, Any] | None = None) -> None: ...

    async def note(self, step: str, *, off_side: bool = False, **detail: Any) -> None: ...

    async def finish(
        self,
        action: Any,
        result: str,
        error: str | None,
        step: str | None = None,
        detail: dict[str, Any] | None = None,
    ) -> None: ...
