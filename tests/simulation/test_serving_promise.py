"""A serving restart decided and not yet recorded counts against the serving
budget (controller/serving/serving_policy.py): two wedged nodes decided in one tick
must not both restart serving past a budget of one."""

from __future__ import annotations

from spark_watchdog.simulation.run import Scripted, simulate


def test_two_nodes_wedged_at_once_restart_serving_within_the_budget() -> None:
    script: list[Scripted] = [(30.0, "gpu-hang", "spark-2"), (30.0, "gpu-hang", "spark-3")]
    report = simulate(235, 4.0, script=script, overrides={"serving": {"restart_budget": 1}})
    assert report.violations == []
    assert "serving_budget_spent" in report.alerts
