"""The memory guard's decision (pure, virtual time): collapses are caught before
the floor, healthy allocation patterns never are, pressure needs a low level,
and one collapse is one kill. Random runs check the properties, not a few
staged examples."""

from __future__ import annotations

import random

import pytest

from spark_watchdog.agent.memory_guard import (
    GIB,
    GuardPolicy,
    MemoryGuard,
    MemorySample,
    slope,
)

POLICY = GuardPolicy()
LOOP = 1.0  # the agent's default loop_interval


def _feed(guard: MemoryGuard, levels: list[float], **extra: float) -> list[str]:
    """One reading per LOOP second; the states the guard gave."""
    states = []
    for i, level in enumerate(levels):
        sample = MemorySample(i * LOOP, int(level), **extra)
        states.append(guard.observe(sample).state)
    return states


def test_slope_is_the_least_squares_fit() -> None:
    assert slope([(0.0, 10), (1.0, 8), (2.0, 6)]) == pytest.approx(-2.0)
    assert slope([(0.0, 10)]) is None
    assert slope([(1.0, 10), (1.0, 12)]) is None


@pytest.mark.parametrize("rate_gib", [0.3, 0.5, 1.0, 1.5, 2.0, 2.5])
def test_a_collapse_is_killed_before_the_floor(rate_gib: float) -> None:
    """Up to (watch_below - floor) / (confirm x loop) = 2.5 GiB/s at the defaults,
    whatever the phase of the readings against the fall."""
    rng = random.Random(int(rate_gib * 100))
    for _ in range(200):
        start = rng.uniform(8.0, 40.0) * GIB
        levels = [max(0.0, start - rate_gib * GIB * t) for t in range(0, 200)]
        guard = MemoryGuard(POLICY)
        states = _feed(guard, levels)
        assert "tripped" in states, (rate_gib, start / GIB)
        at = states.index("tripped")
        assert levels[at] > POLICY.floor_bytes, "killed only after the floor"
        assert states.count("tripped") == 1, "one collapse, one kill"


def test_healthy_allocation_patterns_are_never_killed() -> None:
    """A model load: a fast ramp (up to 8 GiB/s) from ~110 GiB down to a plateau
    above watch_below, then the KV cache reserved in steps, then an hour of
    serving with noise and request bursts that come and go."""
    rng = random.Random(7)
    for run in range(300):
        guard = MemoryGuard(POLICY)
        level = rng.uniform(90.0, 115.0) * GIB
        plateau = rng.uniform(6.3, 30.0) * GIB
        ramp = rng.uniform(0.5, 8.0) * GIB
        levels: list[float] = []
        while level > plateau:
            level = max(plateau, level - ramp)
            levels.append(level)
        for _ in range(3600):
            burst = rng.random() < 0.01
            noise = rng.gauss(0.0, 0.05 * GIB)
            dip = rng.uniform(0.0, 0.25) * GIB if burst else 0.0
            levels.append(max(POLICY.watch_below_bytes + 1, plateau - dip + noise))
        states = _feed(guard, levels, psi_full_avg10=rng.choice([0.0, 5.0, 60.0]))
        assert "tripped" not in states and "alarm" not in states, run


def test_a_plateau_below_watch_below_without_pressure_is_left_alone() -> None:
    rng = random.Random(3)
    for _ in range(100):
        plateau = rng.uniform(1.2, 5.9) * GIB
        approach = rng.uniform(0.01, 0.2) * GIB  # a slow approach: not a collapse
        levels = [plateau + approach * (30 - t) for t in range(30)]
        levels += [plateau + rng.gauss(0.0, 0.05 * GIB) for _ in range(600)]
        states = _feed(MemoryGuard(POLICY), levels, psi_full_avg10=1.0, no_memory_per_min=5.0)
        assert "tripped" not in states


@pytest.mark.parametrize(
    ("extra", "level_gib", "trips"),
    [
        ({"psi_full_avg10": 40.0}, 3.0, True),
        ({"psi_full_avg10": 40.0}, 12.0, False),  # plenty left: pressure alone is no reason
        ({"psi_full_avg10": 19.0}, 3.0, False),
        ({"no_memory_per_min": 120.0}, 3.0, True),
        ({"no_memory_per_min": 120.0}, 30.0, False),  # healthy boots log the line too
        ({"no_memory_per_min": 59.0}, 3.0, False),
    ],
)
def test_pressure_counts_only_at_a_low_level(
    extra: dict[str, float], level_gib: float, trips: bool
) -> None:
    states = _feed(MemoryGuard(POLICY), [level_gib * GIB] * 10, **extra)
    assert ("tripped" in states) is trips
    if trips:
        assert states.index("tripped") == POLICY.confirm - 1


def test_pressure_while_memory_comes_back_is_no_reason() -> None:
    levels = [2.0 * GIB + 0.5 * GIB * t for t in range(8)]
    states = _feed(MemoryGuard(POLICY), levels, psi_full_avg10=80.0)
    assert "tripped" not in states


def test_one_reading_in_alarm_is_not_enough() -> None:
    guard = MemoryGuard(POLICY)
    states = _feed(guard, [3 * GIB, 3 * GIB], psi_full_avg10=50.0)
    assert states == ["alarm", "tripped"]
    guard = MemoryGuard(POLICY)
    first = guard.observe(MemorySample(0.0, 3 * GIB, 50.0)).state
    gap = guard.observe(MemorySample(1.0, None)).state  # a failed read breaks the run
    again = guard.observe(MemorySample(2.0, 3 * GIB, 50.0)).state
    assert (first, gap, again) == ("alarm", "unknown", "alarm")


def test_the_guard_waits_rearm_after_then_judges_afresh() -> None:
    guard = MemoryGuard(POLICY)
    low = MemorySample(0.0, 2 * GIB, 50.0)
    assert guard.observe(low).state == "alarm"
    assert guard.observe(MemorySample(1.0, 2 * GIB, 50.0)).trip
    # Within rearm_after: no second kill, whatever the readings say.
    for t in range(2, 31):
        assert guard.observe(MemorySample(float(t), 2 * GIB, 50.0)).state == "cooling_down"
    # Then afresh: the kill freed nothing and the host still runs out: once more.
    assert guard.observe(MemorySample(31.0, 2 * GIB, 50.0)).state == "alarm"
    assert guard.observe(MemorySample(32.0, 2 * GIB, 50.0)).trip
    # The usual end: the memory came back; a flat low level later is no reason.
    guard = MemoryGuard(POLICY)
    _feed(guard, [2 * GIB, 2 * GIB], psi_full_avg10=50.0)
    assert guard.observe(MemorySample(10.0, 50 * GIB)).state == "cooling_down"
    assert guard.observe(MemorySample(31.0, 50 * GIB)).state == "clear"
    for t in range(32, 90):
        assert not guard.observe(MemorySample(float(t), 5 * GIB)).trip


def test_a_kill_says_why() -> None:
    guard = MemoryGuard(POLICY)
    levels = [10 * GIB - GIB * t for t in range(8)]
    assessments = [guard.observe(MemorySample(float(t), int(v))) for t, v in enumerate(levels)]
    trip = next(a for a in assessments if a.trip)
    assert trip.slope_bytes_per_s == pytest.approx(-GIB)
    assert trip.seconds_to_floor is not None and 0 < trip.seconds_to_floor <= POLICY.lead_time_s
    assert any("falling 1.00 GiB/s" in r for r in trip.reasons)
    assert trip.to_json()["agreeing"] == POLICY.confirm


def test_a_step_down_to_a_flat_level_below_watch_below_is_left_alone() -> None:
    """A KV cache reserved in one go: a steep drop, then flat. The window's slope
    is still steep at the first flat reading; the fall since the previous is not."""
    assert (
        _feed(MemoryGuard(POLICY), [40 * GIB, 30 * GIB, 20 * GIB, 10 * GIB] + [4.5 * GIB] * 30)[
            -30:
        ].count("tripped")
        == 0
    )
    rng = random.Random(11)
    for _ in range(500):
        # A ramp of any speed that stays above watch_below, then one step into the
        # zone to a flat level: falling again on the next reading would be a collapse.
        flat = rng.uniform(1.3, 5.9) * GIB
        level = rng.uniform(40.0, 110.0) * GIB
        above = POLICY.watch_below_bytes + rng.uniform(0.1, 3.0) * GIB
        ramp = rng.uniform(0.5, 8.0) * GIB
        levels = []
        while level > above:
            level = max(above, level - ramp)
            levels.append(level)
        states = _feed(MemoryGuard(POLICY), [*levels] + [flat] * 60)
        assert "tripped" not in states, (above / GIB, flat / GIB, ramp / GIB)
