"""What answers a kill of a rank (its memory guard's, a GPU fault's): a serving
restart that began after it, or an incident an earlier controller already
opened for it (docs/design.md, "Memory guard")."""

from __future__ import annotations

from collections.abc import Iterable

from spark_watchdog.controller.decide.detector import Verdict
from spark_watchdog.controller.look.node_watch import NodeWatch
from spark_watchdog.controller.look.rank_kills import FRESH_S
from spark_watchdog.controller.record.ledger import HistoryUnwritable, Ledger

# What an incident's evidence calls the kill it answers, by the verdict.
KILL_EVIDENCE = {Verdict.MEMORY_EXHAUSTED: "memory_guard", Verdict.GPU_FAULT: "gpu_fault"}


def answer_kills_before(watches: Iterable[NodeWatch], started_wall: float) -> None:
    """A serving restart that began after a kill answers it, whatever began it."""
    for watch in watches:
        for kills in (watch.memory_kills, watch.gpu_kills):
            at = None if kills.pending is None else kills.pending.get("at_unix")
            if isinstance(at, (int, float)) and at <= started_wall:
                kills.answer()


async def kill_recorded(ledger: Ledger, watch: NodeWatch) -> bool | None:
    """A kill of the rank an earlier controller already opened an incident for:
    the same kill (agent start, id, time) in the evidence of an incident of the
    verdict's kind. Looked up over a wide window: the node's clock and ours may
    differ. None: the history cannot be read now."""
    verdict = watch.finding.verdict
    kills = watch.kills_of(verdict)
    kill = None if kills is None else kills.pending
    at = None if kill is None else kill.get("at_unix")
    if kills is None or kill is None or not isinstance(at, (int, float)):
        return False
    try:
        found = await ledger.read(
            ledger.store.list_incidents,
            node=watch.name,
            kind=verdict.value,
            since=float(at) - 4 * FRESH_S,
            limit=20,
        )
    except HistoryUnwritable:
        return None  # not now: the next tick asks again
    same = ("agent_started_at", "id", "at_unix")
    for incident in found:
        recorded = incident.evidence.get(KILL_EVIDENCE[verdict])
        if isinstance(recorded, dict) and all(recorded.get(k) == kill.get(k) for k in same):
            return True
    return False
