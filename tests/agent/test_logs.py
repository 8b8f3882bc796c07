"""Logging: <N> priority prefixes on stderr when not writing to the journal."""

from __future__ import annotations

import logging

import pytest

from spark_watchdog import logs


def test_priority_prefix_and_structured_fields(capsys: pytest.CaptureFixture[str]) -> None:
    logs.configure(logging.DEBUG, to_journal=False)
    log = logging.getLogger("spark_watchdog.test")
    log.warning("probe gpu: %s", "timeout", extra={"probe": "gpu", "state": "timeout"})
    log.error("bad")
    log.debug("detail")
    err = capsys.readouterr().err.splitlines()
    assert err == [
        "<4>spark_watchdog.test: probe gpu: timeout (PROBE=gpu STATE=timeout)",
        "<3>spark_watchdog.test: bad",
        "<7>spark_watchdog.test: detail",
    ]


def test_configure_is_idempotent() -> None:
    logs.configure(to_journal=False)
    logs.configure(to_journal=False)
    ours = [h for h in logging.getLogger().handlers if getattr(h, "_spark_watchdog", False)]
    assert len(ours) == 1


@pytest.mark.parametrize(
    ("level", "priority"), [(50, 2), (40, 3), (30, 4), (20, 6), (10, 7), (25, 4)]
)
def test_priority_mapping(level: int, priority: int) -> None:
    # 25 sits between INFO and WARNING: it takes INFO's priority... unless higher.
    expected = 6 if level == 25 else priority
    assert logs.priority_of(level) == expected


def test_text_from_outside_cannot_forge_a_log_line_or_drive_a_terminal(
    capsys: pytest.CaptureFixture[str],
) -> None:
    logs.configure(logging.DEBUG, to_journal=False)
    log = logging.getLogger("spark_watchdog.test")
    reason = "\x1b]0;pwned\x07\x1b[2J\r\n<3>spark_watchdog.controller: spark-2 healthy\u202e\x9b"
    log.warning("hold on %s: %s", "spark-2", reason, extra={"reason": reason})
    try:
        raise ValueError("bad\x1b[31m value")
    except ValueError:
        log.exception("failed")
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert lines[0] == (
        "<4>spark_watchdog.test: hold on spark-2: \\x1b]0;pwned\\x07\\x1b[2J\\r\\n"
        "<3>spark_watchdog.controller: spark-2 healthy\\u202e\\x9b (REASON=\\x1b]0;pwned"
        "\\x07\\x1b[2J\\r\\n<3>spark_watchdog.controller: spark-2 healthy\\u202e\\x9b)"
    )
    # A traceback keeps its own lines; the exception's text is escaped in it.
    assert lines[1] == "<3>spark_watchdog.test: failed"
    assert lines[2].startswith("Traceback") and "ValueError: bad\\x1b[31m value" in err
    assert not any(c in err for c in "\x1b\x07\r\u202e\x9b")
