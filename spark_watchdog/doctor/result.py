"""What one doctor check found, and the whole report."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal, get_args

Status = Literal["ok", "warn", "fail", "skip"]
STATUSES: tuple[Status, ...] = get_args(Status)


@dataclass(frozen=True)
class Finding:
    """A check's verdict before the runner gives it the check's name."""

    status: Status
    detail: str
    fix: str | None = None


def ok(detail: str) -> Finding:
    return Finding("ok", detail)


def warn(detail: str, fix: str) -> Finding:
    return Finding("warn", detail, fix)


def fail(detail: str, fix: str) -> Finding:
    return Finding("fail", detail, fix)


def skip(detail: str) -> Finding:
    return Finding("skip", detail)


@dataclass(frozen=True)
class Check:
    """One line of the report: ``name`` is stable (``node.gpu``, ``controller.power.spark-3.1``)."""

    name: str
    status: Status
    detail: str
    fix: str | None = None

    @classmethod
    def named(cls, name: str, finding: Finding) -> Check:
        return cls(name, finding.status, finding.detail, finding.fix)

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "status": self.status, "detail": self.detail, "fix": self.fix}


@dataclass(frozen=True)
class DoctorReport:
    checks: tuple[Check, ...]

    @property
    def failures(self) -> int:
        return sum(1 for c in self.checks if c.status == "fail")

    @property
    def warnings(self) -> int:
        return sum(1 for c in self.checks if c.status == "warn")

    @property
    def ok(self) -> bool:
        """Nothing failed; warnings are allowed."""
        return self.failures == 0

    def to_json(self) -> dict[str, Any]:
        return {
            "checks": [check.to_json() for check in self.checks],
            "ok": self.ok,
            "failures": self.failures,
            "warnings": self.warnings,
        }
