"""Post-boot GPU clock check: is the GPU clock-latched on this boot? Pure.

After some faults a GB10's GPU stays clock-latched (the SM clock held near
702 MHz instead of about 2.4 GHz under load); an OS reboot does not clear
it, minutes without AC do, and in that state the illegal memory access comes
back (docs/facts.md, "Clock latch"). An idle GPU runs low clocks too,
so a clock reading means something only under load: the check counts GPU
readings with utilization at or above ``busy_util_pct`` (the model's load
and warm-up after a boot is such a load) and judges once it has
``busy_samples`` of them:

- ``ok``: some busy reading reached ``floor_mhz``;
- ``latched``: every busy reading stayed below it (the evidence: the highest
  clock seen, the readings counted);
- ``no_load``: ``window`` seconds after the agent started, too few busy
  readings to judge (nothing ran on the GPU);
- ``pending`` until then.

One judgement per agent start (a start is a boot, or a restart on one): the
controller answers a ``latched`` node once per boot id.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

from spark_watchdog.probes.gpu import GpuReading

ClockState = Literal["pending", "ok", "latched", "no_load"]


@dataclass(frozen=True)
class ClockPolicy:
    floor_mhz: int = 1400
    busy_util_pct: int = 60
    busy_samples: int = 10
    window_s: float = 1800.0


class ClockCheck:
    """Feed GPU readings with :meth:`observe`; :attr:`state` says what was found."""

    def __init__(self, policy: ClockPolicy, started: float) -> None:
        self.policy = policy
        self.started = started
        self.state: ClockState = "pending"
        self.busy = 0
        self.max_busy_mhz: int | None = None
        self.decided_after_s: float | None = None

    def observe(self, reading: GpuReading, now: float) -> ClockState:
        if self.state != "pending":
            return self.state
        if reading.state == "ok":
            for device in reading.devices:
                util, clock = device.utilization_gpu_pct, device.sm_clock_mhz
                if util is None or clock is None or util < self.policy.busy_util_pct:
                    continue
                self.busy += 1
                self.max_busy_mhz = (
                    clock if self.max_busy_mhz is None else max(self.max_busy_mhz, clock)
                )
        if self.max_busy_mhz is not None and self.max_busy_mhz >= self.policy.floor_mhz:
            self._decide("ok", now)
        elif self.busy >= self.policy.busy_samples:
            self._decide("latched", now)
        elif now - self.started >= self.policy.window_s:
            self._decide("no_load", now)
        return self.state

    def _decide(self, state: ClockState, now: float) -> None:
        self.state = state
        self.decided_after_s = round(now - self.started, 1)

    def to_json(self) -> dict[str, Any]:
        return {
            "enabled": True,
            "state": self.state,
            "floor_mhz": self.policy.floor_mhz,
            "busy_util_pct": self.policy.busy_util_pct,
            "busy_readings": self.busy,
            "busy_readings_needed": self.policy.busy_samples,
            "max_busy_sm_clock_mhz": self.max_busy_mhz,
            "decided_after_s": self.decided_after_s,
        }


def disabled_json() -> dict[str, Any]:
    return {"enabled": False, "state": "disabled"}
