"""The detector's verdicts, case by case (the property tests cover the rules)."""

from __future__ import annotations

from spark_watchdog.controller.decide.detector import (
    DetectionPolicy,
    NodeObservation,
    Verdict,
    classify,
)

POLICY = DetectionPolicy(freeze_after=8.0, banner_misses=2)


def obs(**changes: object) -> NodeObservation:
    base: dict[str, object] = {
        "now": 100.0,
        "watch_started_at": 0.0,
        "agent_progress_at": 99.0,
        "snapshot": {"probes": {"vllm": {"state": "progressing"}}},
        "banner_misses": 0,
        "witness_ok": True,
    }
    base.update(changes)
    return NodeObservation(**base)  # type: ignore[arg-type]


def test_healthy_stalled_dead() -> None:
    assert classify(obs(), POLICY).verdict is Verdict.HEALTHY
    stalled = obs(snapshot={"probes": {"vllm": {"state": "stalled", "reason": "no steps 15s"}}})
    assert classify(stalled, POLICY).reasons == ("no steps 15s",)
    dead = obs(snapshot={"probes": {"vllm": {"state": "dead"}}})
    assert classify(dead, POLICY).verdict is Verdict.SERVING_DEAD
    worker = obs(snapshot={"probes": {"vllm": {"state": "dead"}}}, judges_serving=False)
    assert classify(worker, POLICY).verdict is Verdict.HEALTHY


def test_frozen_needs_silence_missing_banners_and_the_witness() -> None:
    frozen = obs(agent_progress_at=91.0, banner_misses=2)
    finding = classify(frozen, POLICY)
    assert finding.verdict is Verdict.HOST_FROZEN
    assert finding.summary == "host_frozen (agent silent 9.0s, no ssh banner x2)"
    assert classify(obs(agent_progress_at=91.0, banner_misses=1), POLICY).verdict is (
        Verdict.PENDING
    )
    isolated = obs(agent_progress_at=91.0, banner_misses=2, witness_ok=False)
    assert classify(isolated, POLICY).verdict is Verdict.ISOLATED


def test_agent_down_needs_a_banner_seen_during_the_silence() -> None:
    stale = obs(agent_progress_at=91.0, banner_ok_at=90.0)
    assert classify(stale, POLICY).verdict is Verdict.PENDING
    fresh = obs(agent_progress_at=91.0, banner_ok_at=95.0)
    assert classify(fresh, POLICY).verdict is Verdict.AGENT_DOWN
    never = obs(agent_progress_at=91.0)
    assert classify(never, POLICY).verdict is Verdict.PENDING


def test_an_answer_from_before_the_agent_was_late_is_no_sign_of_life_now() -> None:
    """A healthy-cadence banner or agent answer just after the last progress
    may come from before the host froze (a power cut right after it): not
    agent_down, which would restart an agent on a dead host."""
    assert POLICY.late_after == 2.0
    early_banner = obs(agent_progress_at=91.0, banner_ok_at=91.5)
    assert classify(early_banner, POLICY).verdict is Verdict.PENDING
    late_banner = obs(agent_progress_at=91.0, banner_ok_at=93.0)
    assert classify(late_banner, POLICY).verdict is Verdict.AGENT_DOWN
    early_answer = obs(now=99.0, agent_progress_at=91.0, agent_answer_at=91.5, banner_misses=2)
    finding = classify(early_answer, POLICY)
    assert finding.verdict is Verdict.PENDING and "a live kernel" in finding.summary
    gone = obs(now=100.0, agent_progress_at=91.0, agent_answer_at=91.5, banner_misses=2)
    assert classify(gone, POLICY).verdict is Verdict.HOST_FROZEN
    after = obs(now=100.0, agent_progress_at=91.0, agent_answer_at=99.6, banner_misses=2)
    assert classify(after, POLICY).verdict is Verdict.AGENT_DOWN


def test_an_answer_with_a_stuck_seq_is_agent_down_never_frozen() -> None:
    stuck = obs(agent_progress_at=80.0, agent_answer_at=99.5, banner_misses=3)
    finding = classify(stuck, POLICY)
    assert finding.verdict is Verdict.AGENT_DOWN
    assert "seq is stuck" in finding.summary
    # Once the answers stop too, silence counts again.
    gone = obs(agent_progress_at=80.0, agent_answer_at=90.0, banner_misses=3)
    assert classify(gone, POLICY).verdict is Verdict.HOST_FROZEN


def test_any_ssh_answer_within_freeze_after_means_no_fencing() -> None:
    refused_lately = obs(agent_progress_at=80.0, banner_misses=2, ssh_alive_at=95.0)
    finding = classify(refused_lately, POLICY)
    assert finding.verdict is Verdict.PENDING
    assert "a live kernel" in finding.summary
    older = obs(agent_progress_at=80.0, banner_misses=2, ssh_alive_at=91.0)
    assert classify(older, POLICY).verdict is Verdict.HOST_FROZEN


def test_going_down_is_rebooting_until_boot_timeout() -> None:
    policy = DetectionPolicy(freeze_after=8.0, banner_misses=2, boot_timeout=60.0)
    going = obs(agent_progress_at=50.0, banner_misses=5, going_down_at=60.0, going_down_why="x")
    assert classify(going, policy).verdict is Verdict.REBOOTING
    overdue = obs(agent_progress_at=20.0, banner_misses=5, going_down_at=30.0)
    assert classify(overdue, policy).verdict is Verdict.HOST_FROZEN


def test_a_node_the_controller_cannot_look_at_is_unobservable() -> None:
    blind = obs(agent_progress_at=80.0, banner_misses=3, unobservable="cannot resolve spark-2")
    finding = classify(blind, POLICY)
    assert finding.verdict is Verdict.UNOBSERVABLE
    assert "no fencing" in finding.summary


def test_the_agents_refusal_death_and_idle_hang_become_serving_verdicts() -> None:
    """The tracker's own JSON, as the agent publishes it, through classify."""
    from spark_watchdog.probes.vllm import CanaryResult, VllmSample
    from spark_watchdog.probes.vllm_metrics import EngineSample
    from spark_watchdog.probes.vllm_progress import ProgressTracker

    def sample(at: float, *, running: int = 0, waiting: int = 0) -> VllmSample:
        reading = EngineSample("0", running, waiting, 100, 400, None, 0.1, ("m",))
        return VllmSample(
            "http://head:8000", at, 1_700_000_000.0 + at, 200, {"0": reading}, True, None, ("m",)
        )

    gone = VllmSample(
        "http://head:8000",
        0.0,
        0.0,
        None,
        {},
        False,
        "GET /health: connection refused by head:8000",
        refused=True,
    )
    tracker = ProgressTracker(15.0, dead_after=5.0)
    tracker.update(sample(0.0), 0.0)
    tracker.update(gone, 1.0)
    dead = tracker.update(gone, 6.0).to_json()
    finding = classify(obs(snapshot={"probes": {"vllm": dead}}), POLICY)
    assert finding.verdict is Verdict.SERVING_DEAD
    assert finding.reasons == (
        "vLLM answered until 2023-11-14T22:13:20Z and now refuses connections on port 8000 "
        "(for 5.0 s, dead_after 5 s): its API server is gone",
    )

    hung = ProgressTracker(15.0)
    hung.update(sample(0.0, waiting=3), 0.0)
    stalled = hung.update(sample(15.0, waiting=3), 15.0).to_json()
    finding = classify(obs(snapshot={"probes": {"vllm": stalled}}), POLICY)
    assert finding.verdict is Verdict.SERVING_STALLED
    assert "3 request(s) waiting and none running" in finding.reasons[0]

    idle = ProgressTracker(15.0)
    idle.update(sample(0.0), 0.0)
    idle.note_canary(CanaryResult("timeout", 10.0, 30.0, "m", "no answer"), 30.0)
    # One unanswered canary is not yet a hang; the confirming second one is.
    finding = classify(
        obs(snapshot={"probes": {"vllm": idle.update(sample(31.0), 31.0).to_json()}}), POLICY
    )
    assert finding.verdict is Verdict.HEALTHY
    idle.note_canary(CanaryResult("timeout", 10.0, 42.0, "m", "no answer"), 42.0)
    finding = classify(
        obs(snapshot={"probes": {"vllm": idle.update(sample(43.0), 43.0).to_json()}}), POLICY
    )
    assert finding.verdict is Verdict.SERVING_STALLED
    assert "2 canaries in a row (1-token completions) got no answer" in finding.reasons[0]


def test_a_memory_guard_kill_is_memory_exhausted_on_any_node_unless_the_host_froze() -> None:
    kill = {"id": 1, "at_unix": 1.0, "result": "killed", "reasons": ["MemAvailable 3 GiB"]}
    worker = obs(guard_kill=kill, judges_serving=False)
    finding = classify(worker, POLICY)
    assert finding.verdict is Verdict.MEMORY_EXHAUSTED
    assert finding.reasons == ("memory guard: killed", "MemAvailable 3 GiB")
    # The head's dead rank is the same event: the kill decides.
    head = obs(guard_kill=kill, snapshot={"probes": {"vllm": {"state": "dead"}}})
    assert classify(head, POLICY).verdict is Verdict.MEMORY_EXHAUSTED
    # A host that froze after all is a frozen host.
    frozen = obs(guard_kill=kill, agent_progress_at=80.0, banner_misses=2)
    assert classify(frozen, POLICY).verdict is Verdict.HOST_FROZEN


def test_gpu_reads_timing_out_on_a_live_host_is_gpu_wedged_after_its_time() -> None:
    policy = DetectionPolicy(freeze_after=8.0, banner_misses=2, gpu_wedged_after=30.0)
    assert classify(obs(gpu_timeout_for=29.0), policy).verdict is Verdict.HEALTHY
    wedged = classify(obs(gpu_timeout_for=30.0, judges_serving=False), policy)
    assert wedged.verdict is Verdict.GPU_WEDGED and "the agent answers" in wedged.reasons
    # Silence still wins: a host that stops answering is judged as a frozen one.
    silent = obs(gpu_timeout_for=90.0, agent_progress_at=80.0, banner_misses=2)
    assert classify(silent, policy).verdict is Verdict.HOST_FROZEN


def test_an_answer_to_a_serving_request_is_life_and_stops_fencing() -> None:
    """The agent answered the controller's serving restart while its state
    polls were lost: a live host, never host_frozen (nor agent_down: its loop
    was not what answered)."""
    silent = obs(agent_progress_at=80.0, banner_misses=3)
    assert classify(silent, POLICY).verdict is Verdict.HOST_FROZEN
    heard = obs(agent_progress_at=80.0, banner_misses=3, heard_at=99.2)
    finding = classify(heard, POLICY)
    assert finding.verdict is Verdict.PENDING and "serving request" in finding.summary


def test_a_silent_node_its_peers_saw_advance_is_unreachable_never_frozen() -> None:
    seen = "spark-1 saw its agent advance 0.8s ago via http://10.20.0.3:9101"
    silent = obs(agent_progress_at=80.0, banner_misses=5, peer_seen_at=99.2, peer_seen=seen)
    finding = classify(silent, POLICY)
    assert finding.verdict is Verdict.UNREACHABLE
    assert seen in finding.reasons
    # A sighting older than freeze_after says nothing about now: frozen as before.
    stale = obs(agent_progress_at=80.0, banner_misses=5, peer_seen_at=92.0, peer_seen=seen)
    assert classify(stale, POLICY).verdict is Verdict.HOST_FROZEN
    # A live kernel on the controller's own path still reads as that, first.
    kernel = obs(agent_progress_at=80.0, ssh_alive_at=99.0, peer_seen_at=99.2, peer_seen=seen)
    assert classify(kernel, POLICY).verdict is Verdict.PENDING
    # The peers' word clears by itself: once the agent answers, healthy again.
    assert classify(obs(peer_seen_at=99.2, peer_seen=seen), POLICY).verdict is Verdict.HEALTHY


def test_a_gpu_fault_that_ended_the_rank_is_gpu_fault_on_any_node_unless_the_host_froze() -> None:
    fault = {"id": 1, "xid": 31, "at_unix": 1.0, "gpu": 0, "result": "stopped"}
    finding = classify(obs(gpu_fault=fault, judges_serving=False), POLICY)
    assert finding.verdict is Verdict.GPU_FAULT
    assert finding.reasons == (
        "Xid 31 (GPU memory page fault (MMU fault)) on GPU 0",
        "the rank's CUDA context is gone",
        "the agent stopped the rank",
    )
    failed = classify(obs(gpu_fault={**fault, "result": "stop_failed"}), POLICY)
    assert failed.reasons[-1] == "the agent could not stop the rank"
    # A host that froze after its fault is a frozen host: the freeze path names the fault.
    frozen = obs(gpu_fault=fault, agent_progress_at=80.0, banner_misses=2)
    assert classify(frozen, POLICY).verdict is Verdict.HOST_FROZEN
