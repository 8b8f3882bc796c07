"""Node journal checks: journald's settings from a config tree, and the previous boot
read back from real journal files written by systemd-journal-remote."""

from __future__ import annotations

import os
import uuid
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_watchdog.config.agent import JournalProbeConfig
from spark_watchdog.doctor.journal_checks import (
    check_persistent,
    check_previous_boot,
    check_sync_interval,
    journald_setting,
    parse_timespan,
)
from spark_watchdog.lab.hardware.journal_writer import (
    JOURNAL_REMOTE_PATHS,
    Ending,
    Fault,
    boot_entries,
    write_boot,
)

needs_journal_remote = pytest.mark.skipif(
    not any(os.access(p, os.X_OK) for p in JOURNAL_REMOTE_PATHS),
    reason="systemd-journal-remote not installed (Debian package systemd-journal-remote)",
)


def _conf(root: Path, relative: str, text: str) -> None:
    path = root / relative
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


# -- journald.conf --------------------------------------------------------------


def test_dropins_override_the_main_file_and_etc_overrides_usr_lib(tmp_path: Path) -> None:
    _conf(tmp_path, "etc/systemd/journald.conf", "[Journal]\nStorage=volatile\n")
    _conf(tmp_path, "usr/lib/systemd/journald.conf.d/10-vendor.conf", "[Journal]\nStorage=none\n")
    _conf(tmp_path, "etc/systemd/journald.conf.d/10-vendor.conf", "[Journal]\nStorage=auto\n")
    _conf(tmp_path, "run/systemd/journald.conf.d/20-later.conf", "[Journal]\nStorage=persistent\n")
    found = journald_setting("Storage", tmp_path)
    assert found.value == "persistent"
    assert found.source == str(tmp_path / "run/systemd/journald.conf.d/20-later.conf")


def test_keys_of_other_sections_and_comments_do_not_count(tmp_path: Path) -> None:
    _conf(tmp_path, "etc/systemd/journald.conf", "#Storage=none\n[Other]\nStorage=none\n")
    assert journald_setting("Storage", tmp_path).value is None


def test_volatile_storage_fails(tmp_path: Path) -> None:
    (tmp_path / "var/log/journal").mkdir(parents=True)
    _conf(tmp_path, "etc/systemd/journald.conf.d/x.conf", "[Journal]\nStorage=volatile\n")
    found = check_persistent(None, tmp_path)
    assert found.status == "fail"
    assert "Storage=volatile" in found.detail
    assert found.fix is not None and "Storage=persistent" in found.fix


def test_auto_without_var_log_journal_fails(tmp_path: Path) -> None:
    found = check_persistent(None, tmp_path)
    assert found.status == "fail" and "does not exist" in found.detail


def test_auto_with_var_log_journal_is_persistent(tmp_path: Path) -> None:
    (tmp_path / "var/log/journal").mkdir(parents=True)
    assert check_persistent(None, tmp_path).status == "ok"


def test_a_configured_directory_that_is_missing_fails(tmp_path: Path) -> None:
    found = check_persistent(str(tmp_path / "nowhere"), tmp_path)
    assert found.status == "fail" and "probes.journal.directory" in found.detail


@pytest.mark.parametrize(
    ("text", "seconds"),
    [("5min", 300.0), ("15s", 15.0), ("10", 10.0), ("1h 30s", 3630.0), ("250ms", 0.25)],
)
def test_timespans(text: str, seconds: float) -> None:
    assert parse_timespan(text) == pytest.approx(seconds)


def test_a_bad_timespan_is_none() -> None:
    assert parse_timespan("soon") is None
    assert parse_timespan("") is None


def test_the_default_sync_interval_warns_and_a_short_one_passes(tmp_path: Path) -> None:
    assert check_sync_interval(tmp_path).status == "warn"
    _conf(tmp_path, "etc/systemd/journald.conf.d/sw.conf", "[Journal]\nSyncIntervalSec=15s\n")
    assert check_sync_interval(tmp_path).status == "ok"


# -- the previous boot, from real journal files -------------------------------------


@pytest.mark.integration
@needs_journal_remote
def test_an_unclean_previous_boot_is_read_back_with_its_evidence(tmp_path: Path) -> None:
    start = datetime.now(timezone.utc) - timedelta(hours=3)
    clean, frozen = uuid.uuid4().hex, uuid.uuid4().hex
    write_boot(tmp_path, boot_entries(clean, start))
    write_boot(
        tmp_path,
        boot_entries(
            frozen,
            start + timedelta(hours=1),
            faults=[Fault.XID_31],
            ending=Ending.POWER_LOSS,
        ),
    )
    found = check_previous_boot(JournalProbeConfig(directory=str(tmp_path)))
    assert found.status == "ok", found
    assert frozen[:8] in found.detail
    assert "UNCLEANLY" in found.detail and "xid x1" in found.detail


@pytest.mark.integration
@needs_journal_remote
def test_a_journal_with_only_the_current_boot_warns(tmp_path: Path) -> None:
    current = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    write_boot(tmp_path, boot_entries(current, datetime.now(timezone.utc) - timedelta(hours=1)))
    found = check_previous_boot(JournalProbeConfig(directory=str(tmp_path)))
    assert found.status == "warn" and "no previous one" in found.detail


def test_an_empty_journal_directory_fails(tmp_path: Path) -> None:
    found = check_previous_boot(JournalProbeConfig(directory=str(tmp_path)))
    assert found.status == "fail" and "no journal files" in found.detail


def test_a_disabled_journal_probe_is_skipped() -> None:
    assert check_previous_boot(JournalProbeConfig(enabled=False)).status == "skip"
