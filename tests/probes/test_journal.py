"""Journal probe against real journal files written by systemd-journal-remote."""

from __future__ import annotations

import argparse
import json
import os
import random
import struct
import sys
from collections.abc import Callable
from datetime import datetime, timedelta, timezone
from pathlib import Path

import pytest

from spark_watchdog.cli import probe_journal
from spark_watchdog.lab.hardware.journal_writer import (
    JOURNAL_REMOTE_PATHS,
    JOURNAL_START,
    JOURNAL_STOP,
    BootTimeline,
    Ending,
    Fault,
    boot_entries,
    write_boot,
)
from spark_watchdog.probes.journal import EVIDENCE_KINDS, BootRecord, JournalProbe, JournalReport

T0 = datetime(2026, 5, 1, 10, 0, tzinfo=timezone.utc)
HOUR = timedelta(hours=1)
BOOT_A = "a0" * 16
BOOT_B = "b1" * 16
BOOT_C = "c2" * 16
BOOT_D = "d3" * 16

needs_journal_remote = pytest.mark.skipif(
    not any(os.access(p, os.X_OK) for p in JOURNAL_REMOTE_PATHS),
    reason="systemd-journal-remote not installed (Debian package systemd-journal-remote)",
)


def real_journal(test: Callable[..., None]) -> Callable[..., None]:
    """Integration test: real journal files through systemd-journal-remote."""
    marked: Callable[..., None] = pytest.mark.integration(needs_journal_remote(test))
    return marked


def boot(report: JournalReport, boot_id: str) -> BootRecord:
    found = [b for b in report.boots if b.boot_id == boot_id]
    assert len(found) == 1, f"boot {boot_id} not in {[b.boot_id for b in report.boots]}"
    return found[0]


def freeze_then_reboot(directory: Path) -> None:
    """A clean boot, a boot that froze after NVRM errors, and the boot after it."""
    write_boot(directory, boot_entries(BOOT_A, T0))
    write_boot(
        directory,
        boot_entries(
            BOOT_B,
            T0 + HOUR,
            faults=[Fault.XID_31, *[Fault.NV_ERR_NO_MEMORY] * 3],
            ending=Ending.POWER_LOSS,
        ),
    )
    write_boot(
        directory,
        boot_entries(BOOT_C, T0 + 2 * HOUR, after_unclean=True, ending=Ending.POWER_LOSS),
    )


@real_journal
def test_clean_shutdown(tmp_path: Path) -> None:
    write_boot(tmp_path, boot_entries(BOOT_A, T0, ending=Ending.CLEAN_SHUTDOWN))
    write_boot(tmp_path, boot_entries(BOOT_B, T0 + HOUR, ending=Ending.POWER_LOSS))
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_B).read()
    assert report.state == "ok"
    assert report.file_errors == ()
    past, current = boot(report, BOOT_A), boot(report, BOOT_B)
    assert past.clean_shutdown is True
    assert past.current is False
    assert current.clean_shutdown is None
    assert current.current is True
    assert report.previous_boot == past
    assert report.summary_json()["previous_boot_clean_shutdown"] is True


@real_journal
def test_clean_shutdown_without_logind(tmp_path: Path) -> None:
    write_boot(tmp_path, boot_entries(BOOT_A, T0, logind_shutdown=False))
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_B).read()
    assert boot(report, BOOT_A).clean_shutdown is True


@real_journal
def test_freeze_with_xid_and_no_memory_lines(tmp_path: Path) -> None:
    freeze_then_reboot(tmp_path)
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_C).read()
    frozen = boot(report, BOOT_B)
    assert frozen.clean_shutdown is False
    assert frozen.evidence_counts == {
        "xid": 1,
        "nv_err_no_memory": 3,
        "fallen_off_bus": 0,
        "aer": 0,
        "soft_lockup": 0,
        "hung_task": 0,
    }
    kinds = [e.kind for e in frozen.evidence if e.kind != "tail"]
    assert kinds == ["xid", "nv_err_no_memory", "nv_err_no_memory", "nv_err_no_memory"]
    xid = next(e for e in frozen.evidence if e.kind == "xid")
    assert "NVRM: Xid" in xid.message and ": 31," in xid.message
    assert xid.time.tzinfo is not None
    tail = [e for e in frozen.evidence if e.kind == "tail"]
    assert "_memdescAllocInternal" in tail[-1].message  # the freeze: last line is NVRM
    assert tail[-1].time == frozen.last_entry
    # The boot after it: journald complained about the old file.
    current = report.current_boot
    assert current is not None and current.boot_id == BOOT_C
    assert current.uncleanly_shut_down_logged is True
    assert boot(report, BOOT_B).uncleanly_shut_down_logged is False
    summary = report.summary_json()
    assert summary["previous_boot_id"] == BOOT_B
    assert summary["previous_boot_clean_shutdown"] is False
    assert summary["current_boot_uncleanly_shut_down_logged"] is True
    assert summary["current_boot_evidence_counts"]["xid"] == 0


@pytest.mark.parametrize(
    ("fault", "kind"),
    [
        (Fault.FALLEN_OFF_BUS, "fallen_off_bus"),
        (Fault.AER, "aer"),
        (Fault.SOFT_LOCKUP, "soft_lockup"),
        (Fault.HUNG_TASK, "hung_task"),
    ],
)
@real_journal
def test_each_evidence_kind_is_recognised(tmp_path: Path, fault: Fault, kind: str) -> None:
    write_boot(tmp_path, boot_entries(BOOT_A, T0, faults=[fault], ending=Ending.POWER_LOSS))
    record = boot(JournalProbe(str(tmp_path), current_boot_id=BOOT_D).read(), BOOT_A)
    assert {k: n for k, n in record.evidence_counts.items() if n} == {kind: 1}


@real_journal
def test_only_kernel_lines_count_as_evidence(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    timeline.service("vllm", "user text mentioning NVRM: Xid 31 and NV_ERR_NO_MEMORY")
    timeline.kernel("NVRM: Xid (PCI:000f:01:00): 79, pid=1, GPU has fallen off the bus.")
    timeline.write(tmp_path)
    record = boot(JournalProbe(str(tmp_path)).read(), BOOT_A)
    assert record.evidence_counts["xid"] == 1
    assert record.evidence_counts["fallen_off_bus"] == 1
    assert record.evidence_counts["nv_err_no_memory"] == 0
    assert record.kernel_lines == 1


@real_journal
def test_several_boots_oldest_first(tmp_path: Path) -> None:
    # Written out of order: the order comes from the entries, not the files.
    write_boot(tmp_path, boot_entries(BOOT_C, T0 + 2 * HOUR))
    write_boot(tmp_path, boot_entries(BOOT_A, T0))
    write_boot(tmp_path, boot_entries(BOOT_D, T0 + 3 * HOUR, ending=Ending.POWER_LOSS))
    write_boot(tmp_path, boot_entries(BOOT_B, T0 + HOUR, ending=Ending.POWER_LOSS))
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_D).read()
    assert [b.boot_id for b in report.boots] == [BOOT_A, BOOT_B, BOOT_C, BOOT_D]
    assert [b.clean_shutdown for b in report.boots] == [True, False, True, None]
    firsts = [b.first_entry for b in report.boots]
    assert firsts == sorted(firsts)
    assert all(b.first_entry < b.last_entry for b in report.boots)
    assert boot(report, BOOT_A).first_entry == T0 + timedelta(seconds=1)


@real_journal
def test_max_boots_keeps_the_newest(tmp_path: Path) -> None:
    for n, boot_id in enumerate((BOOT_A, BOOT_B, BOOT_C, BOOT_D)):
        write_boot(tmp_path, boot_entries(boot_id, T0 + n * HOUR))
    report = JournalProbe(str(tmp_path), max_boots=2).read()
    assert [b.boot_id for b in report.boots] == [BOOT_C, BOOT_D]


@real_journal
def test_one_entry_boot(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    timeline.kernel("Booting Linux on physical CPU 0x0")
    timeline.write(tmp_path)
    record = boot(JournalProbe(str(tmp_path)).read(), BOOT_A)
    assert record.first_entry == record.last_entry == T0 + timedelta(seconds=1)
    assert record.clean_shutdown is False
    assert [(e.kind, e.message) for e in record.evidence] == [
        ("tail", "Booting Linux on physical CPU 0x0")
    ]


@real_journal
def test_current_boot_by_id(tmp_path: Path) -> None:
    freeze_then_reboot(tmp_path)
    dashed = "-".join((BOOT_C[:8], BOOT_C[8:12], BOOT_C[12:16], BOOT_C[16:20], BOOT_C[20:]))
    report = JournalProbe(str(tmp_path), current_boot_id=dashed.upper()).read()
    assert [b.current for b in report.boots] == [False, False, True]
    assert report.to_json()["current_boot"]["boot_id"] == BOOT_C
    # A boot id the journal does not know: no boot is current, all are past.
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_D).read()
    assert report.current_boot is None
    assert report.to_json()["current_boot"] is None
    assert [b.clean_shutdown for b in report.boots] == [True, False, False]


@real_journal
def test_current_boot_defaults_to_the_running_kernel(tmp_path: Path) -> None:
    running = Path("/proc/sys/kernel/random/boot_id").read_text().strip().replace("-", "")
    write_boot(tmp_path, boot_entries(BOOT_A, T0))
    write_boot(tmp_path, boot_entries(running, T0 + HOUR, ending=Ending.POWER_LOSS))
    report = JournalProbe(str(tmp_path)).read()
    assert report.current_boot is not None and report.current_boot.boot_id == running


@real_journal
def test_evidence_per_kind_keeps_the_newest_and_counts_all(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    for n in range(50):
        timeline.kernel(f"NVRM: ... NV_ERR_NO_MEMORY (0x00000051) _memdescAllocInternal #{n}")
    for n in range(3):
        timeline.kernel(f"NVRM: Xid (PCI:000f:01:00): 31, pid={n}")
    timeline.write(tmp_path)
    record = boot(JournalProbe(str(tmp_path), evidence_per_kind=5, tail_entries=2).read(), BOOT_A)
    assert record.evidence_counts["nv_err_no_memory"] == 50
    assert record.evidence_counts["xid"] == 3
    kept = [e.message for e in record.evidence if e.kind == "nv_err_no_memory"]
    assert [m.rsplit("#", 1)[1] for m in kept] == ["45", "46", "47", "48", "49"]
    assert len([e for e in record.evidence if e.kind == "xid"]) == 3
    assert len([e for e in record.evidence if e.kind == "tail"]) == 2
    times = [e.time for e in record.evidence]
    assert times == sorted(times)


@real_journal
def test_journald_restart_mid_boot_is_not_a_clean_end(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    timeline.journald("Journal started", JOURNAL_START)
    timeline.journald("Journal stopped", JOURNAL_STOP)  # e.g. switch-root, upgrade
    timeline.journald("Journal started", JOURNAL_START)
    timeline.kernel("NVRM: Xid (PCI:000f:01:00): 31, pid=1")
    timeline.write(tmp_path)
    assert boot(JournalProbe(str(tmp_path)).read(), BOOT_A).clean_shutdown is False


@real_journal
def test_a_few_lines_after_journal_stopped_still_close_the_boot(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    timeline.journald("Journal stopped", JOURNAL_STOP)
    timeline.kernel("reboot: Power down")
    timeline.write(tmp_path)
    # A stop followed by many more lines (and no start) is not a shutdown.
    late = BootTimeline(BOOT_C, T0)
    late.journald("Journal stopped", JOURNAL_STOP)
    for n in range(40):
        late.kernel(f"line {n}")
    late.write(tmp_path)
    for tail_entries in (0, 20, 100):  # the verdict does not depend on how much is shown
        report = JournalProbe(str(tmp_path), tail_entries=tail_entries).read()
        assert boot(report, BOOT_A).clean_shutdown is True
        assert boot(report, BOOT_C).clean_shutdown is False


@real_journal
def test_bad_entries_do_not_break_the_probe(tmp_path: Path) -> None:
    timeline = BootTimeline(BOOT_A, T0)
    timeline.kernel("NVRM: Xid (PCI:000f:01:00): 31,\nsecond line of it")
    timeline.add(b"NVRM: Xid \xff\xfe not UTF-8", identifier="kernel")
    timeline.add(None)  # no MESSAGE at all
    timeline.add("\x00binary\x01 NV_ERR_NO_MEMORY", priority=None)
    timeline.write(tmp_path)
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "ok"
    record = boot(report, BOOT_A)
    assert record.evidence_counts["xid"] == 2
    assert record.evidence_counts["nv_err_no_memory"] == 1
    messages = [e.message for e in record.evidence if e.kind == "tail"]
    assert messages[0] == "NVRM: Xid (PCI:000f:01:00): 31,\nsecond line of it"
    assert messages[1] == "NVRM: Xid \ufffd\ufffd not UTF-8"
    assert messages[2] == ""
    json.dumps(report.to_json())  # everything serialisable


def _three_boots(directory: Path) -> dict[str, Path]:
    paths = {}
    for n, boot_id in enumerate((BOOT_A, BOOT_B, BOOT_C)):
        timeline = BootTimeline(boot_id, T0 + n * HOUR)
        for line in range(300):
            timeline.kernel(f"NVRM: Xid (PCI:000f:01:00): 31, pid={line} line {line}")
        paths[boot_id] = timeline.write(directory) or Path()
    return paths


def _used_end(path: Path) -> int:
    """Offset just past the last non-zero byte (journal files are preallocated)."""
    return len(path.read_bytes().rstrip(b"\0"))


def _assert_others_intact(report: JournalReport) -> None:
    for boot_id in (BOOT_A, BOOT_C):
        record = boot(report, boot_id)
        assert record.evidence_counts["xid"] == 300
        assert record.damaged_files == ()


@pytest.mark.parametrize("size", [0, 100, 4096, 200_000])
@real_journal
def test_truncated_file_is_reported_and_the_rest_analysed(tmp_path: Path, size: int) -> None:
    paths = _three_boots(tmp_path)
    os.truncate(paths[BOOT_B], size)
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "degraded"
    assert [(e.path, e.reason) for e in report.file_errors] == [
        (
            str(paths[BOOT_B]),
            "cannot open: file is shorter than its header says (truncated) [No data available]",
        )
    ]
    assert [b.boot_id for b in report.boots] == [BOOT_A, BOOT_C]
    _assert_others_intact(report)
    assert report.to_json()["file_errors"] == [
        {"path": str(paths[BOOT_B]), "reason": report.file_errors[0].reason}
    ]
    assert str(paths[BOOT_B]) in str(report.file_errors[0])


@real_journal
def test_garbage_header_is_reported(tmp_path: Path) -> None:
    paths = _three_boots(tmp_path)
    with paths[BOOT_B].open("r+b") as handle:
        handle.write(random.Random(1).randbytes(64))
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "degraded"
    (error,) = report.file_errors
    assert error.path == str(paths[BOOT_B])
    assert error.reason.startswith("cannot open: not a valid journal file")
    assert [b.boot_id for b in report.boots] == [BOOT_A, BOOT_C]
    _assert_others_intact(report)


@real_journal
def test_zeroed_end_of_file_is_reported_and_salvaged(tmp_path: Path) -> None:
    # What a power loss leaves: the last pages of the file never reached disk.
    paths = _three_boots(tmp_path)
    end = _used_end(paths[BOOT_B])
    with paths[BOOT_B].open("r+b") as handle:
        handle.seek(end - 8192)
        handle.write(bytes(8192))
    report = JournalProbe(str(tmp_path), current_boot_id=BOOT_C).read()
    assert report.state == "degraded"
    (error,) = report.file_errors
    assert error.path == str(paths[BOOT_B])
    assert error.reason.startswith("damaged: ")
    salvaged = boot(report, BOOT_B)
    assert salvaged.damaged_files == (str(paths[BOOT_B]),)
    assert 0 < salvaged.evidence_counts["xid"] < 300
    assert salvaged.clean_shutdown is False
    _assert_others_intact(report)


@real_journal
def test_garbage_inside_the_objects_is_reported(tmp_path: Path) -> None:
    paths = _three_boots(tmp_path)
    data = paths[BOOT_B].read_bytes()
    hash_table_offset, hash_table_size = struct.unpack_from("<QQ", data, 104)
    start, end = hash_table_offset + hash_table_size, _used_end(paths[BOOT_B])
    with paths[BOOT_B].open("r+b") as handle:
        handle.seek((start + end) // 2)
        handle.write(random.Random(7).randbytes(4096))
    probe = JournalProbe(str(tmp_path), current_boot_id=BOOT_C)
    report = probe.read()
    assert report.state == "degraded"
    (error,) = report.file_errors
    assert error.path == str(paths[BOOT_B])
    assert error.reason.startswith("damaged: ")
    assert boot(report, BOOT_B).damaged_files == (str(paths[BOOT_B]),)
    _assert_others_intact(report)
    again = probe.read()  # the verdict is kept; nothing is scanned twice
    assert again.scanned_entries == 0
    assert again.to_json() == dict(report.to_json(), scanned_entries=0)


@pytest.mark.integration
def test_no_readable_file_is_unavailable(tmp_path: Path) -> None:
    (tmp_path / "system.journal").write_bytes(b"not a journal")
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "unavailable"
    assert report.file_errors[0].path == str(tmp_path / "system.journal")
    assert probe_journal.exit_code(report) == 1


@real_journal
def test_second_read_scans_only_new_entries(tmp_path: Path) -> None:
    freeze_then_reboot(tmp_path)
    live = BootTimeline(BOOT_D, T0 + 3 * HOUR)
    for n in range(10):
        live.kernel(f"kernel line {n}")
    live.write(tmp_path)
    probe = JournalProbe(str(tmp_path), current_boot_id=BOOT_D)
    first = probe.read()
    assert first.scanned_entries > 20
    second = probe.read()
    assert second.scanned_entries == 0
    assert second.to_json() == dict(first.to_json(), scanned_entries=0)
    live.kernel("NVRM: Xid (PCI:000f:01:00): 31, pid=9")
    live.service("vllm", "not a kernel line")
    live.kernel("kernel line 11")
    live.write(tmp_path)
    third = probe.read()
    assert third.scanned_entries == 2  # the two new kernel lines, nothing else
    current = third.current_boot
    assert current is not None
    assert current.evidence_counts["xid"] == 1
    assert current.kernel_lines == 12
    assert [e.message for e in current.evidence if e.kind == "tail"][-1] == "kernel line 11"
    assert [b.to_json() for b in third.boots[:3]] == [b.to_json() for b in first.boots[:3]]


def test_without_systemd_python_the_probe_is_unavailable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "systemd.journal", None)
    (tmp_path / "system.journal").write_bytes(b"")  # files to read, nothing to read them with
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "unavailable"
    assert report.message is not None and "python3-systemd" in report.message


def test_missing_directory_is_an_error(tmp_path: Path) -> None:
    report = JournalProbe(str(tmp_path / "nope")).read()
    assert report.state == "error"
    assert report.message == f"{tmp_path / 'nope'}: not a directory"


def test_empty_directory_is_unavailable(tmp_path: Path) -> None:
    report = JournalProbe(str(tmp_path)).read()
    assert report.state == "unavailable"
    assert report.message == f"no journal files in {tmp_path}"


# -- the CLI -----------------------------------------------------------------


def _cli(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="spark-watchdog probe")
    probe_journal.add_parser(parser.add_subparsers(dest="probe", required=True))
    args = parser.parse_args(argv)
    return int(args.func(args))


@real_journal
def test_cli_json_follows_the_contract(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    freeze_then_reboot(tmp_path)
    code = _cli(["journal", "--directory", str(tmp_path), "--json", "--current-boot", BOOT_C])
    body = json.loads(capsys.readouterr().out)
    assert code == 1  # the previous boot froze
    assert body["state"] == "ok"
    assert [b["boot_id"] for b in body["boots"]] == [BOOT_A, BOOT_B, BOOT_C]
    assert [b["clean_shutdown"] for b in body["boots"]] == [True, False, None]
    assert [b["current"] for b in body["boots"]] == [False, False, True]
    frozen = body["boots"][1]
    assert frozen["first_entry"] == "2026-05-01T11:00:01.000000+00:00"
    assert set(frozen["evidence_counts"]) == set(EVIDENCE_KINDS)
    assert {e["kind"] for e in frozen["evidence"]} == {"xid", "nv_err_no_memory", "tail"}
    assert all(set(e) == {"time", "kind", "message"} for e in frozen["evidence"])
    assert datetime.fromisoformat(frozen["evidence"][0]["time"]).utcoffset() == timedelta(0)
    assert body["current_boot"]["boot_id"] == BOOT_C
    assert body["current_boot"]["uncleanly_shut_down_logged"] is True
    assert body["file_errors"] == []


@real_journal
def test_cli_exit_0_after_a_clean_shutdown(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    write_boot(tmp_path, boot_entries(BOOT_A, T0))
    write_boot(tmp_path, boot_entries(BOOT_B, T0 + HOUR, ending=Ending.POWER_LOSS))
    assert _cli(["journal", "--directory", str(tmp_path), "--current-boot", BOOT_B]) == 0
    out = capsys.readouterr().out
    assert "a0a0a0a0" in out and "clean" in out and "current" in out
    assert "UNCLEAN" not in out


@real_journal
def test_cli_table_shows_the_unclean_boot(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    freeze_then_reboot(tmp_path)
    assert _cli(["journal", "--directory", str(tmp_path), "--current-boot", BOOT_C]) == 1
    out = capsys.readouterr().out
    assert f"previous boot {BOOT_B} ended UNCLEAN" in out
    assert "nv_err_no_memory:3, xid:1" in out
    assert "uncleanly shut down at the next boot" in out
    assert "Out of memory [NV_ERR_NO_MEMORY]" in out


def test_cli_usage_errors_exit_2(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "missing"
    with pytest.raises(SystemExit) as exit_info:
        _cli(["journal", "--directory", str(missing)])
    assert exit_info.value.code == 2
    assert f"not a directory: {missing}" in capsys.readouterr().err
    for bad in (["--current-boot", "xyz"], ["--tail", "-1"], ["--max-boots", "0"]):
        with pytest.raises(SystemExit) as exit_info:
            _cli(["journal", "--directory", str(tmp_path), *bad])
        assert exit_info.value.code == 2
