"""Where the freeze history is: an SQLite file, or a PostgreSQL database
(docs/design.md, "Freeze history")."""

from __future__ import annotations

from spark_watchdog.config.controller import ControllerConfig
from spark_watchdog.config.history_location import is_postgres_url
from spark_watchdog.history.postgres import PostgresHistoryStore
from spark_watchdog.history.store import HistoryStore


def open_history(
    location: str,
    *,
    password_file: str | None = None,
    read_only: bool = False,
) -> HistoryStore:
    """The history at ``location``: a ``postgresql://`` URL (its password in
    ``password_file``), else the path of an SQLite file."""
    if is_postgres_url(location):
        return PostgresHistoryStore(location, password_file=password_file, read_only=read_only)
    return HistoryStore(location, read_only=read_only)


def configured_history(config: ControllerConfig, *, read_only: bool = False) -> HistoryStore:
    """The history a controller config names (``history``, ``history_password_file``)."""
    return open_history(
        config.history, password_file=config.history_password_file, read_only=read_only
    )
