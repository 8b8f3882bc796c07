"""Which pulses are progress: a restarted agent, replays and forged pulses
(agent/peer_sightings.py; docs/design.md, "Peers")."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spark_watchdog.agent.peer_sightings import MAX_RUNS, Sightings, most_loops
from spark_watchdog.agent.peers import PeerView
from spark_watchdog.probes.pulse import Pulse, PulseAnswer

BOOT = "3f1c" * 8
OTHER_BOOT = "f" * 32


def _note(view: PeerView, seq: int, at: float, boot: str = BOOT, run: str | None = "a") -> None:
    view.note(PulseAnswer("ok", Pulse("spark-3", seq, boot, run)), at)


def test_an_agent_restarted_on_the_same_boot_is_seen_at_its_next_pulse() -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    # An agent that ran for days: its seq is high.
    _note(view, 400_000, 1.0)
    _note(view, 400_001, 2.0)
    assert view.progress_at == 2.0
    # Restarted on the same boot: a new run, its seq from 0 again.
    _note(view, 0, 3.0, run="b")
    assert view.progress_at == 2.0  # a baseline
    _note(view, 1, 4.0, run="b")
    assert view.progress_at == 4.0 and view.seq == 1
    # The old run's last pulse, replayed or late, is nothing.
    _note(view, 400_001, 5.0)
    _note(view, 400_001, 6.0)
    assert view.progress_at == 4.0


def test_an_agent_that_names_no_run_still_shows_its_seq_advancing() -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    _note(view, 7, 1.0, run=None)
    _note(view, 8, 2.0, run=None)
    assert view.progress_at == 2.0


@pytest.mark.parametrize("runs", [("first", "second"), (None, None)], ids=["runs", "no-run"])
def test_two_boots_pulses_alternated_are_never_progress(
    runs: tuple[str | None, str | None],
) -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    # A frozen node's last pulse of each of its two boots, replayed in turn.
    for n in range(200):
        _note(view, 500, 1.0 + 2 * n, boot=BOOT, run=runs[0])
        _note(view, 900, 2.0 + 2 * n, boot=OTHER_BOOT, run=runs[1])
    assert view.progress_at is None


def test_a_forged_seq_far_ahead_never_holds_back_the_real_one() -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    _note(view, 10, 1.0)
    _note(view, 11, 2.0)
    _note(view, 10**17, 2.5)  # within 18 digits: read as a pulse, not as a loop's count
    assert view.seq == 11 and "further ahead" in (view.error or "")
    _note(view, 12, 3.0)
    assert view.progress_at == 3.0 and view.seq == 12


def test_made_up_runs_never_push_out_a_run_seen_advancing() -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    _note(view, 1, 1.0, run="real")
    _note(view, 2, 2.0, run="real")
    for n in range(3 * MAX_RUNS):
        _note(view, 7, 2.1 + n / 100, run=f"made-up-{n}")
    _note(view, 3, 3.0, run="real")
    assert view.progress_at == 3.0
    # Made-up runs that advance push it out, and are progress themselves.
    for n in range(MAX_RUNS):
        _note(view, 7, 3.1 + n / 100, run=f"advancing-{n}")
        _note(view, 8, 3.2 + n / 100, run=f"advancing-{n}")
    assert view.progress_at == 3.2 + (MAX_RUNS - 1) / 100
    _note(view, 4, 4.0, run="real")  # a baseline again
    _note(view, 5, 5.0, run="real")
    assert view.progress_at == 5.0


def test_a_run_rises_at_most_one_loop_per_shortest_interval() -> None:
    assert most_loops(0.0) == 1
    assert most_loops(1.0) == 11
    assert most_loops(-5.0) == 1  # a pulse taken out of order
    runs = Sightings()
    runs.take(BOOT, "a", 0, 0.0)
    # A second since, with room for a late pulse (STALE_S): 31 loops at most.
    assert runs.take(BOOT, "a", 32, 1.0).kind == "implausible"
    assert runs.take(BOOT, "a", 31, 1.0).kind == "progress"


@pytest.mark.parametrize("late", [0.2, 0.5, 1.0, 1.9])
def test_a_fast_peer_whose_one_pulse_came_late_is_seen_at_its_next(late: float) -> None:
    """A peer on the shortest loop (0.1 s and its work: 0.101 s), asked every
    second; one answer late in transit (a retransmit, the timeout's worth):
    every pulse after it is progress."""
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    for n in range(60):
        sent = float(n)
        received = sent + (late if n == 10 else 0.001)
        _note(view, int(sent / 0.101), received)
        if n > 10:
            assert view.progress_at is not None and view.progress_at >= received, (n, view.error)


def test_an_agent_whose_first_pulse_names_no_boot_is_seen_at_its_second() -> None:
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    view.note(PulseAnswer("ok", Pulse("spark-3", 0, None, "new")), 1.0)
    view.note(PulseAnswer("ok", Pulse("spark-3", 1, BOOT, "new")), 2.0)
    assert view.progress_at == 2.0


# One step of a schedule: the real agent's next pulse, a replay of any pulse
# seen so far, or a forged pulse (a made-up run, or the real run's seq further
# ahead than a loop can count: a seq within that reach is indistinguishable
# from a real one, and blinds at most for as many loops, as a dark fabric would).
_STEP = st.one_of(
    st.just(("real", 0)),
    st.tuples(st.just("replay"), st.integers(0, 10_000)),
    st.tuples(st.just("new_run"), st.integers(0, 10**6)),
    st.tuples(st.just("ahead"), st.integers(most_loops(120.0) + 1, 10**17)),
)


@settings(max_examples=300, deadline=None)
@given(st.lists(_STEP, min_size=1, max_size=120))
def test_no_pulse_from_anyone_hides_the_real_agent_for_more_than_one_pulse(
    steps: list[tuple[str, int]],
) -> None:
    """Whatever else arrives from the peer's address (replays, forged seqs, up
    to MAX_RUNS - 1 runs new to the record between two real pulses), each real
    pulse after the second finds progress at least as recent as the one before."""
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    now, seq = 0.0, 0
    heard: list[Pulse] = []
    real_at: list[float] = []
    forged = made_up = 0  # made-up runs in all, and since the real one's last pulse
    for kind, value in steps:
        now += 0.25
        if kind == "real":
            seq += 1
            pulse = Pulse("spark-3", seq, BOOT, "real")
            real_at.append(now)
            made_up = 0
        elif kind == "replay":
            if not heard:
                continue
            pulse = heard[value % len(heard)]
        elif kind == "new_run":
            forged += 1
            pulse = Pulse("spark-3", value, BOOT, f"forged-{forged}")
        elif not real_at:
            continue  # a run is forged once its id is out: after its first pulse
        else:
            pulse = Pulse("spark-3", seq + value, BOOT, "real")
        if kind != "real" and (None, pulse.run) not in view.sightings._runs:
            if made_up == MAX_RUNS - 1:
                continue  # as many new runs as can come between two real pulses
            made_up += 1
        view.note(PulseAnswer("ok", pulse), now)
        heard.append(pulse)
        if kind == "real" and len(real_at) >= 2:
            assert view.progress_at is not None and view.progress_at >= real_at[-2]


@settings(max_examples=300, deadline=None)
@given(
    st.integers(2, 30),
    st.lists(st.integers(0, 10_000), min_size=1, max_size=200),
)
def test_replays_of_a_silent_agent_s_pulses_are_never_progress(
    live: int, replays: list[int]
) -> None:
    """An agent that stopped (two boots and a restart behind it): any replay of
    what it sent leaves its last progress where it was."""
    view = PeerView("spark-3", "http://10.0.0.3:9101")
    sent: list[Pulse] = []
    now = 0.0
    for boot, run in ((OTHER_BOOT, "x"), (BOOT, "y"), (BOOT, "z")):
        for seq in range(live):
            now += 1.0
            pulse = Pulse("spark-3", seq, boot, run)
            view.note(PulseAnswer("ok", pulse), now)
            sent.append(pulse)
    last = view.progress_at
    assert last == now
    for value in replays:
        now += 0.5
        view.note(PulseAnswer("ok", sent[value % len(sent)]), now)
    assert view.progress_at == last
