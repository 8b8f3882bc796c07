"""The lab's partition scenarios (lab/stories/scenarios.py lists them): a
node's management link, its fabric link, or both, dark. Each node runs in a
network namespace of its own with both links (lab/netns.py, lab/fabric.py);
the controller reaches it over management only, its peers' pulses and its
rank's all-reduce go over the fabric.

What each asks of the controller is whether the node is dead or only out of
its reach (docs/design.md, "Peers"): both links dark looks exactly like a
freeze and is fenced once; management dark while the fabric is up is
`unreachable`, never fenced; the fabric dark stalls the TP group, which is
serving trouble, never a power matter.
"""

from __future__ import annotations

import time

from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import LabTimeout
from spark_watchdog.lab.stories.scenario_kit import (
    PERSON_ALERTS,
    QUIET_WATCH_S,
    Run,
    Verdicts,
    account,
    expect_no_incident,
    expect_no_power,
    expect_safe_restart,
    expect_verdict_holds,
    incidents_of,
    judge_incidents,
    pick_target,
    recovery_timeout,
    wait_resolved,
)

# How long the agents may take to see each other over the fabric, and a node
# to be healthy again once its link is back (a loaded machine).
PULSES_TIMEOUT_S = 30.0
HEALTHY_AGAIN_S = 60.0


def partition(run: Run) -> None:
    node = pick_target(run, None, 2)
    receiver = run.session.receiver
    assert receiver is not None
    boot_before = node.boot_id()
    run.inject("partition", node)
    # The head's engine stalls too (the node's rank is out of reach): its
    # serving incidents are not this scenario's; the node's fencing is.
    wait_resolved(
        run, 1, f"the controller to give up on {node.name} or hold it", node, "host_frozen"
    )
    run.session.wait_for(lambda: run.session.verdict(node) == "held", 10, f"{node.name} held")
    try:
        run.session.wait_for(lambda: bool(PERSON_ALERTS & set(receiver.kinds())), 10, "an alert")
    except LabTimeout:
        run.result.problems.append("no alert for a person (gave_up, held or ambiguous_power)")
    judge_incidents(run, "host_frozen")
    account(run)
    if "unreachable" in run.result.alerts:
        # The head's last steps before the cut can be newer than the node's last
        # agent answer the controller saw: a moment of `unreachable`, shorter
        # than freeze_after, which no alert may report as a broken path.
        run.result.problems.append(f"an unreachable alert for {node.name}, dark on both links")
    # While the node is frozen or held, the stalled group is its recovery's to
    # restart, or the person's who releases it: no serving incident of its own
    # (one would be deferred, or fail for want of its rank). Watched a while:
    # one would open within a poll of the hold.
    time.sleep(QUIET_WATCH_S / 2)
    frozen = [i for i in incidents_of(run) if i.kind == "host_frozen"]
    serving = [
        i.id
        for i in incidents_of(run)
        if i.kind.startswith("serving_") and frozen and i.opened_at > frozen[0].opened_at
    ]
    if serving:
        run.result.problems.append(
            f"serving incidents {serving} opened while {node.name} was frozen or held"
        )
    commands = [c for o, c in run.lab.outlet_commands(run.sets_before) if o == node.outlet]
    if commands != ["off", "on"]:
        run.result.problems.append(f"{node.name}: the PDU saw {commands}, expected one cycle")
    if node.boot_id() == boot_before:
        run.result.problems.append(f"{node.name} was not power-cycled (same boot id)")
    # The links come back: the node answers again, and stays held for a person.
    sets = len(run.lab.outlet_commands())
    run.lab.partition(node, cut=False)
    run.session.say(f"the partition heals: {node.name}'s links are up again")
    run.session.wait_for(lambda: run.lab.agent_state(node) is not None, 30, f"{node.name} answers")
    time.sleep(QUIET_WATCH_S / 2)
    verdict = run.session.verdict(node)
    run.result.notes.append(f"after the partition healed, {node.name} is {verdict}")
    if verdict != "held":
        run.result.problems.append(f"{node.name} is {verdict} after healing; held expected")
    if len(run.lab.outlet_commands()) != sets:
        run.result.problems.append("power commands after the partition healed")


def mgmt_partition(run: Run) -> None:
    node = pick_target(run, None, 2)
    verdicts = Verdicts(run, node)
    verdicts.poll()
    if not _pulsed_by_peers(run, node):
        return
    run.inject("mgmt-partition", node)
    try:
        expect_verdict_holds(run, verdicts, "unreachable", alert_within=10)
    finally:
        run.lab.partition(node, cut=False)
        run.session.say(f"{node.name}'s management link is up again")
    run.result.detected_after_s = verdicts.after_injection("unreachable")
    run.result.outcome = "unreachable" if "unreachable" in verdicts.seen else "not_detected"
    try:
        verdicts.wait(lambda v: v == "healthy", HEALTHY_AGAIN_S, f"{node.name} healthy again")
        run.result.recovered_after_s = time.time() - run.injected_at
    except LabTimeout as exc:
        run.result.problems.append(str(exc))
    verdicts.note()
    account(run)
    expect_no_power(run)
    expect_no_incident(run)
    verdicts.expect_no_fencing()
    if run.result.serving_restarts:
        run.result.problems.append(f"{run.result.serving_restarts} serving restart(s)")


def fabric_partition(run: Run) -> None:
    if run.lab.real_head is not None:
        run.result.outcome = "not_available"
        run.result.notes.append(
            "a real head steps alone: the lab's fabric does not carry its steps"
        )
        return
    node = pick_target(run, None, 2)
    watched = [Verdicts(run, each) for each in run.lab.nodes]
    if not _pulsed_by_peers(run, node):
        return
    run.inject("fabric-partition", node)

    def restarting() -> bool:
        for each in watched:
            each.poll()
        store = run.session.store()
        return any(
            "serving_restart_started" in [s.step for s in store.steps(i.id)]
            for i in incidents_of(run)
            if i.kind == "serving_stalled"
        )

    try:
        run.session.wait_for(restarting, recovery_timeout(run), "a serving restart for the stall")
        _seen_silent(run, node)
        # The restart cannot bring the head back while a rank is out of reach.
        deadline = time.monotonic() + QUIET_WATCH_S
        while time.monotonic() < deadline:
            restarting()
            time.sleep(0.2)
    finally:
        run.lab.partition(node, cut=False)
        run.session.say(f"{node.name}'s fabric link is up again")
    wait_resolved(run, 1, "the serving_stalled incident to be resolved", kind="serving_stalled")
    judge_incidents(run, "serving_stalled")
    try:
        run.session.wait_for(
            lambda: all(each.poll() == "healthy" for each in watched),
            HEALTHY_AGAIN_S,
            "every node healthy again",
        )
    except LabTimeout as exc:
        run.result.problems.append(str(exc))
    account(run)
    expect_no_power(run)
    for each in watched:
        each.note()
        each.expect_no_fencing()
        if "unreachable" in each.seen:
            run.result.problems.append(f"the controller called {each.node.name} unreachable")
    if run.result.outcome == "recovered":
        expect_safe_restart(run)


def _pulsed_by_peers(run: Run, node: LabNode) -> bool:
    """Every other node's agent sees ``node`` advance over the fabric before the
    fault: the second path is there. A problem (and False) if not."""

    def seen() -> bool:
        for other in run.lab.nodes:
            if other is node:
                continue
            peers = (run.lab.agent_state(other) or {}).get("peers") or {}
            said = peers.get(node.name) or {}
            if said.get("state") != "ok" or said.get("progress_ago_s") is None:
                return False
        return True

    try:
        run.session.wait_for(seen, PULSES_TIMEOUT_S, f"{node.name}'s peers to pulse it")
    except LabTimeout as exc:
        run.result.problems.append(f"no second path: {exc}")
        return False
    return True


def _seen_silent(run: Run, node: LabNode) -> None:
    """The head's agent no longer reaches ``node`` over the fabric: it went dark."""
    peers = (run.lab.agent_state(run.lab.head) or {}).get("peers") or {}
    state = (peers.get(node.name) or {}).get("state")
    run.result.notes.append(f"{run.lab.head.name}'s pulses of {node.name}: {state}")
    if state == "ok":
        run.result.problems.append(f"{run.lab.head.name} still pulses {node.name} over the fabric")
