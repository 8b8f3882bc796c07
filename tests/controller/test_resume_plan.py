"""Reading an incident's log back (controller/decide/resume_plan.py): what a
controller that takes over, or restarts, resumes from."""

from __future__ import annotations

from typing import Any

from spark_watchdog.controller.decide.resume_plan import resume_plan
from spark_watchdog.history.records import IncidentStep
from spark_watchdog.steps import OFF_SIDE


def _log(*steps: tuple[str, dict[str, Any]]) -> list[IncidentStep]:
    return [
        IncidentStep(1, seq, 100.0 + seq, "spark-2", name, {"rung": 0, **detail}, 1)
        for seq, (name, detail) in enumerate(steps, start=1)
    ]


def test_an_off_the_gate_withdrew_starts_the_rung_over() -> None:
    info = resume_plan(
        _log(("rung_started", {}), ("off_requested", {}), ("off_withdrawn", {})), "spark-2"
    )
    assert info.plan is not None and info.plan.resume_from == "off_withdrawn"
    assert info.plan.fresh  # nothing left: the preflight and the off again


def test_an_on_the_gate_withdrew_resumes_on_the_off_side() -> None:
    log = _log(
        ("rung_started", {}),
        ("off_requested", {}),
        ("off_verified", {}),
        ("hold_started", {}),
        ("hold_done", {}),
        ("on_requested", {}),
        ("on_withdrawn", {}),
    )
    info = resume_plan(log, "spark-2")
    assert info.plan is not None and info.plan.resume_from == "on_withdrawn"
    assert info.plan.resume_from in OFF_SIDE and not info.plan.fresh
    assert info.plan.off_verified_at == log[2].at  # the hold counts from the verified off


def test_a_retried_plain_off_does_not_inherit_a_withdrawn_timed_one() -> None:
    log = _log(
        ("rung_started", {}),
        ("off_requested", {"on_after_s": 90.0}),
        ("off_withdrawn", {}),
        ("timed_on_unavailable", {}),
        ("off_requested", {}),
    )
    info = resume_plan(log, "spark-2")
    assert info.plan is not None and info.plan.resume_from == "off_requested"
    assert info.plan.timed_on_after is None
    assert info.plan.off_requested_at == log[4].at


def test_a_timed_off_is_read_back_as_timed() -> None:
    log = _log(("rung_started", {}), ("off_requested", {"on_after_s": 90.0}))
    info = resume_plan(log, "spark-2")
    assert info.plan is not None and info.plan.timed_on_after == 90.0


def _unsent_off_waited_out(*, again: bool) -> list[IncidentStep]:
    return _log(
        ("rung_started", {"boot_id_before": "b0", "off_seconds": 180.0}),
        ("off_requested", {}),
        ("resumed", {"last_step": "off_requested", "state": "on"}),
        ("resumed", {"settled_by": "the boot wait, then ...", "again": again}),
        ("boot_wait_started", {}),
        ("boot_timeout", {}),
    )


def test_a_controller_killed_after_the_boot_wait_of_an_unsent_off_owes_its_second_try() -> None:
    info = resume_plan(_unsent_off_waited_out(again=True), "spark-2")
    assert info.plan is not None and info.plan.fresh and info.plan.attempt == 2
    assert info.plan.rung == 0 and info.rungs_done == set()
    # The second try is a rung like the first: the frozen boot, the long cut.
    assert info.plan.boot_before == "b0" and info.plan.off_seconds == 180.0
    assert info.plan.action_id is None  # a new action, counted by the budgets


def test_a_timed_off_waited_out_goes_on_to_the_next_rung() -> None:
    info = resume_plan(_unsent_off_waited_out(again=False), "spark-2")
    assert info.plan is None and info.rungs_done == {0}


def test_a_second_try_resumes_as_the_second() -> None:
    log = [
        *_unsent_off_waited_out(again=True),
        *_log(("rung_started", {"attempt": 2}), ("off_requested", {})),
    ]
    info = resume_plan(log, "spark-2")
    assert info.plan is not None and info.plan.attempt == 2
    assert info.plan.resume_from == "off_requested"


def test_a_controller_killed_during_that_boot_wait_goes_on_with_it() -> None:
    """Restarts during the wait each note their resume; the wait counts from the first."""
    log = _log(
        ("rung_started", {"boot_id_before": "b0"}),
        ("off_requested", {}),
        ("resumed", {"last_step": "off_requested", "state": "on"}),
        ("resumed", {"settled_by": "the boot wait, then ...", "again": True}),
        ("resumed", {"last_step": "off_requested", "state": "on"}),
        ("resumed", {"settled_by": "the boot wait, then ...", "again": True}),
    )
    info = resume_plan(log, "spark-2")
    assert info.plan is not None and info.plan.resume_from == "off_requested"
    assert info.plan.again_after_wait and info.plan.attempt == 1
    assert info.plan.boot_wait_from == log[3].at
    # The second try starts a wait of its own.
    assert info.plan.again().boot_wait_from is None
