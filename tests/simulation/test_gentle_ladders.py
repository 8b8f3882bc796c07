"""The real controller on virtual time, the gentler roads: a memory guard's
kills and a wedged GPU answered by serving restarts and a forced reboot
within their budgets, a node that keeps freezing flagged, and a clock-latched
GPU halted and cut once for its long hold (docs/simulation.md). A module of
its own so that it runs beside the fencing tests of test_simulation.py.
See docs/design.md, "Memory guard";
docs/design.md, "Wedged but alive";
docs/design.md, "Clock latch".
"""

from __future__ import annotations

import itertools

import pytest

from spark_watchdog.simulation.run import Scripted, simulate


def test_memory_guard_kills_restart_serving_within_the_budget_and_never_power() -> None:
    """Five kills by spark-2's memory guard in four minutes, a restart budget of
    two: two memory_exhausted incidents, each with one safe serving restart,
    then the budget alert; no power command at all."""
    kills: list[tuple[float, str, str | None]] = [
        (30.0 + 45.0 * i, "mem-collapse", "spark-2") for i in range(5)
    ]
    overrides = {
        "serving": {"restart_budget": 2, "restart_budget_window": 3600.0, "restart_cooldown": 0.0}
    }
    for seed in range(4):
        report = simulate(seed, 5.0, script=kills, overrides=overrides)
        assert report.violations == [], report.violations
        assert report.sent == []
        assert report.resolutions == ["recovered", "recovered"]
        assert report.alerts.count("serving_restarted") == 2
        assert "serving_budget_spent" in report.alerts
        # A controller killed in the middle of the restart: the next one finds
        # the kill's incident in the history and does not answer it again. A
        # restart cut short after its stops leaves the ranks down: the next
        # controller sees serving_dead and restarts serving for that.
        crashed = simulate(
            seed, 3.0, script=[kills[0], (31.5, "controller-kill", None)], overrides={"serving": {}}
        )
        assert crashed.violations == [] and crashed.sent == []
        assert crashed.kinds.count("memory_exhausted") == 1, crashed.kinds
        assert set(crashed.kinds) <= {"memory_exhausted", "serving_dead"}, crashed.kinds


def test_a_wedged_gpu_gets_a_serving_restart_then_one_forced_reboot_never_power_while_alive() -> (
    None
):
    """spark-2's GPU reads time out while its agent answers: the serving restart
    does not help, a forced reboot over SSH does (a new boot); no power command
    unless the reboot itself hung and the host went silent."""
    outcomes: set[str] = set()
    for seed in range(12):
        report = simulate(seed, 6.0, script=[(30.0, "gpu-hang", "spark-2")])
        assert report.violations == [], report.violations
        assert "forced_reboot" in report.alerts
        if report.sent:
            # Only the freeze path sends power, after the reboot hung and the host
            # stayed silent for boot_timeout: the wedged incident was handed over.
            assert sorted(report.resolutions) == ["gave_up", "recovered"]
            assert "reboot_overdue" in report.alerts
            outcomes.add("handed to the power path")
        elif report.resolutions == ["recovered"]:
            assert report.alerts.count("serving_restarted") == 2  # before and after the reboot
            outcomes.add("recovered by the reboot")
        else:
            # The reboot could not be sent, or the GPU stayed wedged after it.
            assert report.verdicts["spark-2"] == "held" and "held" in report.alerts
            outcomes.add("held")
    assert outcomes == {"recovered by the reboot", "handed to the power path", "held"}


def test_forced_reboots_stay_within_the_node_budget() -> None:
    """A GPU that wedges again and again: at most node_budget forced reboots in
    the window, then the node is held for a person."""
    script: list[tuple[float, str, str | None]] = [
        (30.0 + 100.0 * i, "gpu-hang", "spark-3") for i in range(4)
    ]
    overrides = {"guards": {"node_budget": 2, "budget_window": 3600.0, "dry_run": False}}
    held = 0
    for seed in range(8):
        report = simulate(seed, 8.0, script=script, overrides=overrides)
        assert report.violations == [], report.violations
        assert report.alerts.count("forced_reboot") <= 2
        held += report.verdicts["spark-3"] == "held"
    assert held


def test_a_node_that_keeps_freezing_is_flagged_hardware_suspect_once() -> None:
    script: list[tuple[float, str, str | None]] = [
        (30.0 + 150.0 * i, "freeze", "spark-4") for i in range(3)
    ]
    overrides = {
        "guards": {
            "node_budget": 5,
            "cluster_budget": 8,
            "budget_window": 3600.0,
            "suspect_freezes": 3,
            "dry_run": False,
        },
        "policy": {"power_off_seconds": 5.0},
    }
    flagged = 0
    for seed in range(4):
        report = simulate(seed, 9.0, script=script, overrides=overrides)
        assert report.violations == [], report.violations
        # Flagged at the third freeze that was one (a false alarm is none), alerted once.
        freezes = sum(r != "false_alarm" for r in report.resolutions)
        assert report.alerts.count("hardware_suspect") == (1 if freezes >= 3 else 0)
        flagged += freezes >= 3
    assert flagged


def test_a_guard_kill_without_auto_restart_is_told_once_and_restarts_nothing() -> None:
    report = simulate(
        3,
        3.0,
        script=[(30.0, "mem-collapse", "spark-3")],
        overrides={"serving": {"auto_restart": False}},
    )
    assert report.violations == [] and report.sent == []
    assert report.alerts.count("memory_exhausted") == 1
    assert "serving_restarted" not in report.alerts and report.resolutions == []
    assert report.verdicts["spark-3"] == "healthy"  # not memory_exhausted for ever


def test_an_unexpected_error_in_the_wedged_ladder_holds_the_node_and_sends_nothing() -> None:
    script: list[Scripted] = [(29.0, "ssh-bug", "spark-2"), (30.0, "gpu-hang", "spark-2")]
    report = simulate(1, 6.0, script=script)
    assert report.violations == []
    assert report.sent == []
    assert report.verdicts["spark-2"] == "held"
    assert report.resolutions == ["gave_up"]


def test_an_unexpected_error_in_the_unlatch_ladder_is_alerted_and_sends_nothing() -> None:
    script: list[Scripted] = [(29.0, "ssh-bug", "spark-2"), (30.0, "clock-latch", "spark-2")]
    overrides = {"guards": {"dry_run": False}, "policy": {"clock_latch_off_seconds": 180.0}}
    report = simulate(3, 8.0, script=script, overrides=overrides, self_timed="never")
    assert report.violations == []
    assert report.sent == []
    assert "clock_latch_not_cleared" in report.alerts
    assert report.resolutions == ["gave_up"]


def test_a_clock_latched_gpu_is_halted_then_cut_once_for_the_long_hold() -> None:
    """The latch survives a reboot; the controller halts the node over SSH, and
    once it is silent the power path cuts it for clock_latch_off_seconds."""
    script: list[tuple[float, str, str | None]] = [(30.0, "clock-latch", "spark-2")]
    overrides = {"guards": {"dry_run": False}, "policy": {"clock_latch_off_seconds": 180.0}}
    report = simulate(3, 8.0, script=script, overrides=overrides, self_timed="never")
    assert report.violations == []
    assert report.sent == [("spark-2", "off"), ("spark-2", "on")]
    assert report.alerts.count("clock_latched") == 1
    assert "clock_latch_halted" in report.alerts and "reboot_overdue" not in report.alerts
    assert report.resolutions == ["recovered", "recovered"]  # the cut, and the latch


def test_a_latch_that_outlives_its_long_cut_is_alerted_not_cut_again() -> None:
    script: list[tuple[float, str, str | None]] = [
        (30.0, "clock-latch", "spark-2"),
        (400.0, "clock-latch", "spark-2"),  # latched again on the boot after the cut
        (420.0, "reboot", "spark-2"),
    ]
    overrides = {
        "guards": {"dry_run": False, "node_budget": 5},
        "policy": {"clock_latch_off_seconds": 60.0},
    }
    report = simulate(3, 10.0, script=script, overrides=overrides, self_timed="never")
    assert report.violations == []
    assert report.sent.count(("spark-2", "off")) == 1
    assert "clock_latch_not_cleared" in report.alerts
    assert report.verdicts["spark-2"] == "healthy"  # still protected from a freeze


def test_a_clock_latch_in_dry_run_or_with_the_cut_off_sends_nothing() -> None:
    script: list[tuple[float, str, str | None]] = [(30.0, "clock-latch", "spark-2")]
    for overrides in (
        {"guards": {"dry_run": True}},
        {"guards": {"dry_run": False}, "policy": {"clock_latch_off_seconds": 0}},
    ):
        report = simulate(3, 4.0, script=script, overrides=overrides)
        assert report.violations == []
        assert report.sent == []
        assert report.alerts.count("clock_latched") == 1


def test_a_latch_seen_while_the_node_is_busy_is_answered_once_it_is_free() -> None:
    """Latched during a freeze incident's serving restart: answered after it, not lost."""
    overrides = {"guards": {"dry_run": False, "node_budget": 5}}
    halted = 0
    for seed, at in itertools.product((3, 5, 6), (40.0, 48.0, 56.0)):
        script: list[tuple[float, str, str | None]] = [
            (30.0, "freeze", "spark-2"),
            (at, "clock-latch", "spark-2"),
        ]
        report = simulate(seed, 10.0, script=script, overrides=overrides, self_timed="never")
        assert report.violations == [], (seed, at)
        # Answered once the freeze incident was over: a halt, or an alert saying why not.
        assert {"clock_latch_halted", "clock_latch_not_cleared"} & set(report.alerts), (seed, at)
        halted += "clock_latch_halted" in report.alerts
    assert halted


def test_latches_on_every_node_are_answered_one_at_a_time() -> None:
    script: list[tuple[float, str, str | None]] = [
        (30.0, "clock-latch", n) for n in ("spark-1", "spark-2", "spark-3", "spark-4")
    ]
    overrides = {"guards": {"dry_run": False, "node_budget": 3, "cluster_budget": 8}}
    for seed in range(4):
        report = simulate(seed, 30.0, script=script, overrides=overrides, self_timed="never")
        assert report.violations == [], seed  # I10: nobody left halted, one halt per latch
        assert "circuit_breaker" not in report.alerts
        assert report.alerts.count("clock_latch_halted") >= 2


# Every committed write of one undisturbed unlatch (the halt, the handover, the long cut).
UNLATCH_SCRIPT: list[tuple[float, str, str | None]] = [(30.0, "clock-latch", "spark-2")]
UNLATCH_OVERRIDES = {"guards": {"dry_run": False}, "policy": {"clock_latch_off_seconds": 120.0}}
UNLATCH_WRITES = simulate(
    3, 8.0, script=UNLATCH_SCRIPT, overrides=UNLATCH_OVERRIDES, self_timed="never"
).writes


@pytest.mark.parametrize("after", range(1, UNLATCH_WRITES + 1, 2))
def test_a_crash_after_any_write_of_an_unlatch_keeps_every_invariant(after: int) -> None:
    report = simulate(
        3,
        8.0,
        script=UNLATCH_SCRIPT,
        overrides=UNLATCH_OVERRIDES,
        crash_after_write=after,
        self_timed="never",
    )
    assert report.violations == [], after
    assert report.sent.count(("spark-2", "off")) <= 1


def test_a_hold_on_another_node_does_not_stop_an_unlatch() -> None:
    script: list[tuple[float, str, str | None]] = [
        (20.0, "hold", "spark-4"),
        (30.0, "clock-latch", "spark-2"),
    ]
    report = simulate(3, 8.0, script=script, overrides={"guards": {"dry_run": False}})
    assert report.violations == []
    assert "clock_latch_halted" in report.alerts
    assert ("spark-2", "off") in report.sent and not any(n == "spark-4" for n, _ in report.sent)
