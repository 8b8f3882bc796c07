"""How a simulated run's quiet tail ends (docs/simulation.md, "The tail"): at
rest, or left to a person for ten quiet minutes, or at its cap."""

from __future__ import annotations

import random

from spark_watchdog.simulation.rest import QUIET_S, Stillness, budget_spent_until
from spark_watchdog.simulation.run import Scripted, simulate
from spark_watchdog.simulation.sim_config import random_config

# The head's rank killed by its memory guard, and the serving restart that
# answers it fails: serving stays dead, with one restart spent.
SERVING_DOWN: list[Scripted] = [
    (20.0, "serving-start-fails", "spark-1"),
    (30.0, "mem-collapse", "spark-1"),
]


def _budget(window: float) -> dict[str, dict[str, float]]:
    return {"serving": {"restart_budget": 1, "restart_budget_window": window}}


def test_serving_down_with_its_budget_spent_past_the_cap_is_left_to_a_person() -> None:
    report = simulate(1, 2.0, script=SERVING_DOWN, overrides=_budget(3600.0), peers=True)
    assert report.violations == []
    assert report.tail == "left to a person"
    assert report.verdicts["spark-1"] == "serving_dead"
    # Ten quiet minutes after the fault window at least, the refusal said once.
    assert report.simulated_s >= 2.0 * 60 + QUIET_S
    assert report.alerts.count("serving_budget_spent") == 1


def test_a_budget_back_before_the_cap_is_waited_for() -> None:
    report = simulate(1, 2.0, script=SERVING_DOWN, overrides=_budget(300.0), peers=True)
    assert report.violations == []
    assert report.tail == "at rest"
    assert report.verdicts["spark-1"] == "healthy"
    assert "serving_restarted" in report.alerts


def test_the_budget_is_spent_until_the_cap_while_the_window_ending_there_holds_it() -> None:
    config = random_config(random.Random(0), ["spark-1"], False, _budget(3600.0))
    assert budget_spent_until(config, [100.0], 3699.0)
    assert not budget_spent_until(config, [100.0], 3700.0)  # out of the window by then
    assert not budget_spent_until(config, [], 200.0)
    two = random_config(random.Random(0), ["spark-1"], False, {"serving": {"restart_budget": 2}})
    assert not budget_spent_until(two, [100.0], 200.0)


def test_stillness_counts_from_the_last_change_and_none_never_counts() -> None:
    still = Stillness()
    assert still.still_for("a", 10.0) == 0.0
    assert still.still_for("a", 25.0) == 15.0
    assert still.still_for("b", 30.0) == 0.0
    assert still.still_for(None, 40.0) == 0.0
    assert still.still_for(None, 50.0) == 0.0
    assert still.still_for("b", 60.0) == 0.0
