"""journald-friendly logging.

Under systemd with systemd-python installed, records go to the journal with
structured fields (``NODE=``, ``PROBE=``, ``STATE=`` ... from ``extra``), so
``journalctl -u spark-watchdog-agent PROBE=gpu`` works. Otherwise each line on
stderr starts with a ``<N>`` syslog priority prefix, which journald's stdout
transport turns into the entry's PRIORITY (sd-daemon(3)).
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from typing import Any

from spark_watchdog.terminal import escape, escape_lines

# syslog priorities (sd-daemon(3)): logging level → <N>.
_PRIORITY = {
    logging.CRITICAL: 2,
    logging.ERROR: 3,
    logging.WARNING: 4,
    logging.INFO: 6,
    logging.DEBUG: 7,
}

# Attributes every LogRecord has; anything else came in through ``extra=``.
_STANDARD_ATTRS = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime"}


def priority_of(levelno: int) -> int:
    for level in sorted(_PRIORITY, reverse=True):
        if levelno >= level:
            return _PRIORITY[level]
    return 7


def structured_fields(record: logging.LogRecord) -> dict[str, Any]:
    """The ``extra=`` fields of a record, upper-cased for journald."""
    return {k.upper(): v for k, v in vars(record).items() if k not in _STANDARD_ATTRS}


class PriorityPrefixFormatter(logging.Formatter):
    """``<6>probe gpu: state timeout (PROBE=gpu STATE=timeout)``.

    A message is one line: text from outside in it (a node name, a device's
    answer, a reason typed on the page) has its controls, bidi overrides and
    line breaks written visibly (spark_watchdog/terminal.py), so it can
    neither forge a line of its own nor drive the terminal that reads the
    log. A traceback keeps its own line breaks."""

    def formatMessage(self, record: logging.LogRecord) -> str:
        return escape(super().formatMessage(record))

    def format(self, record: logging.LogRecord) -> str:
        text = escape_lines(super().format(record))
        fields = structured_fields(record)
        if fields:
            text += " (" + " ".join(f"{k}={escape(v)}" for k, v in sorted(fields.items())) + ")"
        return f"<{priority_of(record.levelno)}>{text}"


def _journal_handler() -> logging.Handler | None:
    # JOURNAL_STREAM is set by systemd when stderr is connected to the journal
    # (systemd.exec(5)); only then is sending to journald the right target.
    if not os.environ.get("JOURNAL_STREAM"):
        return None
    try:
        journal = importlib.import_module("systemd.journal")
    except ImportError:
        return None
    handler: logging.Handler = journal.JournalHandler(SYSLOG_IDENTIFIER="spark-watchdog")
    return handler


def configure(level: int = logging.INFO, *, to_journal: bool = True) -> None:
    """Install one handler on the root logger (idempotent)."""
    root = logging.getLogger()
    for old in list(root.handlers):
        if getattr(old, "_spark_watchdog", False):
            root.removeHandler(old)
    handler = _journal_handler() if to_journal else None
    if handler is None:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(PriorityPrefixFormatter("%(name)s: %(message)s"))
    handler._spark_watchdog = True  # type: ignore[attr-defined]
    root.addHandler(handler)
    root.setLevel(level)
