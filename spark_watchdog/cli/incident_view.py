"""How ``show`` and ``history`` print an incident: times, durations, the
timeline with its evidence, actions, serving restarts and boots. Every value
from a history (this controller's or another's) is escaped as it is printed.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from spark_watchdog.cli import flight_view
from spark_watchdog.history.records import IncidentTimeline, iso_utc, readable_number, utc_time
from spark_watchdog.steps import StepName
from spark_watchdog.terminal import escape
from spark_watchdog.xid import describe


def short_time(ts: float | None) -> str:
    """A time for a table; "-" when there is none or the row's is no time."""
    when = utc_time(ts)
    return "-" if when is None else when.strftime("%Y-%m-%d %H:%M:%S")


def seconds(value: float | None) -> str:
    number = readable_number(value)
    return "-" if number is None else f"{number:.1f}s"


def _offset(at: float, base: float) -> str:
    """A step's time from the incident's detection, as ``t=...``; "?" when either is unknown."""
    start, then = utc_time(base), utc_time(at)
    if start is None or then is None:
        return "t=       ?"
    return f"t={(then - start).total_seconds():+8.1f}s"


def table(rows: Sequence[tuple[str, ...]]) -> str:
    rows = [tuple(escape(c) for c in r) for r in rows]
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows
    )


def print_timeline(timeline: IncidentTimeline, title: str) -> None:
    """One incident as ``show`` prints it; ``title`` names it: ``#7``, or
    ``spark-2#7 (by spark-2)`` where controllers run on the Sparks."""
    i = timeline.incident
    print(
        f"incident {escape(title)}: {escape(i.kind)} on {escape(', '.join(i.nodes))}"
        + (" (dry run)" if i.dry_run else "")
    )
    detected = iso_utc(i.detected_at) or "unknown"
    print(f"  detected  {detected}  (time to detect {seconds(i.time_to_detect_s)})")
    print(
        f"  status    {escape(i.resolution or i.status)}  "
        f"(time to recover {seconds(i.time_to_recover_s)})"
    )
    reasons = i.evidence.get("reasons") if isinstance(i.evidence, Mapping) else None
    if isinstance(reasons, list) and reasons:
        print(f"  evidence  {'; '.join(map(escape, reasons))}")
    for said in _live_faults(i.evidence):
        print(f"  gpu fault {escape(said)}  (live: the agent's report, before the silence)")
    recorder = i.evidence.get("flight_recorder") if isinstance(i.evidence, Mapping) else None
    detected_at = readable_number(i.detected_at)
    if isinstance(recorder, dict) and detected_at is not None:
        for line in flight_view.render(recorder, detected_at):
            print(escape(line))
    print("timeline:")
    for step in timeline.steps:
        offset = _offset(step.at, i.detected_at)
        if step.step == StepName.STACKS_RECORDED:
            print(f"  {offset}  {escape(step.step)}")
            for line in _stack_lines(step.detail):
                print(line)
            continue
        detail = ", ".join(f"{k}={v}" for k, v in step.detail.items() if v not in (None, "", {}))
        who = f"{step.node} " if step.node else ""
        line = f"{who}{step.step}" + (f"  ({detail})" if detail else "")
        print(f"  {offset}  {escape(line)}")
    print_outcome(timeline)


def print_outcome(timeline: IncidentTimeline) -> None:
    """An incident's power actions, serving restarts and boots, in words."""
    if timeline.actions:
        print("actions:")
        for a in timeline.actions:
            verified = f", verified {short_time(a.verified_at)}" if a.verified_at else ""
            error = f", {a.error}" if a.error else ""
            said = f"{a.operation} {a.node} via {a.device}: {a.result}"
            print(f"  {escape(said)}{verified}{escape(error)}")
    for r in timeline.serving_restarts:
        print(
            f"serving restart ({escape(r.profile)}): {escape(r.result)} in {seconds(r.duration_s)}"
        )
    for b in timeline.boots:
        end = {True: "clean", False: "UNCLEAN", None: "current"}[b.clean_shutdown]
        span = f"{short_time(b.first_entry)} → {short_time(b.last_entry)}"
        print(f"boot {escape(str(b.boot_id)[:12])} of {escape(b.node)}: {span} {end}")
        for kind, lines in b.evidence.items() if isinstance(b.evidence, Mapping) else ():
            for line in (lines if isinstance(lines, list) else [])[:2]:
                text = line.get("message") if isinstance(line, Mapping) else line
                shown = escape(str(text)[:160])
                print(f"  journal {escape(kind)}: {shown}  (from the journal, read after)")


def _live_faults(evidence: Any) -> list[str]:
    """The GPU faults an incident keeps from the agent's live reports, in words."""
    if not isinstance(evidence, Mapping):
        return []
    faults = evidence.get("live_gpu_faults")
    listed = faults if isinstance(faults, list) else []
    one = evidence.get("gpu_fault")
    if isinstance(one, Mapping) and not listed:
        xid, gpu = one.get("xid"), one.get("gpu")
        at = iso_utc(one.get("at_unix"))
        when = "" if at is None else f" at {at}"
        where = f" on GPU {gpu}" if isinstance(gpu, int) else ""
        return [f"{describe(xid) if isinstance(xid, int) else 'a GPU fault'}{where}{when}"]
    return [str(f["said"]) for f in listed if isinstance(f, Mapping) and "said" in f]


def _stack_lines(detail: Mapping[str, Any], frames: int = 6) -> list[str]:
    """Each node's processes and their innermost frames (--json has all of them)."""
    lines: list[str] = []
    nodes = detail.get("nodes")
    for node, record in nodes.items() if isinstance(nodes, Mapping) else ():
        if not isinstance(record, Mapping):
            continue
        note = f" ({record['note']})" if record.get("note") else ""
        lines.append(f"      {escape(f'{node}{note}')}")
        for entry in record.get("processes") or []:
            if not isinstance(entry, Mapping):
                continue
            lines.append(f"        pid {escape(entry.get('pid'))}: {escape(entry.get('command'))}")
            stack = entry.get("stack")
            body = str(stack).splitlines()[:frames] if stack else [f"({entry.get('error')})"]
            lines.extend(f"          {escape(line.strip())}" for line in body if line.strip())
    return lines
