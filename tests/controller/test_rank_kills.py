"""The live GPU faults a host_frozen incident keeps (controller/look/rank_kills.py)."""

from __future__ import annotations

from spark_watchdog.controller.look.rank_kills import LIVE_FAULTS_KEPT, live_faults

AT = 1_800_000_000.0  # 2027-01-15 08:00:00 UTC


def test_a_live_fault_is_said_with_how_long_before_the_silence_it_came() -> None:
    fault = {"id": 1, "xid": 31, "at_unix": AT + 7.4, "gpu": 0, "result": "stopped"}
    (kept,) = live_faults({"gpu_faults": {"faults": [fault]}}, AT + 9.7)
    assert kept["said"] == (
        "Xid 31 (GPU memory page fault (MMU fault)) on GPU 0 at 08:00:07.4 UTC, "
        "2.3 s before its agent went silent"
    )
    assert kept["xid"] == 31 and kept["id"] == 1
    (unknown,) = live_faults({"gpu_faults": {"faults": [{**fault, "xid": 79}]}}, None)
    assert unknown["said"] == "Xid 79 on GPU 0 at 08:00:07.4 UTC"


def test_malformed_faults_are_left_out_and_the_newest_kept() -> None:
    good = {"id": 1, "xid": 13, "at_unix": AT}
    bad = [{"xid": True, "at_unix": AT}, {"xid": 31, "at_unix": "now"}, {"xid": 31}, "Xid 31"]
    assert live_faults({"gpu_faults": {"faults": [*bad, good]}}, None)[0]["id"] == 1
    many = [{**good, "id": i} for i in range(1, 30)]
    kept = live_faults({"gpu_faults": {"faults": many}}, None)
    assert [k["id"] for k in kept] == list(range(30 - LIVE_FAULTS_KEPT, 30))
    assert live_faults(None, None) == [] and live_faults({"gpu_faults": "x"}, None) == []
