"""What the controller is doing about one node beyond its state: the act
side's record of the node, changed only through the methods here (each one
thing that happened), never assigned from outside (a test in
tests/architecture checks it). What the controller sees of the node is
``NodeWatch``, written by the monitor; where it stands is its state
(controller/decide/node_states.py); what it has done is here."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

from spark_watchdog.controller.decide.planner import Step


@dataclass
class NodeConduct:
    # The open host_frozen incident this controller runs for the node, and its
    # power paths already run in it.
    incident_id: int | None = None
    _rungs_done: set[int] = field(default_factory=set)
    # Commands a pair's send gate refused in a row (controller/act/recovery.py).
    send_refusals: int = 0
    # The dry-run incident of the current spell (a freeze, a serving fault, a
    # wedged GPU): one per spell, not one per tick.
    dry_run_incident: int | None = None
    # What it recorded: the freeze's rung, the wedged ladder or a serving restart
    # (a spell of one kind does not hide the next spell of another).
    dry_run_step: Step | None = None
    last_agent_restart: float = float("-inf")  # monotonic
    # A hold the controller placed itself (recovery failure, ambiguity) that the
    # history could not take yet: written as soon as it can be, released never
    # by the sync.
    held_by_controller: bool = False
    # Repeat offenders (from the history, refreshed by the controller).
    freezes_in_window: int = 0
    hardware_suspect: bool = False
    power_cycles_total: int = 0
    # The boot the clock-latch alert went out for, and the boot an unlatch ladder ran for.
    clock_latch_alerted: str | None = None
    clock_latch_answered: str | None = None

    @property
    def rungs_done(self) -> frozenset[int]:
        return frozenset(self._rungs_done)

    # -- the freeze incident -------------------------------------------------

    def incident_opened(self, incident: int) -> None:
        self.incident_id = incident
        self._rungs_done.clear()
        self.send_refusals = 0

    def incident_resumed(self, incident: int, rungs_done: Iterable[int]) -> None:
        self.incident_id = incident
        self._rungs_done = set(rungs_done)

    def incident_closed(self) -> None:
        self.incident_id = None
        self._rungs_done.clear()

    def incident_handed_over(self) -> None:
        """The incident is a person's now (held in dry run): no longer ours to run."""
        self.incident_id = None

    def rung_ran(self, rung: int) -> None:
        """A power path ran in the incident and did not bring the node back."""
        self._rungs_done.add(rung)

    def ladder_over(self) -> None:
        """The incident is over: the node's next freeze starts from the first rung."""
        self._rungs_done.clear()

    def command_went_out(self) -> None:
        """A command went out (or none was needed): the send gate's refusals end."""
        self.send_refusals = 0

    def command_refused(self) -> int:
        """The send gate refused a command: how many in a row now."""
        self.send_refusals += 1
        return self.send_refusals

    # -- everything else ---------------------------------------------------

    def dry_run_recorded(self, incident: int | None, step: Step | None = None) -> None:
        """The spell's dry-run incident (None: the next spell's is a new one)."""
        self.dry_run_incident = incident
        self.dry_run_step = step if incident is not None else None

    def agent_restarted(self, at: float) -> None:
        self.last_agent_restart = at

    def held(self, *, by_controller: bool) -> None:
        self.held_by_controller = by_controller

    def offender_counts(self, freezes: int, cycles: int, *, suspect: bool) -> None:
        self.freezes_in_window = freezes
        self.power_cycles_total = cycles
        self.hardware_suspect = suspect

    def latch_alerted(self, boot: str | None) -> None:
        self.clock_latch_alerted = boot

    def latch_answered(self, boot: str | None) -> None:
        self.clock_latch_answered = boot
