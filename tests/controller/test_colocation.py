"""Which controller on the Sparks acts for a node (controller/decide/colocation.py):
example rows, and properties over random orders and hearing."""

from __future__ import annotations

import hypothesis.strategies as st
from hypothesis import given, settings

from spark_watchdog.controller.decide.colocation import (
    PeerHeard,
    Placement,
    Standing,
    actors,
    refusal,
    serving_refusal,
    tells_of,
)

ORDER = ("spark-1", "spark-2")
NOW = 1000.0
TAKEOVER, FENCE, FREEZE = 30.0, 20.0, 8.0


def _placement(me: str, order: tuple[str, ...] = ORDER) -> Placement:
    return Placement(me, order, TAKEOVER, FENCE, FREEZE)


def _standing(peers: dict[str, PeerHeard], observing_until: float = 0.0) -> Standing:
    return Standing(NOW, observing_until, peers)


def _heard(
    ago: float | None,
    claims: tuple[str, ...] = (),
    order: tuple[str, ...] = ORDER,
    holds: tuple[str, ...] = (),
) -> PeerHeard:
    return PeerHeard(None if ago is None else NOW - ago, frozenset(claims), order, frozenset(holds))


def test_a_controller_never_acts_for_its_own_host() -> None:
    why = refusal("spark-1", _placement("spark-1"), _standing({"spark-2": _heard(None)}), 999)
    assert why is not None and "its own host" in why and "spark-2" in why


def test_the_first_in_order_acts_at_once_for_the_second() -> None:
    assert (
        refusal("spark-2", _placement("spark-1"), _standing({"spark-2": _heard(None)}), 9) is None
    )


def test_the_second_waits_the_fence_delay_before_acting_for_the_first() -> None:
    placement, standing = _placement("spark-2"), _standing({"spark-1": _heard(None)})
    early = refusal("spark-1", placement, standing, FREEZE + FENCE - 1)
    assert early is not None and early.startswith("fence delay")
    assert refusal("spark-1", placement, standing, FREEZE + FENCE) is None


def test_the_next_takes_over_a_third_node_only_after_the_first_is_silent_for_takeover_after() -> (
    None
):
    order = ("spark-1", "spark-2", "spark-3")
    placement = _placement("spark-2", order)
    heard = refusal(
        "spark-3", placement, _standing({"spark-1": _heard(TAKEOVER - 1, order=order)}), 99
    )
    assert heard is not None and "spark-1 acts for it" in heard
    silent = _standing({"spark-1": _heard(TAKEOVER, order=order)})
    assert refusal("spark-3", placement, silent, 99) is None


def test_a_heard_claim_leaves_the_node_to_the_claimant() -> None:
    order = ("spark-1", "spark-2", "spark-3")
    # spark-3's actors are spark-1 then spark-2; spark-1 would act, but spark-2 claims it.
    standing = _standing({"spark-2": _heard(1, claims=("spark-3",), order=order)})
    why = refusal("spark-3", _placement("spark-1", order), standing, 99)
    assert why is not None and "recovering it" in why


def test_nothing_while_listening_after_a_start_or_a_gap() -> None:
    standing = _standing({"spark-2": _heard(None)}, observing_until=NOW + 5)
    why = refusal("spark-2", _placement("spark-1"), standing, 99)
    assert why is not None and "listening" in why
    assert serving_refusal(_placement("spark-1"), standing) is not None


def test_a_heard_controller_with_another_order_stops_every_action() -> None:
    other = _heard(1, order=("spark-2", "spark-1"))
    why = refusal("spark-2", _placement("spark-1"), _standing({"spark-2": other}), 99)
    assert why is not None and "configs agree" in why


def test_serving_is_restarted_by_the_first_heard_controller() -> None:
    heard = _standing({"spark-1": _heard(1)})
    assert serving_refusal(_placement("spark-2"), heard) is not None
    assert serving_refusal(_placement("spark-1"), _standing({"spark-2": _heard(1)})) is None
    assert serving_refusal(_placement("spark-2"), _standing({"spark-1": _heard(None)})) is None


NAMES = [f"spark-{i}" for i in range(1, 7)]


@st.composite
def _clusters(draw: st.DrawFn) -> tuple[tuple[str, ...], list[str], dict[str, bool]]:
    """An order of 2..6 controllers over 2..6 nodes, and which controllers are alive."""
    nodes = NAMES[: draw(st.integers(2, 6))]
    order = tuple(draw(st.permutations(nodes))[: draw(st.integers(2, len(nodes)))])
    alive = {c: draw(st.booleans()) for c in order}
    return order, nodes, alive


@settings(max_examples=500, deadline=None)
@given(_clusters(), st.floats(0, 120))
def test_controllers_that_hear_each_other_give_each_node_at_most_one_actor(
    cluster: tuple[tuple[str, ...], list[str], dict[str, bool]], silent_for: float
) -> None:
    """Every live controller hears every other live one (dead ones are silent):
    for each node at most one acts, never one on its own host, none for a node
    whose own controller is heard, and when some live controller may act (fence
    delay passed) exactly one does."""
    order, nodes, alive = cluster
    live = [c for c in order if alive[c]]
    for node in nodes:
        acting = []
        for me in live:
            peers = {c: _heard(1 if alive[c] else None, order=order) for c in order if c != me}
            if refusal(node, _placement(me, order), _standing(peers), silent_for) is None:
                acting.append(me)
        assert len(acting) <= 1, (node, acting)
        assert node not in acting
        if alive.get(node, False):  # its own controller answers: the host is alive
            assert acting == []
            continue
        first = next((c for c in actors(node, order) if alive[c]), None)
        delayed = node in order and first is not None and order.index(node) < order.index(first)
        if first is not None and (not delayed or silent_for >= FREEZE + FENCE):
            assert acting == [first]


@settings(max_examples=300, deadline=None)
@given(_clusters())
def test_exactly_one_live_controller_restarts_serving(
    cluster: tuple[tuple[str, ...], list[str], dict[str, bool]],
) -> None:
    order, _, alive = cluster
    live = [c for c in order if alive[c]]
    restarting = [
        me
        for me in live
        if serving_refusal(
            _placement(me, order),
            _standing({c: _heard(1 if alive[c] else None, order=order) for c in order if c != me}),
        )
        is None
    ]
    assert restarting == live[:1]


@settings(max_examples=300, deadline=None)
@given(_clusters(), st.floats(0, 120))
def test_in_mutual_suspicion_of_two_controllers_only_one_may_act_before_the_fence_delay(
    cluster: tuple[tuple[str, ...], list[str], dict[str, bool]], silent_for: float
) -> None:
    """Two controllers that hear nothing of anyone suspect each other: the later
    one in the order waits freeze_after + fence_delay, the earlier does not."""
    order = cluster[0]
    a, b = order[0], order[1]
    silent = {c: _heard(None, order=order) for c in order}
    a_acts = refusal(
        b, _placement(a, order), _standing({c: silent[c] for c in order if c != a}), silent_for
    )
    b_acts = refusal(
        a, _placement(b, order), _standing({c: silent[c] for c in order if c != b}), silent_for
    )
    assert a_acts is None
    assert (b_acts is None) == (silent_for >= FREEZE + FENCE)


def test_serving_waits_while_another_controller_recovers_a_node() -> None:
    """Its recovery ends with a serving restart of its own: not a second one."""
    recovering = _standing({"spark-2": _heard(1, claims=("spark-1",))})
    why = serving_refusal(_placement("spark-1"), recovering)
    assert why is not None and "recovering spark-1" in why


def test_a_node_whose_own_controller_answers_is_alive_whatever_its_agent_says() -> None:
    """Its controller's loop moved on within freeze_after: the host runs (its agent
    may be silent on a cut management link while its controller is heard on the fabric)."""
    placement = _placement("spark-1")
    alive = _standing({"spark-2": _heard(FREEZE - 1)})
    why = refusal("spark-2", placement, alive, 999)
    assert why is not None and "the host is alive" in why
    assert refusal("spark-2", placement, _standing({"spark-2": _heard(FREEZE)}), 999) is None


def test_a_hold_heard_from_another_controller_binds_this_one() -> None:
    """A person's hold, written on one Spark, binds the controller that acts for
    the node too while it hears the one that holds it."""
    order = ("spark-1", "spark-2", "spark-3")
    node_hold = _standing({"spark-2": _heard(1, order=order, holds=("spark-3",))})
    why = refusal("spark-3", _placement("spark-1", order), node_hold, 99)
    assert why is not None and "held in the history of the controller on spark-2" in why
    cluster = _standing({"spark-2": _heard(1, order=order, holds=("*",))})
    assert refusal("spark-3", _placement("spark-1", order), cluster, 99) is not None
    assert serving_refusal(_placement("spark-1", order), cluster) is not None
    silent = _standing({"spark-2": _heard(TAKEOVER, order=order, holds=("spark-3",))})
    assert refusal("spark-3", _placement("spark-1", order), silent, 99) is None


def test_a_controller_whose_loop_stood_still_listens_before_it_acts() -> None:
    """Woken from a stop in the middle of a step, what it heard is stale: before
    its next sweep it acts on nothing (the simulation found a second cut here)."""
    peers = {"spark-2": _heard(None)}
    stale = Standing(NOW, 0.0, peers, last_sweep=NOW - TAKEOVER / 2)
    why = refusal("spark-2", _placement("spark-1"), stale, 999)
    assert why is not None and "stood still" in why
    fresh = Standing(NOW, 0.0, peers, last_sweep=NOW - 1)
    assert refusal("spark-2", _placement("spark-1"), fresh, 999) is None


def test_a_claim_outlives_its_silent_controller_by_its_grace() -> None:
    """Stopped right after its off, a controller cannot say the node is booting:
    its last claim stands takeover_after + claim_grace (the simulation found a
    second cut of a node in POST without it)."""
    order = ("spark-1", "spark-2", "spark-3")
    placement = Placement("spark-2", order, TAKEOVER, FENCE, FREEZE, claim_grace=360.0)
    claimed = _standing({"spark-1": _heard(TAKEOVER + 100, claims=("spark-3",), order=order)})
    why = refusal("spark-3", placement, claimed, 999)
    assert why is not None and "recovering it" in why
    expired = _standing({"spark-1": _heard(TAKEOVER + 360, claims=("spark-3",), order=order)})
    assert refusal("spark-3", placement, expired, 999) is None


def test_the_first_heard_actor_tells_of_a_node_even_while_it_may_not_act() -> None:
    """Alerts about a node come from its first heard actor, also while its own
    controller's answers keep anyone from acting (a cut management link)."""
    alive = _standing({"spark-2": _heard(1)})
    assert refusal("spark-2", _placement("spark-1"), alive, 999) is not None
    assert tells_of("spark-2", _placement("spark-1"), alive)
    assert not tells_of("spark-1", _placement("spark-1"), alive)  # its own host
    # spark-1's only actor is spark-2: it tells of spark-1, heard or not.
    assert tells_of("spark-1", _placement("spark-2"), _standing({"spark-1": _heard(1)}))
