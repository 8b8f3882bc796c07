"""The journal writer: export format, and real files that journalctl reads back."""

from __future__ import annotations

import json
import os
import struct
import subprocess
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_watchdog.lab.hardware.journal_writer import (
    JOURNAL_REMOTE_PATHS,
    JOURNAL_START,
    JOURNAL_STOP,
    LOGIND_SHUTDOWN,
    BootTimeline,
    Ending,
    Fault,
    JournalEntry,
    JournalWriteError,
    boot_entries,
    write_boot,
    write_journal,
)

T0 = datetime(2026, 5, 1, 10, 0, tzinfo=timezone.utc)
BOOT = "0123456789abcdef0123456789abcdef"

needs_journal_remote = pytest.mark.skipif(
    not any(os.access(p, os.X_OK) for p in JOURNAL_REMOTE_PATHS),
    reason="systemd-journal-remote not installed (Debian package systemd-journal-remote)",
)


def _journalctl(*args: str) -> list[dict[str, object]]:
    done = subprocess.run(
        ["journalctl", "--no-pager", "-o", "json", *args],
        capture_output=True,
        text=True,
        check=True,
    )
    return [json.loads(line) for line in done.stdout.splitlines()]


def test_plain_fields_use_the_text_form() -> None:
    entry = JournalEntry(T0, 5, BOOT, "hello", identifier="kernel")
    lines = entry.export().decode().split("\n")
    assert lines[0] == f"__REALTIME_TIMESTAMP={1777629600 * 1_000_000}"
    assert lines[1] == "__MONOTONIC_TIMESTAMP=5"
    assert f"_BOOT_ID={BOOT}" in lines
    assert "MESSAGE=hello" in lines
    assert entry.export().endswith(b"\n\n")


@pytest.mark.parametrize("value", ["two\nlines", b"\xff\xfe not utf-8", "nul\x00inside"])
def test_awkward_values_use_the_length_prefixed_form(value: str | bytes) -> None:
    raw = value.encode() if isinstance(value, str) else value
    exported = JournalEntry(T0, 5, BOOT, value).export()
    assert b"MESSAGE\n" + struct.pack("<Q", len(raw)) + raw + b"\n" in exported
    assert b"MESSAGE=" not in exported


def test_optional_fields_can_be_left_out() -> None:
    exported = JournalEntry(T0, 5, None, None, priority=None).export()
    assert b"_BOOT_ID" not in exported
    assert b"MESSAGE" not in exported
    assert b"PRIORITY" not in exported


def test_entries_are_validated() -> None:
    with pytest.raises(ValueError, match="timezone-aware"):
        JournalEntry(datetime(2026, 5, 1), 0, BOOT, "x")
    with pytest.raises(ValueError, match="boot_id"):
        JournalEntry(T0, 0, "not-hex", "x")
    with pytest.raises(ValueError, match="field name"):
        JournalEntry(T0, 0, BOOT, "x", extra=(("lower", "x"),))


def test_missing_tool_names_the_package(tmp_path: Path) -> None:
    with pytest.raises(JournalWriteError, match="Debian package systemd-journal-remote"):
        write_journal(
            tmp_path / "x.journal",
            boot_entries(BOOT, T0),
            journal_remote=tmp_path / "no-such-tool",
        )


def test_output_name_must_end_in_journal(tmp_path: Path) -> None:
    with pytest.raises(JournalWriteError, match=r"must end in \.journal"):
        write_journal(tmp_path / "x.log", boot_entries(BOOT, T0))


def test_a_clean_boot_has_the_shutdown_lines_in_order() -> None:
    entries = boot_entries(BOOT, T0)
    ids = [e.message_id for e in entries if e.message_id]
    assert ids == [JOURNAL_START, LOGIND_SHUTDOWN, JOURNAL_STOP]
    assert entries[-1].message == "Journal stopped"
    times = [e.realtime for e in entries]
    assert times == sorted(times) and len(set(times)) == len(times)
    assert [e.monotonic_usec for e in entries] == sorted(e.monotonic_usec for e in entries)


def test_a_power_loss_just_stops_after_the_faults() -> None:
    entries = boot_entries(
        BOOT, T0, faults=[Fault.XID_31, Fault.NV_ERR_NO_MEMORY], ending=Ending.POWER_LOSS
    )
    assert all(e.message_id != JOURNAL_STOP for e in entries)
    last = entries[-1]
    assert isinstance(last.message, str) and "_memdescAllocInternal" in last.message
    assert last.transport == "kernel"


@pytest.mark.integration
@needs_journal_remote
def test_journalctl_reads_what_was_written(tmp_path: Path) -> None:
    entries = boot_entries(BOOT, T0, faults=[Fault.XID_31], after_unclean=True)
    timeline = BootTimeline(BOOT, T0 + timedelta(minutes=5))
    timeline.kernel("two\nlines")
    path = write_journal(tmp_path / "one.journal", [*entries, *timeline.entries])
    read = _journalctl(f"--file={path}")
    assert len(read) == len(entries) + 1
    assert {r["_BOOT_ID"] for r in read} == {BOOT}
    assert read[0]["__REALTIME_TIMESTAMP"] == str(1777629601 * 1_000_000)
    stop = read[len(entries) - 1]
    assert (stop["MESSAGE"], stop["MESSAGE_ID"], stop["_TRANSPORT"]) == (
        "Journal stopped",
        JOURNAL_STOP,
        "driver",
    )
    assert any("uncleanly shut down" in str(r.get("MESSAGE")) for r in read)
    assert read[-1]["MESSAGE"] == "two\nlines"


@pytest.mark.integration
@needs_journal_remote
def test_boots_in_one_directory_merge_and_a_timeline_appends(tmp_path: Path) -> None:
    write_boot(tmp_path, boot_entries("a" * 32, T0))
    live = BootTimeline("b" * 32, T0 + timedelta(hours=1))
    live.kernel("first")
    first = live.write(tmp_path)
    assert live.write(tmp_path) is None  # nothing new
    live.kernel("second")
    assert live.write(tmp_path) == first
    assert first is not None and first.name == f"boot-{'b' * 32}.journal"
    read = _journalctl(f"--directory={tmp_path}")
    assert [r["MESSAGE"] for r in read if r["_BOOT_ID"] == "b" * 32] == ["first", "second"]
    listed = subprocess.run(
        ["journalctl", "--no-pager", f"--directory={tmp_path}", "--list-boots"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "a" * 32 in listed and "b" * 32 in listed


def test_write_boot_refuses_mixed_boots(tmp_path: Path) -> None:
    mixed = [*boot_entries("a" * 32, T0), *boot_entries("b" * 32, T0)]
    with pytest.raises(JournalWriteError, match="one boot"):
        write_boot(tmp_path, mixed)
