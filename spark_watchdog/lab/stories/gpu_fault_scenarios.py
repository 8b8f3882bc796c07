"""The lab's live GPU fault scenarios (docs/design.md, "Live GPU faults"): an
Xid that ends a rank's CUDA context while the host stays up, and one that is
followed by a freeze whose journal keeps nothing of it."""

from __future__ import annotations

import time

from spark_watchdog.lab.hardware import gpu_standin
from spark_watchdog.lab.stories.scenario_kit import (
    Run,
    account,
    expect_cycles,
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
