"""The pure progress judgement, driven by hand-made scrapes and a fake clock."""

from __future__ import annotations

import json

import pytest

from spark_watchdog.probes.vllm import CanaryResult, VllmSample
from spark_watchdog.probes.vllm_metrics import EngineSample
from spark_watchdog.probes.vllm_progress import ProgressTracker

URL = "http://head:8000"
STALL_AFTER = 10.0
CONTRACT_KEYS = {
    "url",
    "state",
    "health_status",
    "running",
    "waiting",
    "engine_steps",
    "generation_tokens",
    "seconds_without_progress",
}


def engine(
    steps: int | None,
    tokens: int | None = None,
    running: int | None = 3,
    name: str = "0",
    waiting: int | None = None,
) -> EngineSample:
    """One engine's reading; ``waiting`` defaults to 1 while requests run, else 0."""
    return EngineSample(
        engine=name,
        running=running,
        waiting=(1 if running else 0) if waiting is None else waiting,
        engine_steps=steps,
        generation_tokens=steps * 4 if tokens is None and steps is not None else tokens,
        prompt_tokens=None,
        kv_cache_usage=0.3,
        models=("m",),
    )


def scrape(*engines: EngineSample, health: int | None = 200, at: float = 0.0) -> VllmSample:
    return VllmSample(
        url=URL,
        observed_at=at,
        wall_time=1_700_000_000.0 + at,
        health_status=health,
        engines={e.engine: e for e in engines},
        reachable=True,
        error=None,
        models=("m",),
    )


def unreachable(error: str = "GET /health: connection refused by head:8000") -> VllmSample:
    return VllmSample(
        url=URL,
        observed_at=0.0,
        wall_time=0.0,
        health_status=None,
        engines={},
        reachable=False,
        error=error,
    )


def canary(outcome: str, at: float) -> CanaryResult:
    error = None if outcome == "ok" else "no complete answer within 10.0 s"
    return CanaryResult(outcome, 0.2 if outcome == "ok" else 10.0, at, "m", error)  # type: ignore[arg-type]


@pytest.fixture
def tracker() -> ProgressTracker:
    return ProgressTracker(STALL_AFTER)


def test_advancing_counters_are_progress(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    status = tracker.update(scrape(engine(160)), now=2.0)

    assert status.state == "progressing"
    assert status.running == 3
    assert status.engine_steps == 160
    assert status.generation_tokens == 640
    assert status.seconds_without_progress == 0.0
    assert "advancing" in status.reason


def test_no_requests_running_is_idle(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, running=0)), now=0.0)
    status = tracker.update(scrape(engine(100, running=0)), now=60.0)

    assert status.state == "idle"
    assert status.seconds_without_progress is None


def test_stalled_exactly_at_stall_after(tracker: ProgressTracker) -> None:
    frozen = engine(100)
    assert tracker.update(scrape(frozen), now=0.0).state == "progressing"
    almost = tracker.update(scrape(frozen), now=9.99)
    assert almost.state == "progressing"
    assert almost.seconds_without_progress == pytest.approx(9.99)

    status = tracker.update(scrape(frozen), now=10.0)

    assert status.state == "stalled"
    assert status.seconds_without_progress == 10.0
    assert "no engine step or generated token for 10.0 s" in status.reason


def test_steps_alone_or_tokens_alone_are_progress(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, tokens=500)), now=0.0)
    # Chunked prefill: the engine steps, no token comes out.
    assert tracker.update(scrape(engine(101, tokens=500)), now=8.0).state == "progressing"
    # And a token without a step (the other series) counts as well.
    assert tracker.update(scrape(engine(101, tokens=501)), now=16.0).state == "progressing"
    assert tracker.update(scrape(engine(101, tokens=501)), now=25.0).state == "progressing"
    assert tracker.update(scrape(engine(101, tokens=501)), now=26.0).state == "stalled"


def test_counter_reset_is_a_new_baseline_not_a_stall(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(50_000)), now=0.0)
    tracker.update(scrape(engine(50_000)), now=8.0)
    # vLLM restarted between scrapes: its counters start again from near zero.
    restarted = tracker.update(scrape(engine(12)), now=9.0)
    assert restarted.state == "progressing"
    assert restarted.seconds_without_progress == 0.0

    assert tracker.update(scrape(engine(12)), now=18.9).state == "progressing"
    assert tracker.update(scrape(engine(12)), now=19.0).state == "stalled"


def test_clock_starts_when_requests_start(tracker: ProgressTracker) -> None:
    # A long idle spell with frozen counters, then requests arrive.
    tracker.update(scrape(engine(100, running=0)), now=0.0)
    tracker.update(scrape(engine(100, running=0)), now=100.0)
    started = tracker.update(scrape(engine(100, running=2)), now=101.0)
    assert started.state == "progressing"
    assert started.seconds_without_progress == 0.0

    assert tracker.update(scrape(engine(100, running=2)), now=110.5).state == "progressing"
    assert tracker.update(scrape(engine(100, running=2)), now=111.0).state == "stalled"


def test_unreachable_then_recovery_gives_no_false_stall(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    assert tracker.update(unreachable(), now=4.0).state == "unreachable"
    assert tracker.update(unreachable(), now=20.0).state == "unreachable"

    # Same counters, requests running: we were blind for 30 s, so the clock
    # restarts here instead of reporting a 30 s stall nobody saw.
    back = tracker.update(scrape(engine(100)), now=30.0)
    assert back.state == "progressing"
    assert back.seconds_without_progress == 0.0
    assert "blind" in back.reason

    assert tracker.update(scrape(engine(100)), now=39.0).state == "progressing"
    assert tracker.update(scrape(engine(100)), now=40.0).state == "stalled"


def test_a_gap_between_updates_is_blindness_too(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    # Nobody called for 50 s (agent starved or suspended).
    assert tracker.update(scrape(engine(100)), now=50.0).state == "progressing"
    assert tracker.update(scrape(engine(100)), now=60.0).state == "stalled"


def test_unreachable_reports_the_scrape_error(tracker: ProgressTracker) -> None:
    status = tracker.update(unreachable("GET /metrics: no complete answer within 2.0 s"), now=1.0)

    assert status.state == "unreachable"
    assert status.reason == "GET /metrics: no complete answer within 2.0 s"
    assert status.error == status.reason
    assert status.running is None


def test_missing_running_gauge_never_stalls(tracker: ProgressTracker) -> None:
    frozen = engine(100, running=None)
    tracker.update(scrape(frozen), now=0.0)
    status = tracker.update(scrape(frozen), now=300.0)

    assert status.state == "idle"
    assert "vllm:num_requests_running is missing" in status.reason
    assert status.engines["0"].judged is False
    assert tracker.update(scrape(engine(101, running=None)), now=301.0).state == "progressing"


def test_missing_progress_counters_never_stall(tracker: ProgressTracker) -> None:
    blank = engine(None, tokens=None, running=4)
    tracker.update(scrape(blank), now=0.0)
    status = tracker.update(scrape(blank), now=300.0)

    assert status.state == "progressing"
    assert status.engines["0"].judged is False
    assert "cannot be judged" in status.reason


def test_one_stalled_engine_stalls_the_cluster(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, name="0"), engine(500, name="1")), now=0.0)
    tracker.update(scrape(engine(250, name="0"), engine(500, name="1")), now=6.0)
    status = tracker.update(scrape(engine(400, name="0"), engine(500, name="1")), now=12.0)

    assert status.state == "stalled"
    assert status.engines["0"].state == "progressing"
    assert status.engines["1"].state == "stalled"
    assert status.reason.startswith("engine 1:")
    assert status.running == 6
    assert status.waiting == 2
    assert status.engine_steps == 900
    assert status.seconds_without_progress == 12.0


def test_one_busy_engine_and_one_idle_is_progressing(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, name="0"), engine(5, running=0, name="1")), now=0.0)
    status = tracker.update(scrape(engine(130, name="0"), engine(5, running=0, name="1")), now=5.0)

    assert status.state == "progressing"
    assert status.engines["1"].state == "idle"


def test_engine_that_disappears_is_forgotten(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, name="0"), engine(100, name="1")), now=0.0)
    status = tracker.update(scrape(engine(150, name="0")), now=5.0)

    assert list(status.engines) == ["0"]


def test_health_503_is_dead(tracker: ProgressTracker) -> None:
    status = tracker.update(scrape(engine(100), health=503), now=0.0)

    assert status.state == "dead"
    assert "503" in status.reason
    assert status.health_status == 503


def test_dead_then_restarted_starts_fresh(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    tracker.update(scrape(engine(100), health=503), now=5.0)
    status = tracker.update(scrape(engine(3)), now=40.0)

    assert status.state == "progressing"
    assert status.seconds_without_progress == 0.0


def test_rank_process_gone_is_dead_even_if_http_answers(tracker: ProgressTracker) -> None:
    status = tracker.update(scrape(engine(100)), now=0.0, process_alive=False)

    assert status.state == "dead"
    assert status.process_alive is False
    assert "process" in status.reason


def test_headless_rank_alive(tracker: ProgressTracker) -> None:
    status = tracker.update(None, now=0.0, process_alive=True)

    assert status.state == "headless"
    assert status.url is None


def test_headless_rank_gone_is_dead(tracker: ProgressTracker) -> None:
    assert tracker.update(None, now=0.0, process_alive=False).state == "dead"


def test_nothing_to_observe_is_unreachable(tracker: ProgressTracker) -> None:
    assert tracker.update(None, now=0.0).state == "unreachable"


def test_unexpected_health_status_is_not_usable(tracker: ProgressTracker) -> None:
    status = tracker.update(scrape(engine(100), health=500), now=0.0)

    assert status.state == "unreachable"
    assert "/health answered 500" in status.reason


def test_answer_without_engines_is_not_usable(tracker: ProgressTracker) -> None:
    assert tracker.update(scrape(), now=0.0).state == "unreachable"


def test_stall_is_suspected_at_half_of_stall_after(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    tracker.update(scrape(engine(100)), now=4.9)
    early = tracker.stall_suspected

    status = tracker.update(scrape(engine(100)), now=5.0)

    assert not early
    assert tracker.stall_suspected
    assert status.stall_suspected
    assert status.state == "progressing"


def test_answered_canary_restarts_the_stall_clock(tracker: ProgressTracker) -> None:
    frozen = engine(100)
    tracker.update(scrape(frozen), now=0.0)
    tracker.update(scrape(frozen), now=6.0)
    tracker.note_canary(canary("ok", at=7.0), now=7.0)

    status = tracker.update(scrape(frozen), now=11.0)
    assert status.state == "progressing"
    assert status.seconds_without_progress == 4.0
    assert status.canary is not None and status.canary.ok
    assert not tracker.stall_suspected

    assert tracker.update(scrape(frozen), now=17.0).state == "stalled"


def test_failed_canary_is_reported_and_proves_nothing(tracker: ProgressTracker) -> None:
    frozen = engine(100)
    tracker.update(scrape(frozen), now=0.0)
    tracker.note_canary(canary("timeout", at=6.0), now=6.0)

    status = tracker.update(scrape(frozen), now=10.0)

    assert status.state == "stalled"
    assert status.canary is not None and status.canary.outcome == "timeout"
    assert "last canary: no answer within 10.0 s" in status.reason


def test_canary_with_several_engines_moves_no_clock(tracker: ProgressTracker) -> None:
    both_frozen = scrape(engine(100, name="0"), engine(100, name="1"))
    tracker.update(both_frozen, now=0.0)
    tracker.note_canary(canary("ok", at=8.0), now=8.0)

    assert tracker.update(both_frozen, now=10.0).state == "stalled"


def test_json_has_the_cli_contract_keys(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, name="0"), engine(7, name="1")), now=0.0)
    tracker.note_canary(canary("ok", at=1.0), now=1.0)
    report = tracker.update(scrape(engine(101, name="0"), engine(7, name="1")), now=2.0).to_json()

    assert set(report) >= CONTRACT_KEYS
    assert report["engines"]["1"]["engine_steps"] == 7
    assert report["canary"]["outcome"] == "ok"
    json.dumps(report)  # serialisable as is


def test_json_of_a_blind_status_keeps_the_keys(tracker: ProgressTracker) -> None:
    report = tracker.update(unreachable(), now=0.0).to_json()

    assert set(report) >= CONTRACT_KEYS
    assert report["state"] == "unreachable"


def test_stall_after_must_be_positive() -> None:
    with pytest.raises(ValueError, match="stall_after"):
        ProgressTracker(0)


# --- death by refusal: real vLLM's API server exits 0 when its engine dies ---------


def refused(at: float = 0.0) -> VllmSample:
    return VllmSample(
        url=URL,
        observed_at=at,
        wall_time=1_700_000_000.0 + at,
        health_status=None,
        engines={},
        reachable=False,
        error="GET /health: connection refused by head:8000 (nothing listening there)",
        refused=True,
    )


def timed_out() -> VllmSample:
    return unreachable("GET /health: no complete answer from http://head:8000/health within 2.0 s")


DEAD_REASON = (
    "vLLM answered until 2023-11-14T22:13:20Z and now refuses connections on port 8000 "
    "(for {:.1f} s, dead_after 4 s): its API server is gone"
)


@pytest.fixture
def guarded() -> ProgressTracker:
    return ProgressTracker(STALL_AFTER, dead_after=4.0)


def test_refusal_after_answers_is_dead_after_the_grace(guarded: ProgressTracker) -> None:
    assert guarded.update(scrape(engine(100, running=0)), now=0.0).state == "idle"
    first = guarded.update(refused(2.0), now=2.0)
    almost = guarded.update(refused(5.9), now=5.9)

    status = guarded.update(refused(6.0), now=6.0)

    assert first.state == "unreachable" and "connection refused" in first.reason
    assert almost.state == "unreachable"
    assert status.state == "dead"
    assert status.reason == DEAD_REASON.format(4.0)
    assert guarded.update(refused(9.0), now=9.0).reason == DEAD_REASON.format(7.0)


def test_a_head_that_never_answered_stays_unreachable(guarded: ProgressTracker) -> None:
    for now in (0.0, 10.0, 100.0):
        assert guarded.update(refused(now), now=now).state == "unreachable"


def test_a_timeout_is_not_death(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100)), now=0.0)
    for now in (2.0, 10.0, 100.0):
        assert guarded.update(timed_out(), now=now).state == "unreachable"


def test_an_answer_or_a_timeout_restarts_the_grace(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100, running=0)), now=0.0)
    guarded.update(refused(1.0), now=1.0)
    guarded.update(scrape(engine(100, running=0), health=503), now=3.0)  # answered 503
    guarded.update(refused(4.0), now=4.0)
    guarded.update(timed_out(), now=6.0)
    guarded.update(refused(7.0), now=7.0)

    assert guarded.update(refused(10.9), now=10.9).state == "unreachable"
    assert guarded.update(refused(11.0), now=11.0).state == "dead"


def test_a_planned_stop_is_not_a_death(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100, running=0)), now=0.0)
    guarded.note_planned_stop()
    # The rank still answers while it shuts down, then its port goes away.
    guarded.update(scrape(engine(100, running=0)), now=1.0)
    for now in (2.0, 10.0, 60.0):
        assert guarded.update(refused(now), now=now).state == "unreachable"
    # Started again (by the controller, or by hand): it answers, then dies.
    guarded.update(scrape(engine(0, running=0), at=70.0), now=70.0)
    guarded.update(refused(72.0), now=72.0)
    status = guarded.update(refused(76.0), now=76.0)
    assert status.state == "dead"
    assert status.reason.startswith("vLLM answered until 2023-11-14T22:14:30Z and now refuses")


def test_a_planned_start_rearms_at_the_first_answer(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100, running=0)), now=0.0)
    guarded.note_planned_stop()
    guarded.note_planned_start()  # a restart fast enough that no refusal was seen
    # The new rank loads its model with its port closed: not a death.
    for now in (1.0, 10.0, 100.0):
        assert guarded.update(refused(now), now=now).state == "unreachable"
    guarded.update(scrape(engine(0, running=0)), now=101.0)
    guarded.update(refused(102.0), now=102.0)
    assert guarded.update(refused(106.0), now=106.0).state == "dead"


def test_without_dead_after_a_refusal_stays_unreachable(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    assert tracker.update(refused(100.0), now=100.0).state == "unreachable"


def test_dead_after_must_not_be_negative() -> None:
    with pytest.raises(ValueError, match=r"dead_after: expected seconds ≥ 0, got -1"):
        ProgressTracker(1.0, dead_after=-1)


# --- idle hangs ----------------------------------------------------------------------


def test_waiting_requests_with_none_running_stall_too(tracker: ProgressTracker) -> None:
    queued = engine(100, running=0, waiting=2)
    assert tracker.update(scrape(queued), now=0.0).state == "progressing"
    assert tracker.update(scrape(queued), now=9.9).state == "progressing"

    status = tracker.update(scrape(queued), now=10.0)

    assert status.state == "stalled"
    assert status.reason == (
        "engine 0: 2 request(s) waiting and none running and no engine step or generated "
        "token for 10.0 s (stall_after 10 s)"
    )


def test_waiting_requests_with_steps_are_progress(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, running=0, waiting=2)), now=0.0)
    status = tracker.update(scrape(engine(130, running=0, waiting=2)), now=20.0)
    assert status.state == "progressing"
    assert status.reason == "2 request(s) waiting and none running; counters advancing"


def test_quiet_time_counts_from_the_last_request_or_step(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100)), now=0.0)
    assert tracker.quiet_for(0.0) is None  # requests running
    tracker.update(scrape(engine(120, running=0)), now=5.0)
    tracker.update(scrape(engine(120, running=0)), now=15.0)
    assert tracker.quiet_for(25.0) == 20.0
    tracker.update(scrape(engine(125, running=0)), now=30.0)  # a request came and went
    assert tracker.quiet_for(30.0) == 0.0
    tracker.note_canary(canary("ok", at=40.0), now=40.0)
    assert tracker.quiet_for(45.0) == 5.0
    tracker.update(unreachable(), now=50.0)
    assert tracker.quiet_for(50.0) is None


def test_two_unanswered_canaries_on_an_idle_head_are_a_stall(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, running=0)), now=0.0)
    tracker.update(scrape(engine(100, running=0)), now=20.0)
    tracker.note_canary(canary("timeout", at=30.0), now=30.0)  # sent at 20.0

    # One timeout alone is not a hang (a busy front end can miss one): the
    # agent sends a confirming canary at once.
    assert tracker.update(scrape(engine(100, running=0)), now=31.0).state == "idle"
    assert tracker.canary_unconfirmed
    tracker.note_canary(canary("timeout", at=42.0), now=42.0)  # sent at 32.0
    assert not tracker.canary_unconfirmed

    status = tracker.update(scrape(engine(100, running=0)), now=43.0)

    assert status.state == "stalled"
    assert status.reason == (
        "no requests and no engine step, and 2 canaries in a row (1-token completions) got "
        "no answer within 10.0 s: the engine takes no new work"
    )
    # A step afterwards (the engine answered someone) ends it.
    assert tracker.update(scrape(engine(101, running=0)), now=45.0).state == "idle"


def test_an_answered_canary_between_timeouts_starts_the_count_again(
    tracker: ProgressTracker,
) -> None:
    tracker.update(scrape(engine(100, running=0)), now=0.0)
    tracker.note_canary(canary("timeout", at=30.0), now=30.0)
    tracker.note_canary(canary("ok", at=33.0), now=33.0)
    tracker.note_canary(canary("timeout", at=63.0), now=63.0)
    assert tracker.update(scrape(engine(100, running=0)), now=64.0).state == "idle"


def test_a_stop_that_did_not_take_lapses_and_death_is_seen_again() -> None:
    from spark_watchdog.probes.vllm_refusal import PLANNED_STOP_GRACE_S

    guarded = ProgressTracker(STALL_AFTER, dead_after=5.0)
    guarded.update(scrape(engine(100)), now=0.0)
    guarded.note_planned_stop(now=1.0)  # the launcher then refused it: vLLM keeps serving
    for t in range(2, int(PLANNED_STOP_GRACE_S) + 10, 2):
        guarded.update(scrape(engine(100 + t)), now=float(t))
    later = PLANNED_STOP_GRACE_S + 20.0
    guarded.update(refused(), now=later)
    assert guarded.update(refused(), now=later + 6.0).state == "dead"


def test_a_canary_error_on_an_idle_head_is_no_stall(tracker: ProgressTracker) -> None:
    tracker.update(scrape(engine(100, running=0)), now=0.0)
    tracker.note_canary(
        CanaryResult("error", 0.1, 20.0, "m", "HTTP 404: model not found"), now=20.0
    )
    assert tracker.update(scrape(engine(100, running=0)), now=21.0).state == "idle"


def test_the_last_advance_is_known_only_once_a_counter_went_up() -> None:
    tracker = ProgressTracker(STALL_AFTER)
    # The first sight is a baseline, not an advance; a canary is not one either.
    assert tracker.update(scrape(engine(10), at=0.0), 100.0).advanced_at is None
    tracker.note_canary(CanaryResult("ok", 0.1, 100.5, "m"), 100.5)
    assert tracker.update(scrape(engine(10), at=1.0), 101.0).advanced_at is None
    # Counted from the scrape before the one that saw it move: the earliest it can have.
    assert tracker.update(scrape(engine(11), at=2.0), 102.0).advanced_at == 101.0
    assert tracker.update(scrape(engine(11), at=3.0), 103.0).advanced_at == 101.0
    # Tokens alone move too.
    assert tracker.update(scrape(engine(11, tokens=99), at=4.0), 104.0).advanced_at == 103.0
    # Unreachable keeps the last advance seen; a counter that went down (a restarted
    # vLLM) is no proof the ranks stepped.
    assert tracker.update(unreachable(), 105.0).advanced_at == 103.0
    assert tracker.update(scrape(engine(1, tokens=1), at=6.0), 106.0).advanced_at == 103.0


def test_the_last_advance_is_not_in_the_report_s_json() -> None:
    tracker = ProgressTracker(STALL_AFTER)
    tracker.update(scrape(engine(1), at=0.0), 0.0)
    status = tracker.update(scrape(engine(2), at=1.0), 1.0)
    assert status.advanced_at == 0.0
    assert "advanced_at" not in status.to_json()


# --- the first sign of death: the controller's onset of a serving_dead incident ------


def test_death_by_refusal_is_dated_from_the_first_refusal(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100, running=0)), now=0.0)
    assert guarded.update(refused(2.0), now=2.0).dead_since is None  # not dead yet

    dead = guarded.update(refused(6.0), now=6.0)
    later = guarded.update(refused(9.0), now=9.0)

    # Before: no time at all; the incident took the agent's last answer as onset.
    assert dead.state == "dead" and dead.dead_since == 1_700_000_002.0
    assert later.dead_since == 1_700_000_002.0
    assert dead.to_json()["dead_since"] == "2023-11-14T22:13:22.000+00:00"


def test_a_503_and_a_gone_process_are_dated_from_the_look_that_saw_them() -> None:
    tracker = ProgressTracker(STALL_AFTER, dead_after=4.0)
    tracker.update(scrape(engine(100)), now=0.0)
    first = tracker.update(scrape(engine(100), health=503, at=3.0), now=3.0)
    assert tracker.update(scrape(engine(100), health=503, at=5.0), now=5.0).dead_since == (
        first.dead_since
    )
    assert first.dead_since == 1_700_000_003.0

    worker = ProgressTracker(STALL_AFTER)
    worker.update(None, now=0.0, process_alive=True, wall=1000.0)
    gone = worker.update(None, now=2.0, process_alive=False, wall=1002.0)
    assert gone.state == "dead" and gone.dead_since == 1002.0


def test_the_first_sign_is_forgotten_once_vllm_answers_again(guarded: ProgressTracker) -> None:
    guarded.update(scrape(engine(100, running=0)), now=0.0)
    guarded.update(refused(2.0), now=2.0)
    assert guarded.update(refused(6.0), now=6.0).dead_since == 1_700_000_002.0
    back = guarded.update(scrape(engine(0, running=0), at=20.0), now=20.0)
    assert back.state == "idle" and back.dead_since is None
    assert back.to_json()["dead_since"] is None
    guarded.update(refused(30.0), now=30.0)
    assert guarded.update(refused(34.0), now=34.0).dead_since == 1_700_000_030.0
