"""What one poll or banner check does to a node's record: life, progress, going down."""

from __future__ import annotations

import pytest

from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.look.http_client import ANSWERED, NO_NETWORK, SILENCE
from spark_watchdog.controller.look.node_watch import NodeWatch


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


def _guarded(seq: int, kill: object, started: str = "t0") -> dict[str, object]:
    return {**snapshot(seq), "started_at": started, "memory_guard": {"last_kill": kill}}


def test_a_memory_guard_kill_is_pending_until_answered_once() -> None:
    w = watch()
    w.note_answer(_guarded(1, None), 1.0, 1000.0)
    assert w.guard_kill is None
    kill = {"id": 1, "at_unix": 1001.0, "result": "killed"}
    w.note_answer(_guarded(2, kill), 2.0, 1002.0)
    assert w.guard_kill is not None and w.guard_kill["agent_started_at"] == "t0"
    assert w.observation(2.0, True, True).guard_kill == w.guard_kill
    w.answer_guard_kill()
    w.note_answer(_guarded(3, kill), 3.0, 1003.0)
    assert w.guard_kill is None  # the same kill, answered
    w.note_answer(_guarded(4, {**kill, "id": 2, "at_unix": 1003.5}), 4.0, 1004.0)
    assert w.guard_kill is not None and w.guard_kill["id"] == 2  # the next kill is news
    w.answer_guard_kill()
    # A restarted agent counts from 1 again: a new kill, not the old one.
    w.note_answer(_guarded(1, {**kill, "at_unix": 1005.0}, started="t1"), 5.0, 1005.0)
    assert w.guard_kill is not None and w.guard_kill["agent_started_at"] == "t1"


def test_an_old_or_malformed_memory_guard_kill_is_not_news() -> None:
    w = watch()
    w.note_answer(_guarded(1, {"id": 1, "at_unix": 100.0}), 1.0, 1000.0)
    assert w.guard_kill is None  # 900 s old when first seen
    bad: object
    for bad in ({"id": True, "at_unix": 999.0}, {"id": 1, "at_unix": "now"}, {"id": "1"}, []):
        w.note_answer(_guarded(2, bad), 2.0, 1000.0)
        assert w.guard_kill is None, bad
    w.note_answer({**snapshot(3), "memory_guard": "broken"}, 3.0, 1000.0)
    assert w.guard_kill is None


def _gpu(seq: int, state: str, started: str = "t0", boot: str = "b1") -> dict[str, object]:
    return {**snapshot(seq, boot=boot), "started_at": started, "probes": {"gpu": {"state": state}}}


def test_gpu_timeouts_are_timed_from_the_first_and_reset_by_an_answer_or_a_new_agent() -> None:
    w = watch()
    w.note_answer(_gpu(1, "ok"), 1.0, 1001.0)
    assert w.observation(1.0, True, True).gpu_timeout_for is None
    w.note_answer(_gpu(2, "timeout"), 2.0, 1002.0)
    w.note_answer(_gpu(3, "timeout"), 9.0, 1009.0)
    assert w.observation(12.0, True, True).gpu_timeout_for == 10.0
    w.note_answer(_gpu(4, "ok"), 13.0, 1013.0)
    assert w.gpu_timeout_since is None
    w.note_answer(_gpu(5, "timeout"), 14.0, 1014.0)
    w.note_answer(_gpu(0, "timeout", boot="b2"), 20.0, 1020.0)  # a new boot starts over
    assert w.gpu_timeout_since == 20.0


def test_an_expected_reboot_is_not_cleared_by_answers_only_by_a_new_boot() -> None:
    w = watch()
    w.note_answer(snapshot(1), 1.0, 1001.0)
    w.going_down_at, w.going_down_why, w.reboot_expected = 2.0, "a forced reboot was sent", True
    w.note_answer(snapshot(2), 3.0, 1003.0)  # the agent before the host drops
    assert w.going_down_at == 2.0 and w.reboot_expected
    w.note_answer(snapshot(0, boot="b2"), 20.0, 1020.0)
    assert w.going_down_at is None and not w.reboot_expected


def test_a_new_boot_is_a_boot_id_seen_and_not_the_one_before() -> None:
    w = watch()
    assert not w.booted_since(None)  # nothing seen yet is no new boot
    assert not w.booted_since("b0")
    w.note_answer(snapshot(1, boot="b1"), 1.0, 1001.0)
    assert w.booted_since("b0") and w.booted_since(None)
    assert not w.booted_since("b1")


def test_an_agent_answer_to_a_serving_request_is_a_sign_of_life() -> None:
    """controller/serving_restart.heard_through: every node whose agent answers
    a request (any status) is told; one that does not answer is not."""
    import asyncio

    from spark_watchdog.controller.look.http_client import HttpAnswer, HttpError
    from spark_watchdog.controller.serving.serving_restart import ServingNode, heard_through

    nodes = [ServingNode("spark-1", "http://a:9720"), ServingNode("spark-2", "http://b:9720/")]

    async def http(url: str, **_: object) -> HttpAnswer:
        if url.startswith("http://b:9720"):
            raise HttpError("no answer")
        return HttpAnswer(500, b"")

    heard: list[str] = []
    ask = heard_through(http, nodes, heard.append)

    async def both() -> None:
        answer = await ask("http://a:9720/v1/serving/stop", method="POST", timeout=1.0)
        assert answer.status == 500  # an error status is an answer all the same
        with pytest.raises(HttpError):  # no answer: not heard
            await ask("http://b:9720/v1/serving", timeout=1.0)

    asyncio.run(both())
    assert heard == ["spark-1"]


def _faulted(seq: int, *faults: object, started: str = "t0") -> dict[str, object]:
    return {**snapshot(seq), "started_at": started, "gpu_faults": {"faults": list(faults)}}


def test_a_gpu_fault_that_ended_the_rank_is_pending_until_answered_once() -> None:
    w = watch()
    fault = {"id": 1, "xid": 31, "at_unix": 1001.0, "gpu": 0, "result": "stopped"}
    w.note_answer(_faulted(1, fault), 1.0, 1002.0)
    assert w.gpu_fault is not None and w.gpu_fault["xid"] == 31
    assert w.kills_of(Verdict.GPU_FAULT) is w.gpu_kills
    assert w.observation(1.0, True, True).gpu_fault == w.gpu_fault
    w.gpu_kills.answer()
    w.note_answer(_faulted(2, fault), 2.0, 1003.0)
    assert w.gpu_fault is None  # the same fault, answered
    later = {**fault, "id": 2, "at_unix": 1003.5, "result": "stop_failed"}
    w.note_answer(_faulted(3, fault, later), 3.0, 1004.0)
    assert w.gpu_fault is not None and w.gpu_fault["id"] == 2  # the rank is gone either way


def test_a_gpu_fault_the_table_does_not_name_or_a_malformed_one_is_evidence_only() -> None:
    w = watch()
    base = {"id": 1, "at_unix": 1001.0, "gpu": 0, "result": "stopped"}
    for fault in (
        {**base, "xid": 79},  # not in the table: never acted on
        {**base, "xid": True},
        {**base, "xid": "31"},
        {**base, "xid": 31, "result": "evidence"},  # the rank was not stopped
        {**base, "xid": 31, "at_unix": float("nan")},
        {**base, "xid": 31, "at_unix": 100.0},  # 900 s old when first seen
        "Xid 31",
    ):
        w.note_answer(_faulted(1, fault), 1.0, 1002.0)
        assert w.gpu_fault is None, fault
    w.note_answer({**snapshot(2), "gpu_faults": ["broken"]}, 2.0, 1002.0)
    w.note_answer({**snapshot(3), "gpu_faults": {"faults": "broken"}}, 3.0, 1002.0)
    assert w.gpu_fault is None
