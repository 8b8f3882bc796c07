"""Doctor's look at the agents' peer lists (spark_watchdog/doctor/peer_checks.py)."""

from __future__ import annotations

from typing import Any

from spark_watchdog.config.controller import parse_controller_config
from spark_watchdog.doctor.peer_checks import judge_peers

CONFIG = parse_controller_config(
    {"nodes": [{"name": f"spark-{i}", "agent": f"http://10.0.0.{i}:9720"} for i in (1, 2, 3)]}
)


def state(**peers: str) -> dict[str, Any]:
    return {"peers": {k.replace("_", "-"): {"via": v, "state": "ok"} for k, v in peers.items()}}


def fabric(n: int) -> str:
    return f"http://192.168.100.{n}:9720"


def test_every_agent_watching_every_other_at_its_fabric_address_is_ok() -> None:
    snapshots = {
        "spark-1": state(spark_2=fabric(2), spark_3=fabric(3)),
        "spark-2": state(spark_1=fabric(1), spark_3=fabric(3)),
        "spark-3": state(spark_1=fabric(1), spark_2=fabric(2)),
    }
    finding = judge_peers(CONFIG, snapshots)
    assert finding.status == "ok" and "3 agents watch 6 peers" in finding.detail


def test_no_peers_anywhere_is_said_not_failed() -> None:
    finding = judge_peers(CONFIG, {"spark-1": {}, "spark-2": {"peers": {}}, "spark-3": None})
    assert finding.status == "skip" and "looks frozen" in finding.detail


def test_a_peer_over_the_management_address_and_a_one_way_watch_warn() -> None:
    snapshots = {
        "spark-1": state(spark_2="http://10.0.0.2:9720"),  # the management address
        "spark-2": state(spark_3=fabric(3)),
        "spark-3": state(spark_2=fabric(2)),
    }
    finding = judge_peers(CONFIG, snapshots)
    assert finding.status == "warn"
    assert "spark-1 pulses spark-2 at http://10.0.0.2:9720, its management address" in (
        finding.detail
    )
    assert "spark-1 watches spark-2" not in finding.detail  # said once, as the path
    assert finding.fix is not None and "fabric" in finding.fix


def test_a_watch_one_way_is_named() -> None:
    snapshots = {"spark-1": state(spark_2=fabric(2)), "spark-2": state(), "spark-3": None}
    finding = judge_peers(CONFIG, snapshots)
    assert finding.status == "warn"
    assert finding.detail == "spark-1 watches spark-2, spark-2 does not watch spark-1"


def test_a_peer_the_config_does_not_know_fails() -> None:
    finding = judge_peers(CONFIG, {"spark-1": state(spark_9=fabric(9))})
    assert finding.status == "fail" and "spark-1 lists spark-9" in finding.detail
