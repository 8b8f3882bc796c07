"""Journal files whose header holds values no healthy file has, read for real.

Found by fuzzing (bench/fuzz.py, target ``journal``): sd-journal opens a file
whose header timestamps are garbage, and the probe must report that one file
as damaged instead of failing the whole report.
"""

from __future__ import annotations

import os
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_watchdog.lab.hardware.journal_writer import (
    JOURNAL_REMOTE_PATHS,
    Ending,
    Fault,
    JournalEntry,
    boot_entries,
    write_boot,
    write_journal,
)
from spark_watchdog.probes.journal import JournalProbe

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        not any(os.access(p, os.X_OK) for p in JOURNAL_REMOTE_PATHS),
        reason="systemd-journal-remote not installed (Debian package systemd-journal-remote)",
    ),
]

T0 = datetime(2026, 1, 5, 10, 0, tzinfo=timezone.utc)
FROZEN = "a0" * 16
CURRENT = "b1" * 16
# Header offsets (https://systemd.io/JOURNAL_FILE_FORMAT/): head_entry_realtime and
# tail_entry_monotonic, both le64.
HEAD_ENTRY_REALTIME = 184
TAIL_ENTRY_MONOTONIC = 200


def _overwrite(path: Path, offset: int, data: bytes) -> None:
    raw = bytearray(path.read_bytes())
    raw[offset : offset + len(data)] = data
    path.write_bytes(bytes(raw))


def test_a_header_timestamp_past_year_9999_marks_the_file_damaged(tmp_path: Path) -> None:
    frozen = write_boot(
        tmp_path, boot_entries(FROZEN, T0, faults=[Fault.XID_31], ending=Ending.POWER_LOSS)
    )
    write_boot(tmp_path, boot_entries(CURRENT, T0 + timedelta(hours=1)))
    _overwrite(frozen, HEAD_ENTRY_REALTIME, b"\xff" * 8)

    report = JournalProbe(directory=str(tmp_path), current_boot_id=CURRENT).read()

    # Before: state "error", message "OverflowError: date value out of range", no boots.
    assert report.state == "degraded", report.message
    assert [e.reason for e in report.file_errors] == [
        "damaged: first entry unreadable (header says 18446744073709551615 µs after 1970, "
        "past year 9999); salvaged what reads forward"
    ]
    frozen_boot = next(b for b in report.boots if b.boot_id == FROZEN)
    assert frozen_boot.clean_shutdown is False
    assert frozen_boot.evidence_counts["xid"] == 1
    assert frozen_boot.damaged_files == (str(frozen),)


def test_a_boot_id_field_with_a_trailing_newline_is_not_a_boot_id(tmp_path: Path) -> None:
    odd = "c2" * 16
    entries = [
        JournalEntry(
            T0 + timedelta(seconds=i),
            1000 + i,
            None,
            f"line {i}",
            extra=(("_BOOT_ID", (odd + "\n").encode()),),
        )
        for i in range(3)
    ]
    path = write_journal(tmp_path / "system.journal", entries)
    _overwrite(path, TAIL_ENTRY_MONOTONIC, b"\xff" * 8)  # damaged: read by salvage

    report = JournalProbe(directory=str(tmp_path), current_boot_id=CURRENT).read()

    assert report.state == "degraded", report.message
    # The entry objects' own boot id (journal-remote could not parse the field: zeros),
    # not "c2c2…c2\n", which "^[0-9a-f]{32}$" used to accept.
    assert [b.boot_id for b in report.boots] == ["0" * 32]
    assert report.boots[0].kernel_lines == 3
