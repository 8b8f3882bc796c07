"""A rank that died, seen from its launcher: the serving_dead verdict without
waiting for the vLLM probe's dead_after, and the incident's onset at the first
sign of the death, bounded by the controller's own clock
(docs/design.md, "Verdicts")."""

from __future__ import annotations

import os
import signal
import sys
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import pytest

from spark_watchdog.agent.serving import ServingLauncher
from spark_watchdog.config.agent import parse_agent_config
from spark_watchdog.config.controller import NodeConfig
from spark_watchdog.controller.decide.detector import (
    DEATH_AHEAD_S,
    DetectionPolicy,
    NodeObservation,
    Verdict,
    classify,
    serving_died_at,
)
from spark_watchdog.controller.look.node_watch import NodeWatch

POLICY = DetectionPolicy()
WALL = 1_700_000_100.0


def iso(unix: float) -> str:
    return datetime.fromtimestamp(unix, timezone.utc).isoformat(timespec="milliseconds")


def serving(state: str = "exited", **changes: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "enabled": True,
        "state": state,
        "stopping": False,
        "exit_code": None,
        "exit_signal": "SIGKILL",
        "group_alive": False,
        "ended_at": iso(WALL - 3.0),
    }
    base.update(changes)
    return base


def snapshot(vllm_state: str = "unreachable", **serving_changes: Any) -> dict[str, Any]:
    state = serving_changes.pop("state", "exited")
    return {
        "seq": 5,
        "probes": {"vllm": {"state": vllm_state, "dead_since": None}},
        "serving": serving(state, **serving_changes),
    }


def verdict(snap: dict[str, Any], judges_serving: bool = True) -> Verdict:
    observation = NodeObservation(
        now=100.0,
        watch_started_at=0.0,
        agent_progress_at=99.5,
        snapshot=snap,
        banner_misses=0,
        witness_ok=True,
        judges_serving=judges_serving,
    )
    return classify(observation, POLICY).verdict


def test_a_rank_its_launcher_saw_end_is_dead_before_the_probe_says_so() -> None:
    # The probe still reads the refusal as unreachable (dead_after not over):
    # before, the verdict was healthy until it did, 8 s after a docker kill.
    finding = classify(NodeObservation(100.0, 0.0, 99.5, snapshot(), 0, True), POLICY)
    assert finding.verdict is Verdict.SERVING_DEAD
    assert finding.reasons == (
        "the rank exited on SIGKILL (its launcher saw it end; nothing restarted it)",
    )
    assert verdict(snapshot(exit_signal=None, exit_code=0)) is Verdict.SERVING_DEAD


@pytest.mark.parametrize(
    "snap",
    [
        snapshot(state="stopped"),  # stopped on purpose: an operator, a restart
        snapshot(state="running"),
        snapshot(stopping=True),  # a stop under way decides
        snapshot(enabled=False),
        snapshot(vllm_state="progressing", group_alive=True),  # a wrapper's group serves
        {"seq": 5, "probes": {"vllm": {"state": "idle"}}, "serving": "exited"},
    ],
    ids=["stopped", "running", "stopping", "disabled", "group-serves", "not-an-object"],
)
def test_only_a_rank_that_ended_on_its_own_is_dead_at_once(snap: dict[str, Any]) -> None:
    assert verdict(snap) is not Verdict.SERVING_DEAD


def _answering(read_at: float) -> dict[str, Any]:
    snap = snapshot(vllm_state="progressing")  # group_alive False: the launch detached
    snap["probes"]["vllm"]["observed_at"] = iso(read_at)
    return snap


def test_vllm_answering_since_the_rank_ended_is_no_death() -> None:
    """A launch command that detaches (docker run -d, setsid): the process the
    agent started exits at once and nothing of its group is left, but vLLM
    serves. Before, every heartbeat read serving_dead and restarted it."""
    assert verdict(_answering(WALL - 1.0)) is not Verdict.SERVING_DEAD  # read after the end
    assert verdict(_answering(WALL - 5.0)) is Verdict.SERVING_DEAD  # read before it: stale


def test_a_leader_gone_with_its_group_alive_is_dead_once_vllm_stops_answering() -> None:
    # vllm #55510: the API server killed, the engine holding the GPU.
    assert verdict(snapshot(vllm_state="unreachable", group_alive=True)) is Verdict.SERVING_DEAD


def test_a_worker_rank_is_still_judged_by_the_head() -> None:
    assert verdict(snapshot(), judges_serving=False) is Verdict.HEALTHY


def test_a_forged_exit_signal_is_not_repeated() -> None:
    finding = classify(
        NodeObservation(
            100.0,
            0.0,
            99.5,
            snapshot(exit_signal="\x1b[2Jspark-2 healthy", exit_code=10**30),
            0,
            True,
        ),
        POLICY,
    )
    assert finding.reasons == ("the rank exited (its launcher saw it end; nothing restarted it)",)


# --- the onset ---------------------------------------------------------------------


def _watch(snap: dict[str, Any]) -> NodeWatch:
    watch = NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)
    watch.note_answer(snap, 1.0, WALL - 0.5)
    return watch


def test_the_onset_is_the_launchers_time_of_death() -> None:
    # Before: the agent's last progress (WALL - 0.5), a time to detect of 0.5 s
    # for a rank dead for 3 s.
    assert _watch(snapshot()).serving_fault_onset(WALL) == pytest.approx(WALL - 3.0, abs=1e-3)


def test_without_a_launcher_the_onset_is_the_probes_first_sign() -> None:
    snap = snapshot(vllm_state="dead", state="running")
    snap["probes"]["vllm"]["dead_since"] = iso(WALL - 6.0)
    assert _watch(snap).serving_fault_onset(WALL) == pytest.approx(WALL - 6.0, abs=1e-3)


@pytest.mark.parametrize(
    "ended",
    [
        iso(WALL + DEATH_AHEAD_S + 1),  # ahead of the controller's clock
        iso(WALL - 86400.0),  # a day old: not this death
        "1970-01-01T00:00:00.000+00:00",
        "2023-11-14T22:15:00",  # no zone
        "9999-99-99",
        "x" * 100_000,
        12345,
        None,
    ],
    ids=["ahead", "a-day-old", "epoch", "naive", "garbage", "huge", "number", "null"],
)
def test_a_time_of_death_out_of_bounds_falls_back_to_the_agents_progress(ended: Any) -> None:
    assert _watch(snapshot(ended_at=ended)).serving_fault_onset(WALL) == WALL - 0.5


def test_a_time_of_death_a_little_ahead_is_taken_as_now() -> None:
    # Clocks disagree a little; the time to detect is never negative.
    assert serving_died_at(snapshot(ended_at=iso(WALL + 2.0)), WALL) == WALL


def test_docker_finished_at_is_read_to_the_microsecond() -> None:
    pytest.importorskip("docker")  # the docker extra
    from spark_watchdog.agent.rank_container import finished_at

    assert finished_at({"FinishedAt": "2023-11-14T22:15:00.123456789Z"}) == pytest.approx(
        1_700_000_100.123456, abs=1e-6
    )
    for never in ("0001-01-01T00:00:00Z", "yesterday", None, "9" * 100):
        assert finished_at({"FinishedAt": never}) is None


# --- a real rank ---------------------------------------------------------------------


@pytest.mark.integration
def test_a_killed_rank_is_serving_dead_at_the_next_look_dated_at_its_end(tmp_path: Path) -> None:
    """The process runtime: the rank SIGKILLed, the launcher's very next status
    gives the verdict and the time of death, with the vLLM probe still short of
    dead_after (virtual time for the controller, the real launcher and rank)."""
    section = {
        "enabled": True,
        "command": [sys.executable, "-c", "import time; time.sleep(600)"],
        "token_file": str(tmp_path / "token"),
        "log_file": str(tmp_path / "serving.log"),
        "stack_dump": False,
    }
    launcher = ServingLauncher(parse_agent_config({"node": "n1", "serving": section}).serving)
    try:
        pid = launcher.start("plain")["pid"]
        killed = time.time()
        os.kill(pid, signal.SIGKILL)
        status = launcher.status()
        deadline = time.monotonic() + 30.0  # generous: a loaded machine reaps late
        while status["state"] != "exited" and time.monotonic() < deadline:
            time.sleep(0.05)
            status = launcher.status()
        seen = time.time()
        snap = {"seq": 7, "probes": {"vllm": {"state": "unreachable"}}, "serving": status}
        watch = NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)
        watch.note_answer(snap, 50.0, seen)
        assert verdict(snap) is Verdict.SERVING_DEAD
        onset = watch.serving_fault_onset(seen + 1.0)
        assert onset is not None and killed <= onset <= seen
        assert status["exit_signal"] == "SIGKILL" and status["group_alive"] is False
    finally:
        launcher.stop()
