"""The verdict table (spark_watchdog/verdicts.py) is the one list of verdicts.

The detector's ``Verdict`` and the table name the same verdicts; a row
cannot leave a column out; and every list the product keeps of verdicts is
the table's, so a new verdict needs a row, the detector's rule and the docs.
"""

from __future__ import annotations

import ast
import dataclasses
from pathlib import Path

import pytest

from spark_watchdog import verdicts
from spark_watchdog.controller.decide import planner
from spark_watchdog.controller.decide.detector import Verdict, verdicts_where
from spark_watchdog.controller.page import status_api
from spark_watchdog.history import records
from spark_watchdog.verdicts import TABLE, Answer, Colour, Severity, VerdictRow

ROOT = Path(__file__).resolve().parents[2]


def _row(**changes: object) -> dict[str, object]:
    fields = {f.name: getattr(TABLE[0], f.name) for f in dataclasses.fields(VerdictRow)}
    fields.update(changes)
    return fields


def test_the_detector_and_the_table_name_the_same_verdicts() -> None:
    assert [v.value for v in Verdict] == list(verdicts.DETECTED)


def test_a_verdict_without_a_row_has_no_answer() -> None:
    with pytest.raises(KeyError):
        verdicts.row("brand_new")


def test_no_column_has_a_default() -> None:
    for field in dataclasses.fields(VerdictRow):
        assert field.default is dataclasses.MISSING, field.name
        assert field.default_factory is dataclasses.MISSING, field.name


@pytest.mark.parametrize("column", [f.name for f in dataclasses.fields(VerdictRow)])
def test_a_row_missing_a_column_is_refused(column: str) -> None:
    fields = _row(name="brand_new")
    del fields[column]
    with pytest.raises(TypeError, match=column):
        VerdictRow(**fields)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "changes",
    [
        {"name": "Brand New"},
        {"words": ""},
        {"words": "no full stop"},
        {"words": "Two lines.\nOf words."},
        {"words": "A sentence far too long for the one short sentence an operator reads " * 2},
        {"node_state": True, "answer": Answer.POWER},
        {"node_state": True, "incident": True},
    ],
)
def test_a_row_that_says_something_wrong_is_refused(changes: dict[str, object]) -> None:
    with pytest.raises(ValueError):
        VerdictRow(**_row(**changes))  # type: ignore[arg-type]


def test_every_name_is_in_the_table_once() -> None:
    names = [r.name for r in TABLE]
    assert len(names) == len(set(names))
    assert {r.name for r in TABLE if r.node_state} == {"booting", "held"}


def test_the_controller_s_lists_are_the_table_s() -> None:
    assert tuple(r.name for r in TABLE if r.metric) == status_api.VERDICTS
    assert {v.value for v in planner.ACTED_ON} == {
        r.name for r in TABLE if r.answer is not Answer.NOTHING
    }
    assert {v.value for v in planner.SERVING_FAULTS} == {
        r.name for r in TABLE if r.answer is Answer.RESTART_SERVING
    }
    assert set(verdicts.INCIDENT_KINDS) <= set(records.KNOWN_INCIDENT_KINDS)


def test_what_the_controller_does_about_each_verdict() -> None:
    """The table's answers are the ones docs/design.md, "Verdicts" gives."""
    answers = {r.name: r.answer for r in TABLE if not r.node_state}
    assert answers == {
        "healthy": Answer.NOTHING,
        "pending": Answer.NOTHING,
        "serving_stalled": Answer.RESTART_SERVING,
        "serving_dead": Answer.RESTART_SERVING,
        "memory_exhausted": Answer.RESTART_SERVING,
        "gpu_wedged": Answer.UNWEDGE,
        "gpu_fault": Answer.RESTART_SERVING,
        "agent_down": Answer.RESTART_AGENT,
        "host_frozen": Answer.POWER,
        "isolated": Answer.NOTHING,
        "rebooting": Answer.NOTHING,
        "unobservable": Answer.NOTHING,
        "unreachable": Answer.NOTHING,
    }
    # The serving restart budget counts the wedged ladder's restart too.
    assert verdicts.SERVING_FAULT_KINDS == (
        "serving_stalled",
        "serving_dead",
        "memory_exhausted",
        "gpu_wedged",
        "gpu_fault",
    )
    assert verdicts_where(lambda r: r.answer is Answer.POWER) == {Verdict.HOST_FROZEN}


def test_only_a_fine_verdict_lets_status_exit_0() -> None:
    assert {"healthy", "pending"} == verdicts.FINE
    assert {r.name for r in TABLE if r.severity is Severity.BAD} >= {"host_frozen", "held"}


def test_the_page_gets_a_colour_and_words_for_every_verdict() -> None:
    page = verdicts.for_the_page()
    assert list(page) == [r.name for r in TABLE]
    assert page["healthy"]["colour"] == Colour.OK.value
    assert page["held"]["colour"] == Colour.HELD.value
    assert {p["colour"] for p in page.values()} <= {c.value for c in Colour}
    css = (ROOT / "spark_watchdog" / "controller" / "page" / "web" / "page.css").read_text()
    for colour in Colour:
        assert f".v-{colour.value} " in css, colour  # page.js draws the card as v-<colour>
        assert f"--{colour.value}:" in css, colour


def test_the_table_imports_nothing_of_ours() -> None:
    """History, the CLI and the lab read it: it stands below all of them."""
    tree = ast.parse((ROOT / "spark_watchdog" / "verdicts.py").read_text())
    imported = [
        n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module is not None
    ] + [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("spark_watchdog")]
