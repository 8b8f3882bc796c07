"""Every store method that writes is marked ``@writes`` (history/core.py): the
simulation injects history failures and crash points into exactly those, so
a new write that is not marked would drop out of its crash enumeration."""

from __future__ import annotations

import inspect
import re

import pytest

from spark_watchdog.history.core import is_write
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.history.store import HistoryStore


def _public_methods(store: type) -> dict[str, str]:
    found: dict[str, str] = {}
    for name, member in inspect.getmembers(store, inspect.isfunction):
        if not name.startswith("_"):
            found[name] = inspect.getsource(member)
    return found


def _writers(methods: dict[str, str], marked: set[str]) -> set[str]:
    """Methods that open a write transaction, or call a marked method of the store."""
    calls = re.compile(r"self\.(\w+)\(")
    return {
        name
        for name, source in methods.items()
        if "self._writing(" in source or set(calls.findall(source)) & marked
    }


@pytest.mark.parametrize("store", [HistoryStore, PostgresHistoryStore])
def test_every_method_that_writes_is_marked_and_no_other(store: type) -> None:
    methods = _public_methods(store)
    marked = {name for name in methods if is_write(getattr(store, name))}
    assert _writers(methods, marked) == marked
    assert {"open_incident", "add_step", "record_action", "hold", "record_agent_boot"} <= marked


def test_an_unmarked_write_is_found() -> None:
    methods = {"add_note": "def add_note(self):\n    with self._writing('x') as c: ...\n"}
    assert _writers(methods, set()) == {"add_note"}
