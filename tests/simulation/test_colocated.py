"""Controllers on the Sparks themselves, simulated, each dying with its host
(docs/simulation.md, "Controllers on the Sparks"), and the invariants
hold: no cycle of a node the sender saw alive (I1), never its own host
(I15), never two cycles for one freeze (I16), every single freeze recovered
within its bound (I17).

The seeded runs are a sixth of SPARK_WATCHDOG_SIM_SEEDS (5 in --fast's 30, 83
in the whole suite's 500); the scripted rows play each fault of these runs
once and say who acted and how often; the last tests take a rule of the
controllers' order away and watch an invariant fail.
"""

from __future__ import annotations

import multiprocessing
import os
import sys
from typing import Any

import pytest

from spark_watchdog.controller.look import controller_peers
from spark_watchdog.simulation.colocated import simulate_colocated
from spark_watchdog.simulation.hosts import HostNetwork
from spark_watchdog.simulation.placed_report import PlacedReport
from spark_watchdog.simulation.run import Scripted, SelfTimed

SEEDS = max(4, int(os.environ.get("SPARK_WATCHDOG_SIM_SEEDS", "500")) // 6)
BACKGROUND_NICE = 5  # as tests/simulation/test_simulation.py's random runs
MINUTES = 10.0
S1, S2, S3, S4 = "spark-1", "spark-2", "spark-3", "spark-4"


def _run(seed: int) -> PlacedReport:
    return simulate_colocated(seed, MINUTES)


@pytest.mark.xdist_group("simulation-colocated")
def test_random_runs_with_controllers_on_the_sparks_keep_every_invariant() -> None:
    context = multiprocessing.get_context("spawn")
    with context.Pool(2, initializer=os.nice, initargs=(BACKGROUND_NICE,)) as pool:
        reports = pool.map(_run, range(SEEDS), chunksize=2)
    violations = [v for r in reports for v in r.violations]
    freezes = {k: sum(r.freezes[k] for r in reports) for k in reports[0].freezes}
    print(
        f"\n{len(reports)} runs, {sum(r.node_hours for r in reports):.0f} node-hours, "
        f"{sum(r.commands for r in reports)} power commands, "
        f"{sum(r.processes for r in reports)} controller processes, {freezes}, "
        f"{len(violations)} violations"
    )
    assert all(r.simulated_s >= MINUTES * 60 for r in reports)
    # The runs must cut power and recover freezes, or passing proves little.
    assert sum(r.commands for r in reports) > SEEDS // 2
    assert freezes["freezes"] >= SEEDS // 2
    assert freezes["recovered_in_bound"] >= SEEDS // 20
    assert violations == [], "\n".join(violations[:20])


def test_a_seed_replays_exactly() -> None:
    assert simulate_colocated(3, 3.0) == simulate_colocated(3, 3.0)


def _placed(order: list[str], fabric: bool = False, **sections: Any) -> dict[str, Any]:
    """The order of controllers, with 30 s to take over and a 10 s fence delay."""
    controllers = [
        {"node": n, "urls": [f"http://{n}:9721", f"http://{n}-fabric:9721"]}
        if fabric
        else {"node": n}
        for n in order
    ]
    return {
        "colocated": {"controllers": controllers, "takeover_after": 30.0, "fence_delay": 10.0},
        "guards": {"dry_run": False},
        "detection": {"freeze_after": 4.0},
        "policy": {"power_off_seconds": 5.0},
        **sections,
    }


def _scripted(
    nodes: int,
    order: list[str],
    script: list[Scripted],
    self_timed: SelfTimed = "never",
    seed: int = 1,
    **kw: Any,
) -> PlacedReport:
    return simulate_colocated(
        seed,
        3.0,
        nodes=nodes,
        script=script,
        overrides=_placed(order, **kw),
        self_timed=self_timed,
        peers=True,
    )


# (what, nodes, order, script, {node: the hosts whose controllers cut it, in order})
ROWS: list[tuple[str, int, list[str], list[Scripted], dict[str, list[str]]]] = [
    # The head runs the first controller: the next one waits its fence delay, then cuts it.
    ("freeze-head", 2, [S1, S2], [(60.0, "freeze-head", None)], {S1: [S2]}),
    (
        "freeze-first-controller",
        4,
        [S3, S1, S2, S4],
        [(60.0, "freeze-first-controller", None)],
        {S3: [S1]},
    ),
    ("freeze-controller-host", 4, [S1, S2], [(60.0, "freeze-controller-host", S2)], {S2: [S1]}),
    ("freeze of a node without a controller", 4, [S1, S2], [(60.0, "freeze", S3)], {S3: [S1]}),
    # Both controllers' hosts frozen: nobody is left to act, and nobody does.
    ("double-freeze of both controllers", 2, [S1, S2], [(60.0, "double-freeze", S1)], {}),
    ("double-freeze", 4, [S1, S2], [(60.0, "double-freeze", S2)], {S2: [S1], S3: [S1]}),
    ("fabric-cable-pulled", 2, [S1, S2], [(60.0, "fabric-cable-pulled", S1)], {}),
    # Its peer vouches for it over the fabric; it cannot reach the witness itself.
    ("mgmt-partition-90", 2, [S1, S2], [(60.0, "mgmt-partition-90", S2)], {}),
    ("switch-down", 2, [S1, S2], [(60.0, "switch-down", None)], {}),
    # The plug out of the second's reach: the first cuts, as it would anyway.
    (
        "plug-unreachable",
        4,
        [S1, S2],
        [(60.0, "plug-unreachable", S2), (61.0, "freeze", S3)],
        {S3: [S1]},
    ),
    # Killed and started again 5 s later: heard again before the next may take over,
    # it listens for takeover_after, then acts itself.
    (
        "controller-kill",
        4,
        [S1, S2],
        [(60.0, "controller-kill", S1), (61.0, "freeze", S3)],
        {S3: [S1]},
    ),
    # Stopped longer than takeover_after: the next takes over, and the first, once
    # it wakes and has listened, hears its claim and leaves the node to it.
    (
        "controller-pause-40",
        4,
        [S1, S2],
        [(60.0, "controller-pause-40", S1), (61.0, "freeze", S3)],
        {S3: [S2]},
    ),
    ("total-partition", 2, [S1, S2], [(60.0, "total-partition", None)], {}),
]


@pytest.mark.parametrize(
    ("what", "nodes", "order", "script", "cut_by"), ROWS, ids=[r[0] for r in ROWS]
)
def test_who_acts_for_each_fault(
    what: str, nodes: int, order: list[str], script: list[Scripted], cut_by: dict[str, list[str]]
) -> None:
    report = _scripted(nodes, order, script)
    assert report.violations == []
    assert {n: report.cycles_by(n) for n in report.verdicts if report.cycles_by(n)} == cut_by
    for node in cut_by:
        assert report.verdicts[node] == "healthy"
    if not cut_by:
        assert report.commands == 0


def test_controllers_heard_over_the_fabric_leave_a_node_cut_off_from_management_alone() -> None:
    """The management link of the second controller's host dark for 90 s, the
    controllers heard over the fabric: nobody takes over, nothing is cut."""
    report = _scripted(2, [S1, S2], [(60.0, "mgmt-partition-90", S2)], fabric=True)
    assert report.violations == []
    assert report.commands == 0


def test_a_partition_that_heals_mid_cycle_gets_at_most_one_cycle_from_one_controller() -> None:
    """Both links of spark-2 dark for about as long as finding it silent and
    cutting it take: spark-1 (first) may cut it, spark-2 never cuts spark-1."""
    for seed in range(3):
        report = simulate_colocated(
            seed,
            3.0,
            nodes=2,
            script=[(60.0, "partition-heals-mid-cycle", S2)],
            overrides=_placed([S1, S2]),
            self_timed="never",
            peers=True,
        )
        assert report.violations == []
        assert report.cycles_by(S1) == []
        assert len(report.cycles_by(S2)) <= 1


def test_a_short_pause_of_a_controller_changes_nothing() -> None:
    report = _scripted(4, [S1, S2], [(60.0, "controller-pause", S2)])
    assert report.violations == []
    assert report.commands == 0


def test_the_network_between_the_sparks() -> None:
    class Host:
        def __init__(self, name: str) -> None:
            self.name, self.partitioned_until, self.fabric_down_until = name, -1.0, -1.0

    now = [0.0]
    a, b = Host("a"), Host("b")
    network = HostNetwork(lambda: now[0], [a, b], 4.0)
    assert not network.cut_off("a", b) and network.fabric_path("a", "b")
    a.partitioned_until = 10.0  # a's management link dark
    assert network.cut_off("a", b) and network.cut_off("b", a)
    assert not network.cut_off("a", a)  # its own address never leaves it
    assert network.plug_cut("a") and not network.plug_cut("b")
    assert network.heard_path("a", "b")  # over the fabric
    network.pull_cable("a", "b", 10.0)
    assert not network.heard_path("a", "b")
    now[0] = 10.0
    assert network.heard_path("a", "b") and not network.plug_cut("a")
    network.switch_down(20.0)
    assert network.off_the_switch("b") and network.cut_off(None, b) is False


# -- the invariants fail when a rule of the order is taken away --------------------------


def _everyone(node: str, placement: Any, standing: Any, silent_for: float) -> str | None:
    """Every controller acts for every node but its own host."""
    return "its own host" if node == placement.me else None


def _nobody(node: str, placement: Any, standing: Any, silent_for: float) -> str | None:
    return "someone else's"


def _even_its_own(node: str, placement: Any, standing: Any, silent_for: float) -> str | None:
    return None


@pytest.mark.skipif(
    sys.version_info >= (3, 13),
    reason="whether the second off finds the outlet already off (a hold, not a second "
    "cut) depends on which task the event loop runs first; under Python 3.13 the first "
    "controller's off lands first in every seed tried: the host's Python checks it",
)
def test_without_the_order_two_controllers_cycle_one_freeze(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(controller_peers, "refusal", _everyone)
    report = _scripted(4, [S1, S2], [(60.0, "freeze", S3)])
    assert any(v.split(": ", 1)[1].startswith("I16") for v in report.violations), report.violations


def test_a_freeze_nobody_acts_on_breaks_its_bound(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(controller_peers, "refusal", _nobody)
    report = _scripted(4, [S1, S2], [(60.0, "freeze", S3)])
    assert any(v.split(": ", 1)[1].startswith("I17") for v in report.violations), report.violations


def test_a_controller_that_may_act_on_its_own_host_reboots_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Its own host's GPU wedged: without the first rule it reboots itself."""
    monkeypatch.setattr(controller_peers, "refusal", _even_its_own)
    report = _scripted(2, [S1, S2], [(60.0, "gpu-hang", S1)])
    assert any(v.split(": ", 1)[1].startswith("I15") for v in report.violations), report.violations


# -- what the simulation found in the controllers' order, and what closed it ---------------


def test_a_controller_woken_in_its_preflight_leaves_a_node_taken_over_alone() -> None:
    """Stopped in its preflight for longer than takeover_after, the first
    controller woke and cut a node the next one had cut meanwhile. Now a loop
    that stood still listens again before anything leaves (its guard, and the
    gate right before the off), and a claim outlives its silent controller: one
    cut, by whichever one the order leaves it to."""
    script: list[Scripted] = [(60.0, "freeze", S3), (65.6, "controller-pause-40", S1)]
    report = _scripted(4, [S1, S2], script, self_timed="always")
    assert report.violations == []
    assert len(report.cycles_by(S3)) == 1, report.cycles_by(S3)


def test_a_controller_stopped_after_its_cut_gets_no_second_cut_of_the_node() -> None:
    """Stopped right after its off landed, the first controller was silent for
    takeover_after while the node, its plug on again by its own timer, was still
    in POST, and the next one cut it again. Now its last claim stands
    claim_grace past takeover_after (controller/decide/colocation.py)."""
    script: list[Scripted] = [(60.0, "freeze", S3), (67.0, "controller-pause-40", S1)]
    report = _scripted(4, [S1, S2], script, self_timed="always", policy={"power_off_seconds": 30.0})
    assert report.violations == []
    assert report.cycles_by(S3) == [S1]
