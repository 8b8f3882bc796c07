"""The lab's GPU fault scenarios: a wedged driver (NVML hangs while the host
answers), a clock that latches and survives a reboot, and the live ones
(docs/design.md, "Live GPU faults"): an Xid that ends a rank's CUDA context
while the host stays up, and one that is followed by a freeze whose journal
keeps nothing of it."""

from __future__ import annotations

import time

from spark_watchdog.lab.cluster import LAB_LATCH_OFF_S
from spark_watchdog.lab.hardware import gpu_standin, lab_sshd
from spark_watchdog.lab.node import LabNode
from spark_watchdog.lab.session import LabTimeout
from spark_watchdog.lab.stories.scenario_kit import (
    Run,
    account,
    expect_cycles,
    expect_no_power,
    expect_safe_restart,
    incidents_of,
    judge_incidents,
    pick_target,
    rank_stopped_on_the_node,
    recovery_timeout,
)

# The freeze comes at least this long after the Xid, as on a GB10 that goes down.
FREEZE_AFTER_XID_S = 3.0


def xid(run: Run) -> None:
    """Xid 31 on a worker: the agent stops its rank, the controller restarts serving."""
    node, fault = rank_stopped_on_the_node(run, "xid", "gpu_fault", "gpu_fault")
    result = run.result
    if not isinstance(fault, dict) or fault.get("xid") != 31:
        result.problems.append(f"no Xid 31 of {node.name} in the incident's evidence")
    elif fault.get("result") != "stopped":
        result.problems.append(f"{node.name}'s agent did not stop its rank: {fault.get('result')}")
    if result.outcome == "recovered":
        expect_safe_restart(run)


def xid_freeze(run: Run) -> None:
    """Xid 31 live, no kernel line in the journal, then the host freezes: the
    host_frozen incident names the live fault and how long before the silence."""
    node = pick_target(run, None, 2)
    gpu_standin.inject_xid(node.directory, 31)  # NVML's event only: the journal gets nothing
    run.begin("xid", node, f"{node.name}'s GPU reported Xid 31 live (no kernel line)")
    started = time.monotonic()

    def reported() -> bool:
        state = run.lab.agent_state(node) or {}
        return bool((state.get("gpu_faults") or {}).get("faults"))

    run.session.wait_for(reported, 60.0, f"{node.name}'s agent to report the Xid")
    # One controller poll at least, and never sooner than FREEZE_AFTER_XID_S.
    time.sleep(max(FREEZE_AFTER_XID_S - (time.monotonic() - started), 1.5))
    run.lab.freeze(node, with_kernel_lines=False)
    run.result.notes.append(f"frozen {time.monotonic() - started:.1f} s after the Xid")

    def settled() -> bool:
        frozen = [i for i in incidents_of(run) if i.kind == "host_frozen"]
        return bool(frozen) and all(i.status == "resolved" for i in frozen)

    run.session.wait_for(settled, recovery_timeout(run), f"{node.name}'s freeze to be recovered")
    judge_incidents(run, "host_frozen")
    account(run)
    result = run.result
    frozen = [i for i in incidents_of(run) if i.id in result.incident_ids]
    live = frozen[0].evidence.get("live_gpu_faults") if frozen else None
    said = [f.get("said", "") for f in live or [] if isinstance(f, dict) and f.get("xid") == 31]
    if not said or "before its agent went silent" not in said[0]:
        result.problems.append(f"the host_frozen incident does not name the live Xid: {live!r}")
    else:
        result.notes.append(f"evidence: {said[0]}")
    if result.outcome == "recovered":
        expect_cycles(run, [node])


def clock_latch(run: Run) -> None:
    """The GPU clock latches and survives a reboot: a clean halt, then one long cut."""
    node = pick_target(run, None, 1)
    if node.sshd_port is None:
        run.result.outcome = "not_available"
        run.result.notes.append(f"no sshd for the halt: {lab_sshd.unavailable()}")
        return
    boot_before = node.boot_id()
    run.inject("clock-latch", node)

    def settled() -> bool:
        frozen = [i for i in incidents_of(run) if i.kind == "host_frozen"]
        return bool(frozen) and all(i.status == "resolved" for i in frozen)

    run.session.wait_for(
        settled, recovery_timeout(run) + LAB_LATCH_OFF_S, f"{node.name}'s long cut to end"
    )
    judge_incidents(run, "host_frozen")
    account(run)
    expect_cycles(run, [node])  # the freeze incident's one cycle, before the latch's id joins
    _expect_one_latch_incident(run, node)
    result, store = run.result, run.session.store()
    for incident in incidents_of(run):
        if incident.kind != "host_frozen":
            continue
        held = [
            s.detail.get("off_seconds")
            for s in store.steps(incident.id)
            if s.step == "rung_started" and isinstance(s.detail, dict)
        ]
        if held != [LAB_LATCH_OFF_S]:
            result.problems.append(f"incident #{incident.id}: off holds {held}, not the long one")
    if result.alerts.count("clock_latched") != 1:
        result.problems.append(f"clock_latched alerted {result.alerts.count('clock_latched')}x")
    if node.boot_id() == boot_before:
        result.problems.append(f"{node.name} did not boot again (same boot id)")

    def cleared() -> bool:
        state = run.lab.agent_state(node) or {}
        return (state.get("gpu_clock_check") or {}).get("state") == "ok"

    try:
        run.session.wait_for(cleared, 60.0, f"{node.name}'s GPU to reach its clock again")
    except LabTimeout as exc:
        result.problems.append(str(exc))
    if result.outcome == "recovered":
        expect_safe_restart(run)


def _expect_one_latch_incident(run: Run, node: LabNode) -> None:
    """One clock_latched incident, its halt and hand-over to the power path
    recorded; the GPU readings that latched it go into the notes."""
    result, store = run.result, run.session.store()
    latched = [i for i in incidents_of(run) if i.kind == "clock_latched"]
    if len(latched) != 1:
        result.problems.append(f"{len(latched)} clock_latched incidents, expected 1")
        return
    result.incident_ids.insert(0, latched[0].id)
    steps = [s.step for s in store.steps(latched[0].id)]
    for step in ("halt_requested", "halt_sent", "handed_to_power_path"):
        if step not in steps:
            result.problems.append(f"incident #{latched[0].id}: no {step} step recorded")
    check = latched[0].evidence.get("gpu_clock_check") or {}
    result.notes.append(
        f"{node.name}: {check.get('busy_readings')} busy GPU readings, none above "
        f"{check.get('max_busy_sm_clock_mhz')} MHz (floor {check.get('floor_mhz')} MHz)"
    )


def gpu_hang(run: Run) -> None:
    """NVML hangs while the host answers: a serving restart, then a forced reboot over SSH."""
    node = pick_target(run, None, 1)
    if node.sshd_port is None:
        run.result.outcome = "not_available"
        run.result.notes.append(f"no sshd for the forced reboot: {lab_sshd.unavailable()}")
        return
    boot_before = node.boot_id()
    run.inject("gpu-hang", node)

    def settled() -> bool:
        wedged = [i for i in incidents_of(run) if i.kind == "gpu_wedged"]
        return bool(wedged) and all(i.status == "resolved" for i in wedged)

    run.session.wait_for(
        settled, recovery_timeout(run), f"the gpu_wedged incident of {node.name} to be resolved"
    )
    judge_incidents(run, "gpu_wedged")
    account(run)
    expect_no_power(run, allowed=("ssh_reboot",))
    result, store = run.result, run.session.store()
    for incident_id in result.incident_ids:
        steps = [s.step for s in store.steps(incident_id)]
        for step in ("serving_restart_done", "still_wedged", "reboot_requested", "new_boot_seen"):
            if step not in steps:
                result.problems.append(f"incident #{incident_id}: no {step} step recorded")
        actions = [(a.operation, a.result) for a in store.actions(incident_id=incident_id)]
        if actions != [("ssh_reboot", "verified")]:
            result.problems.append(f"incident #{incident_id}: actions {actions}")
    if node.forced_reboots != 1:
        result.problems.append(f"{node.name} was force-rebooted {node.forced_reboots} times")
    if node.boot_id() == boot_before:
        result.problems.append(f"{node.name} did not boot again (same boot id)")
    if result.outcome == "recovered":
        expect_safe_restart(run)
