"""What the gentler ladders work with (a wedged GPU: controller/act/wedged.py; a
clock-latched one: controller/act/unlatch.py), and nothing else: not the
controller's whole set of parts (controller/act/parts.py)."""

from __future__ import annotations

from dataclasses import dataclass

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.controller.act.holds import Holds
from spark_watchdog.controller.act.power_actions import PowerActions
from spark_watchdog.controller.clock import Clock
from spark_watchdog.controller.record.ledger import Ledger
from spark_watchdog.controller.record.notify import Notifier
from spark_watchdog.controller.serving.serving_policy import ServingRestarts


@dataclass(frozen=True)
class GentleTools:
    config: ControllerConfig
    clock: Clock
    ledger: Ledger
    notifier: Notifier
    holds: Holds  # a person decides: the node held
    power: PowerActions  # the guards, and the forced reboot or halt over SSH
    serving: ServingRestarts  # the wedged ladder's first rung and its last
