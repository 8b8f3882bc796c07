"""The doctor report for people (one line per check) and for programs (JSON)."""

from __future__ import annotations

import json
from typing import TextIO

from spark_watchdog.doctor.result import DoctorReport

LABELS = {"ok": "OK", "warn": "WARN", "fail": "FAIL", "skip": "SKIP"}
_NAME_WIDTH_CAP = 40


def _plural(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


def render_text(report: DoctorReport) -> str:
    width = min(_NAME_WIDTH_CAP, max((len(c.name) for c in report.checks), default=0))
    lines: list[str] = []
    for check in report.checks:
        first, *rest = check.detail.splitlines() or [""]
        lines.append(f"{LABELS[check.status]:<5} {check.name:<{width}}  {first}")
        lines += [f"      {line.strip()}" for line in rest]
        if check.status in ("warn", "fail") and check.fix:
            lines.append(f"      fix: {check.fix}")
    skipped = sum(1 for c in report.checks if c.status == "skip")
    passed = sum(1 for c in report.checks if c.status == "ok")
    verdict = "nothing failed" if report.ok else "FAILED"
    lines.append(
        f"doctor: {_plural(len(report.checks), 'check')}: {passed} ok, "
        f"{_plural(report.warnings, 'warning')}, {_plural(report.failures, 'failure')}, "
        f"{skipped} skipped; {verdict}"
    )
    return "\n".join(lines)


def render_json(report: DoctorReport) -> str:
    return json.dumps(report.to_json(), indent=2)


class TerminalProgress:
    """``checking X ...`` on a terminal while a slow check runs; erased when it ends."""

    def __init__(self, stream: TextIO) -> None:
        self.stream = stream

    def begin(self, label: str) -> None:
        self.stream.write(f"checking {label} ...")
        self.stream.flush()

    def end(self) -> None:
        self.stream.write("\r\x1b[K")
        self.stream.flush()
