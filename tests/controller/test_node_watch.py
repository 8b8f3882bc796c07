"""What one poll or banner check does to a node's record: life, progress, going down."""

from __future__ import annotations

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.http_client import ANSWERED, NO_NETWORK, SILENCE
from spark_watchdog.controller.node_watch import NodeWatch


def watch() -> NodeWatch:
    return NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)


def snapshot(seq: int, boot: str = "b1", stopping: object = None) -> dict[str, object]:
    return {"seq": seq, "boot_id": boot, "started_at": "t0", "stopping": stopping}


def test_progress_and_life_are_apart() -> None:
    w = watch()
    assert w.note_answer(snapshot(1), 1.0, 1001.0)
    assert not w.note_answer(snapshot(1), 5.0, 1005.0)  # stuck seq: life, no progress
    assert w.agent_progress_at == 1.0 and w.agent_answer_at == 5.0
    assert w.last_life_at == 5.0
    assert w.note_answer(snapshot(0, boot="b2"), 9.0, 1009.0)  # a new boot counts from 0


def test_an_answer_that_is_not_a_snapshot_is_life_but_silence_is_not() -> None:
    w = watch()
    w.note_answer_error(ANSWERED, "/v1/state answered 500", 3.0)
    assert w.agent_answer_at == 3.0
    w.note_answer_error(SILENCE, "no answer", 4.0)
    assert w.agent_answer_at == 3.0
    w.note_answer_error(NO_NETWORK, "network is down", 5.0)
    assert w.agent_blind == "network is down"


def test_a_refusal_after_the_agent_went_quiet_means_going_down() -> None:
    w = watch()
    w.note_answer(snapshot(1), 1.0, 1001.0)
    w.note_banner("refused", "refused", 1.5)  # the agent is fresh: a poller turned away
    assert w.going_down_at is None
    assert w.ssh_alive_at == 1.5
    w.note_banner("no_banner", "no_banner", 4.0)
    assert w.banner_misses == 1 and w.banner_reachable
    w.note_banner("refused", "refused", 6.0)  # quiet for 5 s: sshd stopped, a reboot
    assert w.going_down_at == 6.0 and w.banner_misses == 0
    w.note_answer(snapshot(0, boot="b2"), 40.0, 1040.0)
    assert w.going_down_at is None


def test_the_agent_saying_the_system_stops_means_going_down() -> None:
    w = watch()
    w.note_answer(snapshot(1, stopping={"since": 1.0, "system": True}), 1.0, 1001.0)
    assert w.going_down_at == 1.0
    w.note_answer(snapshot(2, stopping={"since": 1.0, "system": True}), 2.0, 1002.0)
    assert w.going_down_at == 1.0
    restarted_only = watch()
    restarted_only.note_answer(snapshot(1, stopping={"since": 1.0, "system": False}), 1.0, 1.0)
    assert restarted_only.going_down_at is None


def test_a_name_that_does_not_resolve_is_neither_a_miss_nor_life() -> None:
    w = watch()
    w.note_banner("unresolvable", "cannot resolve", 3.0)
    assert w.banner_misses == 0 and w.ssh_alive_at is None
    assert w.banner_blind == "cannot resolve"
    w.note_banner("connect_timeout", "timeout", 5.0)
    assert w.banner_misses == 1 and w.banner_blind is None and not w.banner_reachable
