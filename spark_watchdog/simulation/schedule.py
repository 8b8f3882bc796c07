"""When a simulated run's faults come (simulation/run.py): a test's script,
or random draws, each stream from its own generator so that a run without a
pair replays as it did before pairs."""

from __future__ import annotations

import random

from spark_watchdog.simulation.fault_plays import FAULTS
from spark_watchdog.simulation.pair import PAIR_FAULTS

# A scripted fault: at this many simulated seconds, this fault, on this node (None: random).
Scripted = tuple[float, str, "str | None"]


def random_faults(rng: random.Random, fault_window: float, *, scripted: bool) -> list[Scripted]:
    """Random faults (a Poisson process) over the fault window, on random
    nodes; none for a ``scripted`` run, which draws the rate all the same."""
    rate = rng.uniform(1 / 120.0, 1 / 20.0)  # faults per second
    t = 0.0
    schedule: list[Scripted] = []
    while not scripted:
        t += rng.expovariate(rate)
        if t >= fault_window:
            break
        schedule.append((t, rng.choice(FAULTS), None))
    return schedule


def pair_faults(rng: random.Random, fault_window: float) -> list[Scripted]:
    """The pair's faults: its leader paused, killed or cut from the history."""
    t = 0.0
    schedule: list[Scripted] = []
    rate = rng.uniform(1 / 240.0, 1 / 60.0)
    while True:
        t += rng.expovariate(rate)
        if t >= fault_window:
            return schedule
        schedule.append((t, rng.choice(PAIR_FAULTS), None))
