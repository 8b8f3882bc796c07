"""The lab's scenarios with the controllers on the nodes themselves, no third
machine (lab/colocated.py; docs/design.md, "Controllers on the Sparks", whose
case table names them). lab/stories/scenarios.py lists them with the others.

Each scenario runs on a settled lab of its size and order (every controller
acting, every node healthy), plays one row of the case table and judges it
from every controller's own history, from what each controller's
``/v1/status`` said meanwhile, and from the PDU: which controller acted, how
many commands reached each node's outlet, and whether the node came back.
It ends with the lab settled again, so that the next one can run on it.
Outcomes: ``recovered`` (a frozen node cycled once by the controller the order
names and back), ``no_power`` (nothing reached the PDU and no controller took
a node for frozen), and the shared ones (``not_detected``, ``timed_out``,
``not_available``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from spark_watchdog.lab.colocated import DEFAULT_ORDER
from spark_watchdog.lab.colocated_session import ColocatedLab
from spark_watchdog.lab.netns import netns_unavailable
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import LabTimeout
from spark_watchdog.lab.stories.colocated_kit import (
    RECOVERY_TIMEOUT_S,
    ColocatedRun,
    account,
    expect_no_power,
    expect_one_cycle_by,
    judge_recovery,
    off_after,
    settle,
)
from spark_watchdog.lab.stories.scenario_kit import QUIET_WATCH_S, ScenarioResult
from spark_watchdog.lab.timeline import Narrator

ALL_FOUR = ("spark-1", "spark-2", "spark-3", "spark-4")
# How long a no-power scenario keeps its fault in: past takeover_after and past
# freeze_after + fence_delay, so a controller that would act in another's
# place, or cut a node with a controller placed before it, would have.
WATCH_S = 18.0
PULSES_TIMEOUT_S = 30.0
NO_UNREACHABLE_ALERT = "no controller sent an unreachable alert for spark-2"


@dataclass(frozen=True)
class ColocatedScenario:
    name: str
    summary: str
    expected: tuple[str, ...]
    run: Callable[[ColocatedRun], None]
    nodes: int = 2
    controllers: tuple[str, ...] = DEFAULT_ORDER
    doc: str = ""

    @property
    def min_nodes(self) -> int:
        return self.nodes


# -- a frozen node, recovered by the controller the order names ---------------------


def _recovered_by(run: ColocatedRun, frozen: list[str], actor: str) -> None:
    """Freeze ``frozen`` at once; the controller on ``actor`` cycles each once,
    the nodes come back with new boots and serving comes back."""
    nodes = [run.node(name) for name in frozen]
    boots = {n.name: n.boot_id() for n in nodes}
    for node in nodes:
        run.inject("freeze", node)

    def recovered() -> bool:
        done = [i for i in run.incidents(actor, "host_frozen") if i.status == "resolved"]
        return all(any(n.name in i.nodes for i in done) for n in nodes)

    timeout = RECOVERY_TIMEOUT_S * len(nodes)
    run.wait(recovered, timeout, f"{actor}'s controller to recover {', '.join(frozen)}")
    judge_recovery(run, actor, nodes)
    for node in nodes:
        expect_one_cycle_by(run, actor, node)
        if node.boot_id() == boots[node.name]:
            run.result.problems.append(f"{node.name} did not boot again (same boot id)")
        if node.name not in run.claims.get(actor, set()):
            run.result.problems.append(f"{actor}'s /v1/status never claimed {node.name}")
        after = off_after(run, actor, node)
        if after is not None:
            run.result.notes.append(
                f"{actor}'s controller asked {node.name}'s off {after:.1f}s after the freeze"
            )
    settle(run, "the recovery")
    _note_serving(run)


def _fenced(run: ColocatedRun, actor: str, node: LabNode) -> None:
    """The controller on ``actor`` waited the fence delay before cutting a node
    whose controller is placed before it."""
    colocation = run.colo.colocation
    after = off_after(run, actor, node)
    freeze_after = float(colocation.config["detection"]["freeze_after"])
    least = freeze_after + colocation.fence_delay
    if after is not None and after < least:
        run.result.problems.append(
            f"{actor}'s controller cut {node.name} {after:.1f}s after the freeze, before "
            f"freeze_after + fence_delay ({least:g}s)"
        )


def _note_serving(run: ColocatedRun) -> None:
    for name in run.colo.placed:
        restarts = run.colo.store(name).serving_restarts(limit=100)
        done = [r for r in restarts if r.started_at >= run.since and r.result == "succeeded"]
        if done:
            profiles = ", ".join(r.profile for r in done)
            run.result.notes.append(f"serving restarted by {name}'s controller ({profiles})")


def _head_frozen(run: ColocatedRun) -> None:
    _recovered_by(run, ["spark-1"], "spark-2")
    _fenced(run, "spark-2", run.node("spark-1"))


def _second_frozen(run: ColocatedRun) -> None:
    _recovered_by(run, ["spark-2"], "spark-1")


def _controllers_frozen_all_four(run: ColocatedRun) -> None:
    _recovered_by(run, ["spark-1", "spark-2"], "spark-3")
    for name in ("spark-1", "spark-2"):
        _fenced(run, "spark-3", run.node(name))


# -- nothing may be sent ---------------------------------------------------------------


def _pulsed(run: ColocatedRun, node: LabNode) -> bool:
    """Every other agent sees ``node`` over the fabric: the second path is there."""

    def seen() -> bool:
        for other in run.lab.nodes:
            peers = (run.lab.agent_state(other) or {}).get("peers") or {}
            said = peers.get(node.name) or {}
            if other is not node and said.get("state") != "ok":
                return False
        return True

    try:
        run.colo.wait_for(seen, PULSES_TIMEOUT_S, f"{node.name}'s peers to pulse it")
    except LabTimeout as exc:
        run.result.problems.append(f"no second path: {exc}")
        return False
    return True


def _heard_throughout(run: ColocatedRun, pairs: list[tuple[str, str]]) -> None:
    """Each (listener, speaker): the listener heard the speaker within takeover_after
    every time the scenario asked."""
    limit = run.colo.colocation.takeover_after
    for listener, speaker in pairs:
        worst = run.heard_s_ago.get(listener, {}).get(speaker)
        run.result.notes.append(f"{listener}'s controller heard {speaker}'s at worst {worst}s ago")
        if worst is None or worst >= limit:
            run.result.problems.append(f"{listener}'s controller lost {speaker}'s ({worst}s)")


def _nothing_sent(run: ColocatedRun) -> None:
    expect_no_power(run)
    if not run.result.problems:
        run.result.outcome = "no_power"


def _fabric_cut(run: ColocatedRun) -> None:
    node = run.node("spark-2")
    if not _pulsed(run, node):
        return
    run.inject("fabric-partition", node)

    def restarting() -> bool:
        store = run.colo.store("spark-1")
        return any(r.started_at >= run.injected_at for r in store.serving_restarts(limit=20))

    try:
        run.wait(restarting, RECOVERY_TIMEOUT_S, "spark-1's controller to restart serving")
        run.watch(QUIET_WATCH_S)
    finally:
        run.lab.partition(node, cut=False, link="fabric")
        run.colo.say("the fabric cable is back")
    _heard_throughout(run, [("spark-1", "spark-2"), ("spark-2", "spark-1")])
    settle(run, "the cable came back")
    _nothing_sent(run)
    restarts = run.colo.store("spark-2").serving_restarts(limit=20)
    if any(r.started_at >= run.since for r in restarts):
        run.result.problems.append("spark-2's controller restarted serving too")


def _mgmt_cut(run: ColocatedRun) -> None:
    node = run.node("spark-2")
    if not _pulsed(run, node):
        return
    run.inject("mgmt-partition", node)
    try:
        run.wait(
            lambda: run.colo.verdict("spark-1", node.name) == "unreachable",
            30,
            "spark-1's controller to call spark-2 unreachable",
        )
        run.watch(WATCH_S)
        final = run.colo.verdict("spark-1", node.name)
        if final != "unreachable":
            run.result.problems.append(f"spark-2 is {final} to spark-1's controller at the end")
        _no_witness(run, node)
    finally:
        run.lab.partition(node, cut=False, link="management")
        run.colo.say("spark-2's management link is back")
    _heard_throughout(run, [("spark-1", "spark-2")])
    receiver = run.colo.receiver
    if receiver is not None and "unreachable" not in receiver.kinds()[run.alerts_before :]:
        # Known controller bug (not the lab's): the row's alert. Only a node's acting
        # controller alerts about it, and spark-1's does not act for a node whose own
        # controller it hears (colocation.refusal), so nobody tells of the cut link.
        run.result.notes.append(NO_UNREACHABLE_ALERT)
    settle(run, "the link came back")
    _nothing_sent(run)
    if run.result.outcome == "no_power":
        run.result.outcome = "unreachable"


def _no_witness(run: ColocatedRun, node: LabNode) -> None:
    """The controller on ``node``, cut off its management link, reaches no witness
    (asked over the fabric, from the other node: the lab machine is not on it)."""
    other = next(n for n in run.lab.nodes if n is not node)
    url = run.colo.colocation.urls(node)[-1]
    said = run.colo.placed[node.name].status_from(other, url) or {}
    witness = str(said.get("witness"))
    run.result.notes.append(f"{node.name}'s controller, asked over the fabric: witness {witness}")
    if not witness.startswith("unreachable"):
        run.result.problems.append(f"{node.name}'s controller says its witness is {witness}")


def _total_partition(run: ColocatedRun) -> None:
    for each in run.lab.nodes:
        run.lab.partition(each, link="management")
    run.lab.partition(run.node("spark-2"), link="fabric")
    run.begin(
        "total-partition",
        None,
        "the management switch is gone (every node's management link dark) and the fabric "
        "cable is pulled",
    )
    try:
        run.watch(WATCH_S)
    finally:
        for each in run.lab.nodes:
            run.lab.partition(each, cut=False)
        run.colo.say("the switch and the cable are back")
    settle(run, "the partition healed")
    _nothing_sent(run)


def _controllers_frozen(run: ColocatedRun) -> None:
    nodes = [run.node("spark-1"), run.node("spark-2")]
    for node in nodes:
        run.inject("freeze", node)
    try:
        run.watch(WATCH_S)
    finally:
        for node in nodes:
            run.lab.thaw(node)
        run.colo.say("spark-1 and spark-2 thawed (a person)")
    settle(run, "the thaw")
    _nothing_sent(run)


SCENARIOS: dict[str, ColocatedScenario] = {
    s.name: s
    for s in (
        ColocatedScenario(
            "colocated-head-freeze",
            "two Sparks, a controller on each: the head, the first controller's host, freezes",
            ("recovered",),
            _head_frozen,
            doc="Expected: spark-2's controller, after the fence delay (freeze_after + "
            "fence_delay), one verified cycle of spark-1's outlet; nothing from spark-1's "
            "controller (frozen with its host, then back with the boot); serving restarted.",
        ),
        ColocatedScenario(
            "colocated-freeze",
            "two Sparks, a controller on each: spark-2 freezes",
            ("recovered",),
            _second_frozen,
            doc="Expected: spark-1's controller at once, one verified cycle of spark-2's outlet, "
            "a new boot; serving restarted.",
        ),
        ColocatedScenario(
            "colocated-fabric-cut",
            "two Sparks, a controller on each: the fabric cable is pulled",
            ("no_power",),
            _fabric_cut,
            doc="Expected: the controllers hear each other over management; spark-1's restarts "
            "serving (which cannot come up without the cable), spark-2's does not; no power "
            "command, no node taken for frozen; when the cable is back, serving comes back.",
        ),
        ColocatedScenario(
            "colocated-mgmt-cut",
            "two Sparks, a controller on each: spark-2's management link is cut",
            ("unreachable",),
            _mgmt_cut,
            doc="Expected: spark-1's agent sees spark-2 over the fabric, so spark-1's controller "
            "calls it unreachable and keeps hearing spark-2's controller over the fabric; "
            "spark-2's controller reaches no witness; no power command.",
        ),
        ColocatedScenario(
            "colocated-partition",
            "two Sparks, a controller on each: the management switch is gone and the fabric "
            "cable pulled",
            ("no_power",),
            _total_partition,
            doc="Expected: neither controller reaches a witness or the PDU: nothing is sent; "
            "once both links are back every node is healthy again.",
        ),
        ColocatedScenario(
            "colocated-both-frozen",
            "four Sparks, controllers on spark-1 and spark-2: both their hosts freeze",
            ("no_power",),
            _controllers_frozen,
            nodes=4,
            doc="Expected: nothing is left to act: no power command. Thawed by a person, both "
            "controllers listen again and every node is healthy.",
        ),
        ColocatedScenario(
            "colocated-both-frozen-all",
            "four Sparks, a controller on each: spark-1 and spark-2 freeze",
            ("recovered",),
            _controllers_frozen_all_four,
            nodes=4,
            controllers=ALL_FOUR,
            doc="Expected: spark-3's controller, once both have been silent takeover_after, "
            "cycles each once, one after the other; spark-4's does nothing.",
        ),
    )
}


def play(colo: ColocatedLab, name: str) -> ScenarioResult:
    """Run scenario ``name`` on a running lab of its size and order."""
    scenario = SCENARIOS[name]
    if colo.nodes != scenario.nodes or colo.controllers != scenario.controllers:
        raise ValueError(
            f"scenario {name} needs {scenario.nodes} nodes with controllers on "
            f"{', '.join(scenario.controllers)}"
        )
    result = ScenarioResult(name, "timed_out", scenario.expected, lab_id=colo.lab.lab_id)
    run = ColocatedRun(colo, result)
    try:
        colo.wait_ready()
        run.mark()
        scenario.run(run)
    except LabTimeout as exc:
        result.outcome = "timed_out"
        result.problems.append(str(exc))
    try:
        account(run)
    except Exception as exc:  # the lab may be half gone: report what we can
        result.notes.append(f"could not read the histories: {exc}")
    return result


def run_colocated(name: str, *, workdir: Path, narrator: Narrator | None = None) -> ScenarioResult:
    """Start a lab of the scenario's size and order, run it, stop the lab."""
    scenario = SCENARIOS[name]
    unavailable = netns_unavailable()
    if unavailable is not None:
        return ScenarioResult(name, "timed_out", scenario.expected).not_available(unavailable)
    colo = ColocatedLab(
        workdir, nodes=scenario.nodes, controllers=scenario.controllers, narrator=narrator
    )
    with colo:
        return play(colo, name)
