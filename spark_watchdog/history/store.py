"""The controller's freeze history: one SQLite file (``history.core``), with the
queries of each table in a module of its own; the same tables in PostgreSQL
are ``history.postgres``, and ``history.locate`` opens either."""

from __future__ import annotations

from spark_watchdog.history.actions import ActionTables
from spark_watchdog.history.boots import BootTables
from spark_watchdog.history.holds import HoldTables
from spark_watchdog.history.incidents import IncidentTables
from spark_watchdog.history.serving import ServingRestartTables

__all__ = ["HistoryStore"]


class HistoryStore(IncidentTables, ActionTables, BootTables, ServingRestartTables, HoldTables):
    """The freeze history. Open with a path; ``close()`` (or ``with``) when done.

    ``read_only``: for the CLI's read commands. The file must exist and be at
    the current schema; nothing is created or migrated. ``clock`` supplies
    default times (UNIX seconds); every write also takes an explicit ``at``.
    ``migrations`` is for tests of future schema versions. ``":memory:"``
    works (no WAL, one store only) for tests of code that uses a store.
    """
