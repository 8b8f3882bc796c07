"""sqlite3's errors as the history's own (``StoreError`` and its kinds), each
naming the file and the way out."""

from __future__ import annotations

import os
import sqlite3

from spark_watchdog.errors import (
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
)

# Primary result codes (extended codes carry them in the low byte).
SQLITE_BUSY, SQLITE_LOCKED, SQLITE_READONLY = 5, 6, 8
SQLITE_CORRUPT, SQLITE_FULL, SQLITE_CANTOPEN, SQLITE_NOTADB = 11, 13, 14, 26
# What a read-only open of a WAL file fails with when it cannot create the -shm file.
READ_ONLY_OPEN_FAILURES = (SQLITE_READONLY, SQLITE_CANTOPEN)

# Python 3.10 has no sqlite_errorcode on exceptions; fall back on SQLite's
# fixed English messages (sqlite3_errstr).
_BY_MESSAGE = (
    ("database is locked", SQLITE_BUSY),
    ("database table is locked", SQLITE_LOCKED),
    ("database or disk is full", SQLITE_FULL),
    ("readonly database", SQLITE_READONLY),
    ("database disk image is malformed", SQLITE_CORRUPT),
    ("file is not a database", SQLITE_NOTADB),
    ("unable to open database file", SQLITE_CANTOPEN),
)


def unreadable(path: str) -> str:
    """Why this user cannot read ``path``, and how to get to read it."""
    import grp
    import pwd

    try:
        info = os.stat(path)
    except OSError as exc:
        return f"cannot read history database {path}: {exc.strerror or exc}"
    try:
        owner = pwd.getpwuid(info.st_uid).pw_name
    except KeyError:
        owner = str(info.st_uid)
    try:
        group = grp.getgrgid(info.st_gid).gr_name
    except KeyError:
        group = str(info.st_gid)
    return (
        f"cannot read history database {path}: permission denied (mode "
        f"{info.st_mode & 0o777:04o}, owner {owner}, group {group}); read it as {owner} "
        f"or as a member of group {group}"
    )


def primary_code(exc: sqlite3.Error) -> int | None:
    code = getattr(exc, "sqlite_errorcode", None)
    if isinstance(code, int):
        return code & 0xFF
    text = str(exc)
    return next((c for needle, c in _BY_MESSAGE if needle in text), None)


def translate(exc: sqlite3.Error, path: str, doing: str, busy_timeout: float) -> StoreError:
    code = primary_code(exc)
    if code in (SQLITE_BUSY, SQLITE_LOCKED):
        return StoreLocked(
            path,
            f"history database {path} is locked by another process "
            f"(waited {busy_timeout:g} s while {doing}: {exc})",
        )
    if code == SQLITE_FULL:
        return StoreFull(
            path,
            f"history database {path}: disk full while {doing} ({exc}); "
            "free space on its filesystem",
        )
    if code == SQLITE_READONLY:
        return StoreReadOnly(
            path,
            f"history database {path} is read-only ({exc}, while {doing}); writing needs "
            "write access to the file and its directory (WAL keeps -wal and -shm files there)",
        )
    if code in (SQLITE_CORRUPT, SQLITE_NOTADB):
        return StoreCorrupt(
            path,
            f"history database {path} is corrupt ({exc}, while {doing}); "
            f"try `sqlite3 {path} .recover | sqlite3 {path}.recovered`, "
            "or move it aside to start a new history",
        )
    if code == SQLITE_CANTOPEN:
        return StoreError(
            path,
            f"cannot open history database {path} ({exc}); "
            "does its directory exist, and may this user write there?",
        )
    return StoreError(path, f"history database {path}: {doing} failed: {exc}")
