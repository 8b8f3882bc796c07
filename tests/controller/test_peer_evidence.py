"""What the controller takes from the agents' reports on their peers
(controller/look/peer_evidence.py): only a peer it reads as alive itself, with the
report's age counted, and nothing from a report that says anything else."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import pytest

from spark_watchdog.controller.look.peer_evidence import Sighting, group_sightings, sightings

FREEZE_AFTER = 8.0
NODES = ("spark-1", "spark-2", "spark-3", "spark-4")


@dataclass
class Report:
    name: str
    snapshot: dict[str, Any] | None
    snapshot_at: float | None = 99.5
    agent_progress_at: float | None = 99.5


def peers(**reports: Any) -> dict[str, Any]:
    return {"peers": {k.replace("_", "-"): v for k, v in reports.items()}}


def ok(ago: Any, via: str = "http://10.20.0.3:9101") -> dict[str, Any]:
    return {"state": "ok", "progress_ago_s": ago, "via": via, "seq": 7, "boot_id": "b"}


def test_a_live_peer_s_sighting_is_dated_by_the_controller_s_clock() -> None:
    found = sightings([Report("spark-1", peers(spark_3=ok(1.5)))], NODES, 100.0, FREEZE_AFTER)
    assert found == {"spark-3": Sighting(98.0, "spark-1", "http://10.20.0.3:9101")}
    assert found["spark-3"].describe(100.0) == (
        "spark-1 saw its agent advance 2.0s ago via http://10.20.0.3:9101"
    )


def test_the_freshest_sighting_wins() -> None:
    reports = [
        Report("spark-1", peers(spark_3=ok(4.0))),
        Report("spark-2", peers(spark_3=ok(0.5, "http://10.20.1.3:9101"))),
    ]
    found = sightings(reports, NODES, 100.0, FREEZE_AFTER)
    assert found["spark-3"].reporter == "spark-2" and found["spark-3"].at == 99.0


@pytest.mark.parametrize(
    "reporter",
    [
        Report("spark-1", peers(spark_3=ok(1.0)), agent_progress_at=91.0),  # itself silent
        Report("spark-1", peers(spark_3=ok(1.0)), agent_progress_at=None),
        Report("spark-1", peers(spark_3=ok(1.0)), snapshot_at=90.0),  # an old report
        Report("spark-1", None),
    ],
)
def test_a_peer_the_controller_does_not_read_as_alive_is_not_believed(reporter: Report) -> None:
    assert sightings([reporter], NODES, 100.0, FREEZE_AFTER) == {}


@pytest.mark.parametrize(
    "report",
    [
        {"state": "silent", "progress_ago_s": None},
        {"state": "garbage", "progress_ago_s": None},
        {"state": "ok", "progress_ago_s": -1.0},
        {"state": "ok", "progress_ago_s": float("nan")},
        {"state": "ok", "progress_ago_s": float("inf")},
        {"state": "ok", "progress_ago_s": True},
        {"state": "ok", "progress_ago_s": "1.0"},
        {"state": "ok", "progress_ago_s": 10**400},
        {"state": "ok"},
        "ok",
        None,
    ],
)
def test_a_report_that_says_anything_else_is_no_evidence(report: Any) -> None:
    reporter = Report("spark-1", {"peers": {"spark-3": report}})
    assert sightings([reporter], NODES, 100.0, FREEZE_AFTER) == {}


def test_a_report_on_itself_or_an_unknown_node_or_not_a_mapping_is_ignored() -> None:
    reporters = [
        Report("spark-1", peers(spark_1=ok(0.1), spark_9=ok(0.1))),
        Report("spark-2", {"peers": ["spark-3"]}),
    ]
    assert sightings(reporters, NODES, 100.0, FREEZE_AFTER) == {}


def test_an_advance_seen_before_the_path_went_quiet_is_still_life_then() -> None:
    """A pulse that went unanswered since does not undo the advance before it."""
    report = {"state": "silent", "progress_ago_s": 2.0, "via": "http://10.20.0.3:9101"}
    found = sightings([Report("spark-1", {"peers": {"spark-3": report}})], NODES, 100.0, 8.0)
    assert found["spark-3"].at == 97.5


def head(progress_ago: Any, **changes: Any) -> Report:
    snapshot = {"probes": {"vllm": {"state": "progressing", "progress_ago_s": progress_ago}}}
    return Report("spark-1", snapshot, **changes)


def test_the_head_s_engine_steps_are_life_for_every_rank_of_its_group() -> None:
    found = group_sightings(head(0.5), NODES, 100.0, FREEZE_AFTER)
    assert set(found) == {"spark-2", "spark-3", "spark-4"}  # not the head itself
    assert found["spark-3"].at == 99.0
    assert found["spark-3"].describe(100.0) == (
        "the head spark-1's engine stepped 1.0s ago, and every step needs this node's rank"
    )
    assert group_sightings(head(0.5), ["spark-1", "spark-2"], 100.0, FREEZE_AFTER).keys() == {
        "spark-2"
    }


@pytest.mark.parametrize(
    "reported",
    [
        head(None),  # idle, or never seen stepping
        head(-1.0),
        head(float("nan")),
        head("0.5"),
        head(0.5, agent_progress_at=90.0),  # the head itself silent to the controller
        Report("spark-1", {"probes": {"vllm": "progressing"}}),
        Report("spark-1", {"probes": None}),
    ],
)
def test_a_head_report_that_says_anything_else_is_no_evidence(reported: Report) -> None:
    assert group_sightings(reported, NODES, 100.0, FREEZE_AFTER) == {}
