"""The controller's doubt about its own view (controller/decide/watcher_doubt.py):
a stalled loop, or every node silent at once."""

from __future__ import annotations

from spark_watchdog.controller.decide.watcher_doubt import WatcherDoubt, all_silent_reason


def _doubt() -> WatcherDoubt:
    return WatcherDoubt(poll_interval=1.0, agent_timeout=0.8, freeze_after=8.0)


def test_ticks_on_time_and_sweeps_that_wait_out_a_silent_agent_are_no_stall() -> None:
    doubt = _doubt()
    now = 0.0
    for _ in range(100):
        doubt.tick_started(now)
        doubt.sweep_took(0.8, now + 0.8)  # a frozen node's poll times out every tick
        now += 1.8
    assert not doubt.stalled(now)
    assert doubt.stall_s == 0.0


def test_a_late_tick_is_doubt_for_freeze_after_then_trust_again() -> None:
    doubt = _doubt()
    doubt.tick_started(0.0)
    doubt.tick_started(20.0)  # stopped for ~20 s
    assert doubt.stalled(20.0)
    reason = doubt.stall_reason(27.9)
    assert reason is not None and "16.2s late" in reason
    assert doubt.stall_reason(28.0) is None


def test_a_sweep_that_took_too_long_is_a_stall_too() -> None:
    doubt = _doubt()
    doubt.tick_started(0.0)
    doubt.sweep_took(10.0, 10.0)  # starved: the polls came back long after their timeout
    assert doubt.stalled(10.0)
    assert doubt.stall_s > 6.0


def test_every_node_silent_is_doubt_only_with_two_nodes_or_more() -> None:
    assert all_silent_reason([True]) is None  # one node: its silence is its own
    assert all_silent_reason([True, False, True]) is None
    reason = all_silent_reason([True, True])
    assert reason is not None and "every node (2)" in reason
