"""Property tests: the safety rules hold for any sequence of observations.

A small simulation drives the pure detector, planner and state machine tick
by tick with arbitrary agent answers, SSH banners, witness results, holds,
dry-run and power outcomes, and checks the rules of issue "controller" after
every tick.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from spark_watchdog.controller.decide.detector import (
    DetectionPolicy,
    Finding,
    NodeObservation,
    Verdict,
    classify,
)
from spark_watchdog.controller.decide.node_states import NodeEvent, NodeState, transition
from spark_watchdog.controller.decide.planner import Guards, Step, decide

POLICY = DetectionPolicy(freeze_after=8.0, banner_misses=2)
TICK = 1.0


@dataclass(frozen=True)
class Tick:
    agent_answers: bool
    banner_ok: bool
    witness_ok: bool
    vllm_state: str
    hold: bool
    release: bool
    rung_outcome: str  # what a started rung leads to
    boots: bool  # the node comes back with a new boot id this tick
    peer_sees: bool  # a peer the controller trusts saw the agent advance this tick


# Biased towards trouble: freezes need long silences, which fair coins rarely give.
ticks = st.builds(
    Tick,
    agent_answers=st.integers(min_value=0, max_value=9).map(lambda n: n >= 8),
    banner_ok=st.integers(min_value=0, max_value=3).map(lambda n: n == 0),
    witness_ok=st.integers(min_value=0, max_value=9).map(lambda n: n != 0),
    vllm_state=st.sampled_from(["progressing", "idle", "stalled", "dead", "unreachable"]),
    hold=st.integers(min_value=0, max_value=29).map(lambda n: n == 0),
    release=st.integers(min_value=0, max_value=4).map(lambda n: n == 0),
    rung_outcome=st.sampled_from(["restored", "failed", "ambiguous"]),
    boots=st.integers(min_value=0, max_value=3).map(lambda n: n == 0),
    peer_sees=st.integers(min_value=0, max_value=19).map(lambda n: n == 0),
)


@settings(max_examples=150, deadline=None)
@given(
    sequence=st.lists(ticks, min_size=30, max_size=150),
    dry_run=st.booleans(),
    rungs=st.integers(min_value=0, max_value=3),
    budget=st.integers(min_value=0, max_value=4),
)
def test_safety_rules_hold_for_any_sequence(
    sequence: list[Tick], dry_run: bool, rungs: int, budget: int
) -> None:
    now = 0.0
    state = NodeState.WATCHING
    fences = 0
    agent_progress_at: float | None = None
    banner_misses = 0
    held = False
    cycles = 0
    rungs_done: set[int] = set()
    incident_open = False
    boot_deadline = 0.0
    peer_seen_at: float | None = None

    for tick in sequence:
        now += TICK
        if tick.agent_answers and state is not NodeState.FENCING:
            agent_progress_at = now
        if tick.peer_sees and state is not NodeState.FENCING:
            peer_seen_at = now
        banner_misses = 0 if tick.banner_ok else banner_misses + 1
        if tick.hold:
            held = True
            state = transition(state, NodeEvent.HOLD)
        elif tick.release and held:
            held = False
            state = transition(state, NodeEvent.RELEASE)

        obs = NodeObservation(
            now=now,
            watch_started_at=0.0,
            agent_progress_at=agent_progress_at,
            snapshot={"probes": {"vllm": {"state": tick.vllm_state}}},
            banner_misses=banner_misses,
            witness_ok=tick.witness_ok,
            peer_seen_at=peer_seen_at,
        )
        finding = classify(obs, POLICY)
        guards = Guards(
            node_held=held,
            dry_run=dry_run,
            node_cycles_in_window=cycles,
            node_budget=budget,
            rungs=rungs,
            rungs_done=frozenset(rungs_done) if incident_open else frozenset(),
        )
        decision = decide(state, finding, guards)
        # Rule: nothing automatic happens to a held node.
        if held:
            assert decision.step not in (Step.FENCE, Step.RECORD_DRY_RUN, Step.RESTART_SERVING)

        if decision.step is Step.FENCE:
            # Rule: power only for a node whose agent was silent ≥ freeze_after...
            assert obs.agent_silent_s >= POLICY.freeze_after
            # ...with the SSH banner missing and the witness reachable...
            assert banner_misses >= POLICY.banner_misses and tick.witness_ok
            # ...and no peer that saw it advance within freeze_after.
            assert peer_seen_at is None or now - peer_seen_at >= POLICY.freeze_after
            # Rule: never while held, never in dry run, never beyond the budget.
            assert not held and not dry_run
            assert cycles < budget
            # Rule: a rung runs at most once per incident.
            assert decision.rung is not None and decision.rung not in rungs_done
            assert decision.event is NodeEvent.FROZEN_CONFIRMED
            state = transition(state, decision.event)
            incident_open = True
            rungs_done.add(decision.rung)
            cycles += 1
            fences += 1
            if tick.rung_outcome == "restored":
                state = transition(state, NodeEvent.POWER_RESTORED)
                boot_deadline = now + 5 * TICK
            elif tick.rung_outcome == "ambiguous":
                state = transition(state, NodeEvent.AMBIGUOUS)
                held = True
            else:
                more = any(r not in rungs_done for r in range(rungs))
                event = NodeEvent.RUNG_FAILED if more else NodeEvent.LADDER_EXHAUSTED
                state = transition(state, event)
                if state is NodeState.FENCING:
                    # The runner moves straight to the next rung: model it as
                    # watching again with the incident still open.
                    state = NodeState.WATCHING
                else:
                    held = True
        elif decision.step is Step.HOLD:
            assert decision.event is not None
            state = transition(state, decision.event)
            held = True
        else:
            assert decision.step is not Step.RECORD_DRY_RUN or dry_run

        if state is NodeState.BOOTING:
            if tick.boots:
                state = transition(state, NodeEvent.NEW_BOOT)
                agent_progress_at = now
                incident_open = False
                rungs_done.clear()
            elif now >= boot_deadline:
                more = any(r not in rungs_done for r in range(rungs))
                if more:
                    state = NodeState.WATCHING  # next rung via the planner
                else:
                    state = transition(state, NodeEvent.LADDER_EXHAUSTED)
                    held = True


@given(
    silent=st.floats(min_value=0, max_value=7.99),
    misses=st.integers(min_value=0, max_value=10),
    witness=st.booleans(),
)
def test_an_agent_heard_within_freeze_after_is_never_frozen(
    silent: float, misses: int, witness: bool
) -> None:
    obs = NodeObservation(
        now=100.0,
        watch_started_at=0.0,
        agent_progress_at=100.0 - silent,
        snapshot={"probes": {"vllm": {"state": "progressing"}}},
        banner_misses=misses,
        witness_ok=witness,
    )
    assert classify(obs, POLICY).verdict is not Verdict.HOST_FROZEN


@given(
    seen_ago=st.floats(min_value=0, max_value=7.99),
    silent=st.floats(min_value=8.0, max_value=600.0),
    misses=st.integers(min_value=0, max_value=10),
    witness=st.booleans(),
)
def test_a_node_its_peers_saw_within_freeze_after_is_never_frozen(
    seen_ago: float, silent: float, misses: int, witness: bool
) -> None:
    obs = NodeObservation(
        now=1000.0,
        watch_started_at=0.0,
        agent_progress_at=1000.0 - silent,
        snapshot={},
        banner_misses=misses,
        witness_ok=witness,
        peer_seen_at=1000.0 - seen_ago,
    )
    assert classify(obs, POLICY).verdict is not Verdict.HOST_FROZEN


def test_the_simulation_reaches_power_actions() -> None:
    """Guard against a vacuous property: the generator must produce freezes."""
    seen: list[int] = []

    @settings(max_examples=200, deadline=None)
    @given(sequence=st.lists(ticks, min_size=60, max_size=120))
    def count(sequence: list[Tick]) -> None:
        now, progress, misses, fences = 0.0, 0.0, 0, 0
        for tick in sequence:
            now += TICK
            progress = now if tick.agent_answers else progress
            misses = 0 if tick.banner_ok else misses + 1
            obs = NodeObservation(now, 0.0, progress, {}, misses, tick.witness_ok)
            if classify(obs, POLICY).verdict is Verdict.HOST_FROZEN:
                fences += 1
        seen.append(fences)

    count()
    assert sum(1 for n in seen if n > 0) >= 20


@given(
    verdict=st.sampled_from(list(Verdict)),
    state=st.sampled_from(list(NodeState)),
    held=st.booleans(),
    dry_run=st.booleans(),
    cycles=st.integers(min_value=0, max_value=9),
    rungs=st.integers(min_value=0, max_value=3),
)
def test_decide_acts_only_on_the_verdicts_the_controller_reads_guards_for(
    verdict: Verdict, state: NodeState, held: bool, dry_run: bool, cycles: int, rungs: int
) -> None:
    """The controller skips the guards' history reads for a verdict outside
    ACTED_ON (controller/daemon.py); that is safe only if decide would do
    nothing for it in any state with any guards."""
    from spark_watchdog.controller.decide.planner import ACTED_ON

    guards = Guards(node_held=held, dry_run=dry_run, node_cycles_in_window=cycles, rungs=rungs)
    decision = decide(state, Finding(verdict, ("x",)), guards)
    if verdict not in ACTED_ON:
        assert decision.step is Step.NOTHING
