"""One incident log: the controller opens, steps and resolves incidents only
through controller/record/incident_log.py (docs/architecture.md)."""

from __future__ import annotations

import re
from pathlib import Path

CONTROLLER = Path(__file__).resolve().parents[2] / "spark_watchdog" / "controller"
WRITES = re.compile(r"\bstore\.(open_incident|add_step|resolve_incident)\b")
# The power path's write-ahead hook too writes through the incident log (a
# step that lets nothing out fenced for recording only: ``through``).
ALLOWED = {
    "incident_log.py": {"open_incident", "add_step", "resolve_incident"},
}


def test_incidents_are_written_through_the_incident_log_only() -> None:
    found = {}
    for module in sorted(CONTROLLER.glob("*.py")):
        used = set(WRITES.findall(module.read_text()))
        extra = used - ALLOWED.get(module.name, set())
        if extra:
            found[module.name] = sorted(extra)
    assert found == {}, f"incident writes outside controller/record/incident_log.py: {found}"


def test_the_check_finds_a_direct_write() -> None:
    assert WRITES.findall("await ledger.write(ledger.store.resolve_incident, 3, 'gave_up')")
