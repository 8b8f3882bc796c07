"""What a ladder works with: the controller's parts and its serving restarts.

The freeze, wedged and clock-latch ladders (recovery.py, wedged.py,
unlatch.py, ladder_tasks.py) each end by restarting serving, so they get
the serving restarts (serving_policy.py) beside the parts every piece of
the controller shares (parts.py). Never the controller itself.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from spark_watchdog.controller.act.parts import Parts
from spark_watchdog.controller.serving.serving_policy import ServingRestarts


@dataclass(frozen=True)
class Crew(Parts):
    serving: ServingRestarts

    @classmethod
    def of(cls, parts: Parts, serving: ServingRestarts) -> Crew:
        return cls(**{f.name: getattr(parts, f.name) for f in fields(parts)}, serving=serving)
