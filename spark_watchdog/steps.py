"""The steps of an incident, as one vocabulary (docs/design.md, "Freeze history").

Written by the power layer (``VerifiedPower``'s steps), the ladder and the
serving restart; read by resume, the CLI's timeline and the lab. A
``str`` enum: each member is its own string in the history (and equal to
it), so old records read as they were written. The store accepts any snake_case step; these are
the ones the product writes.
"""

from __future__ import annotations

import enum


class StepName(str, enum.Enum):
    # str and format give the bare value on every supported Python (3.10 has no StrEnum).
    def __str__(self) -> str:
        return str(self.value)

    def __format__(self, spec: str) -> str:
        return format(str(self.value), spec)

    INCIDENT_OPENED = "incident_opened"
    # The ladder, per rung
    RUNG_STARTED = "rung_started"
    RUNG_BLOCKED = "rung_blocked"  # a hold, budget or the breaker stopped it before any command
    PREFLIGHT_ANSWERED = "preflight_answered"  # the last look found life: false alarm
    OUTLET_FOUND_OFF = "outlet_found_off"  # off before our off: a person's doing; held
    RUNG_FAILED = "rung_failed"
    RESUMED = "resumed"
    # VerifiedPower's steps (power/base.py), in the order they can come
    FOUND_OFF = "found_off"
    DRY_RUN = "dry_run"
    OFF_SPACING = "off_spacing"
    OFF_REQUESTED = "off_requested"
    OFF_WITHDRAWN = "off_withdrawn"
    OFF_AMBIGUOUS = "off_ambiguous"
    OFF_VERIFIED = "off_verified"
    ALREADY_OFF = "already_off"
    HOLD_STARTED = "hold_started"
    HOLD_DONE = "hold_done"
    # A self-timed cycle (the off armed the device's own on)
    TIMED_ON_UNAVAILABLE = "timed_on_unavailable"  # the device cannot this time: a plain cycle
    HOLD_CUT_SHORT = "hold_cut_short"  # the device switched on before the hold ended
    ON_AWAITED = "on_awaited"  # the hold is done; the device's own on is awaited
    ON_NOT_BY_DEVICE = "on_not_by_device"  # it did not come: the on is sent
    ON_SPACING = "on_spacing"
    ON_REQUESTED = "on_requested"
    ON_WITHDRAWN = "on_withdrawn"
    ON_AMBIGUOUS = "on_ambiguous"
    ON_VERIFIED = "on_verified"
    ALREADY_ON = "already_on"
    # After the cycle
    POWER_RESTORED = "power_restored"
    BOOT_WAIT_STARTED = "boot_wait_started"
    NEW_BOOT_SEEN = "new_boot_seen"
    BOOT_TIMEOUT = "boot_timeout"
    # When the history could not be written mid-cycle (recorded once it can be)
    UNRECORDED = "unrecorded"
    # The controller held the node (ambiguity, a failure, a guard)
    HELD = "held"
    SUPERSEDED = "superseded"
    # Serving
    SERVING_RESTART_DEFERRED = "serving_restart_deferred"
    SERVING_RESTART_STARTED = "serving_restart_started"
    SERVING_RESTART_DONE = "serving_restart_done"
    STACKS_RECORDED = "stacks_recorded"  # the ranks' Python stacks, taken before the stop
    # The wedged-but-alive ladder (controller/act/wedged.py)
    STILL_WEDGED = "still_wedged"  # the serving restart did not bring the GPU back
    REBOOT_REQUESTED = "reboot_requested"  # the forced reboot, recorded before it is sent
    REBOOT_SENT = "reboot_sent"
    REBOOT_NOT_SENT = "reboot_not_sent"  # certainly not sent (no connection, key refused)
    HANDED_TO_POWER_PATH = "handed_to_power_path"  # silent after the reboot: the freeze path
    # A clock-latched GPU (controller/act/unlatch.py): a clean halt before the long cut
    HALT_REQUESTED = "halt_requested"  # recorded before it is sent
    HALT_SENT = "halt_sent"
    HALT_NOT_SENT = "halt_not_sent"
    RESOLVED = "resolved"


# Steps after which the outlet may be off and the on not yet verified.
OFF_SIDE = frozenset(
    {
        StepName.OFF_VERIFIED,
        StepName.ALREADY_OFF,
        StepName.HOLD_STARTED,
        StepName.HOLD_DONE,
        StepName.ON_AWAITED,
        StepName.ON_NOT_BY_DEVICE,
        StepName.ON_SPACING,
        StepName.ON_WITHDRAWN,  # a pair's send gate refused the on: the outlet is off
    }
)
# Steps after which an off may have left but was not read back.
OFF_UNSETTLED = frozenset({StepName.OFF_REQUESTED, StepName.OFF_AMBIGUOUS})
ON_UNSETTLED = frozenset({StepName.ON_REQUESTED, StepName.ON_AMBIGUOUS, StepName.HOLD_CUT_SHORT})
# Steps of a rung before anything was sent: a resume starts the rung over.
NOTHING_SENT = frozenset(
    {
        StepName.RUNG_STARTED,
        StepName.TIMED_ON_UNAVAILABLE,
        StepName.OFF_SPACING,
        StepName.OFF_WITHDRAWN,
        StepName.FOUND_OFF,
    }
)
