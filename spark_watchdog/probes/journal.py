"""Journal probe: how did each past boot end, and what did the kernel say before it died?

After a GB10 host freeze and a power cycle, the previous boot's journal is the
only record on the node (docs/facts.md, "Whole-host freezes": the journal stops
mid-stream, pstore stays empty). For each boot this probe reports its first and
last entry, whether it ended with a clean shutdown, and the kernel lines that
explain a freeze: NVRM Xid, NV_ERR_NO_MEMORY, "fallen off the bus", PCIe AER,
soft lockups, hung tasks.

It reads with ``systemd.journal.Reader`` (package systemd-python, Debian
python3-systemd), imported lazily so the rest of the agent runs without it.

Damaged files. Found by experiment with sd-journal (systemd 252, systemd-python
235) on files written by systemd-journal-remote:

- A truncated file (0 bytes, inside the header, or shorter than the size its
  header declares) and a file with garbage in its header cannot be opened:
  ``Reader(files=[f])`` raises OSError (ENODATA, EBADMSG). ``Reader(path=DIR)``
  silently skips such files: the boots in them just vanish.
- Garbage or zeros inside the objects (what a power loss leaves when dirty pages
  never reached disk) do not raise: sd-journal silently skips what it cannot
  read. Boot matches then go wrong: reading a boot forward stops early while
  seeking to its last entry finds a later entry, or none; and garbage in one
  file's hash table made ``query_unique('_BOOT_ID')`` over a directory miss a
  boot stored in a different, healthy file.

So each file is checked alone first (cached until it changes): it must open,
and its first and last entries, read with and without a boot match, must agree
with the file header (https://systemd.io/JOURNAL_FILE_FORMAT/). Then the
healthy files are read as one merged view, and every forward scan must reach
the entry that seeking to the tail finds; when it cannot, the file responsible
is found by repeating the scan on each file alone. Files that fail to open are
reported and left out. Damaged files are reported, kept out of the merged view
so they cannot poison it, and salvaged on their own by reading them forward
without matches. Damage that disturbs neither a file's ends nor the scans is
not seen (``journalctl --verify`` finds it); sd-journal just skips those entries.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import Any

from spark_watchdog.errors import JournalFileError, ProbeError
from spark_watchdog.probes import journal_read
from spark_watchdog.probes.host import read_boot_id
from spark_watchdog.probes.journal_read import (
    CATCH_UP_ROUNDS,
    EPOCH,
    ID128,
    BootScan,
    IndexBroken,
    JournalLine,
    ResumeLost,
    boot_bounds,
    check_file,
    damaged_file,
    index_broken,
    journal_files,
    open_error,
    own_machine_id,
    read_tail,
    salvage_boots,
    scan_evidence,
    unlistable_folders,
)

# The kinds of kernel evidence a boot record counts (part of the report).
EVIDENCE_KINDS = journal_read.EVIDENCE_KINDS

log = logging.getLogger(__name__)

# sd-messages.h: SD_MESSAGE_JOURNAL_START / SD_MESSAGE_JOURNAL_STOP.
JOURNAL_START = "f77379a8490b408bbe5f6940505a777b"
JOURNAL_STOP = "d93fb3c9c24d451a97cea615ce59c00b"

# What "Journal stopped ... closes the boot" means. journald writes "Journal
# stopped" as the very last thing before it exits (run() in systemd's
# src/journal/journald.c), and at shutdown it is one of the last processes to
# go (logs typically show "Received SIGTERM from PID 1 (systemd-shutdown)."
# just before it), so normally it is the boot's last entry. It also appears
# mid-boot whenever journald restarts (e.g. leaving the initrd, package
# upgrades), followed by "Journal started". So: a boot ended cleanly when,
# reading back from its last entry, a stop comes before any start, within the
# last CLOSING_WINDOW entries. The window tolerates a few entries merged in
# after the stop from other files of the directory; more than that is not a
# shutdown we recognise.
CLOSING_WINDOW = 16


def normalise_boot_id(raw: str) -> str:
    """A boot id as journald writes it: 32 lowercase hex digits, no dashes."""
    boot_id = raw.strip().replace("-", "").lower()
    if not ID128.match(boot_id):
        raise ValueError(f"expected a boot id (32 hex digits, dashes allowed), got {raw!r}")
    return boot_id


# -- the report ---------------------------------------------------------------


@dataclass(frozen=True)
class Evidence:
    """One journal line that says something about how a boot went."""

    time: datetime
    kind: str
    message: str

    def to_json(self) -> dict[str, Any]:
        return {
            "time": self.time.isoformat(timespec="microseconds"),
            "kind": self.kind,
            "message": self.message,
        }


@dataclass(frozen=True)
class BootRecord:
    """One boot as the journal remembers it."""

    boot_id: str
    first_entry: datetime
    last_entry: datetime
    current: bool
    # True: journald's "Journal stopped" closes the boot. False: the journal
    # just stops (power loss, freeze). None: the current boot, still running.
    clean_shutdown: bool | None
    evidence: tuple[Evidence, ...]
    evidence_counts: Mapping[str, int]
    kernel_lines: int
    # journald said at this boot's start that it found the previous boot's
    # journal file uncleanly shut down (so the previous boot died mid-write).
    uncleanly_shut_down_logged: bool
    damaged_files: tuple[str, ...] = ()

    def to_json(self) -> dict[str, Any]:
        return {
            "boot_id": self.boot_id,
            "first_entry": self.first_entry.isoformat(timespec="microseconds"),
            "last_entry": self.last_entry.isoformat(timespec="microseconds"),
            "current": self.current,
            "clean_shutdown": self.clean_shutdown,
            "evidence": [item.to_json() for item in self.evidence],
            "evidence_counts": dict(self.evidence_counts),
            "kernel_lines": self.kernel_lines,
            "uncleanly_shut_down_logged": self.uncleanly_shut_down_logged,
            "damaged_files": list(self.damaged_files),
        }


@dataclass(frozen=True)
class JournalReport:
    """The journal probe's observation. ``boots`` is oldest first."""

    state: str  # ok | degraded | unavailable | error
    boots: tuple[BootRecord, ...] = ()
    file_errors: tuple[JournalFileError, ...] = ()
    message: str | None = None
    source: str = "system journal"
    scanned_entries: int = 0

    @property
    def current_boot(self) -> BootRecord | None:
        return next((boot for boot in self.boots if boot.current), None)

    @property
    def previous_boot(self) -> BootRecord | None:
        """The newest boot that is not the current one."""
        past = [boot for boot in self.boots if not boot.current]
        return past[-1] if past else None

    def to_json(self) -> dict[str, Any]:
        current = self.current_boot
        return {
            "state": self.state,
            "message": self.message,
            "source": self.source,
            "boots": [boot.to_json() for boot in self.boots],
            "current_boot": None if current is None else _boot_brief(current),
            "file_errors": [{"path": e.path, "reason": e.reason} for e in self.file_errors],
            "scanned_entries": self.scanned_entries,
        }

    def summary_json(self) -> dict[str, Any]:
        """The compact form for the agent's /v1/state snapshot."""
        previous, current = self.previous_boot, self.current_boot
        return {
            "state": self.state,
            "message": self.message,
            "boots": len(self.boots),
            "previous_boot_id": previous.boot_id if previous else None,
            "previous_boot_clean_shutdown": previous.clean_shutdown if previous else None,
            "previous_boot_last_entry": (
                previous.last_entry.isoformat(timespec="microseconds") if previous else None
            ),
            "previous_boot_evidence_counts": dict(previous.evidence_counts) if previous else None,
            "current_boot_id": current.boot_id if current else None,
            "current_boot_evidence_counts": dict(current.evidence_counts) if current else None,
            "current_boot_uncleanly_shut_down_logged": (
                current.uncleanly_shut_down_logged if current else None
            ),
            "file_errors": [{"path": e.path, "reason": e.reason} for e in self.file_errors],
        }


def _boot_brief(boot: BootRecord) -> dict[str, Any]:
    return {
        "boot_id": boot.boot_id,
        "first_entry": boot.first_entry.isoformat(timespec="microseconds"),
        "last_entry": boot.last_entry.isoformat(timespec="microseconds"),
        "evidence_counts": dict(boot.evidence_counts),
        "uncleanly_shut_down_logged": boot.uncleanly_shut_down_logged,
    }


# -- merging and judging ------------------------------------------------------


def _clean_shutdown(tail: Sequence[JournalLine]) -> bool:
    for line in reversed(tail[-CLOSING_WINDOW:]):
        if line.message_id == JOURNAL_STOP:
            return True
        if line.message_id == JOURNAL_START:
            return False
    return False


def _boot_record(
    scans: Sequence[BootScan], current: bool, tail_entries: int, per_kind: int
) -> BootRecord:
    def newest(lines: Iterable[JournalLine], count: int) -> list[JournalLine]:
        ordered = sorted(lines, key=lambda line: line.order)
        return ordered[-count:] if count > 0 else []

    tail = newest((line for s in scans for line in s.tail), max(tail_entries, CLOSING_WINDOW))
    evidence = [
        (line, kind)
        for kind in EVIDENCE_KINDS
        for line in newest((line for s in scans for line in s.evidence[kind]), per_kind)
    ]
    evidence += [(line, "tail") for line in tail[-tail_entries:]] if tail_entries > 0 else []
    evidence.sort(key=lambda item: item[0].order)
    counts = Counter[str]()
    for scan in scans:
        counts.update(scan.counts)
    first = min((s.first for s in scans), key=lambda line: line.order)
    last = max((s.last for s in scans), key=lambda line: line.order)
    return BootRecord(
        boot_id=scans[0].boot_id,
        first_entry=EPOCH + timedelta(microseconds=first.realtime),
        last_entry=EPOCH + timedelta(microseconds=last.realtime),
        current=current,
        clean_shutdown=None if current else _clean_shutdown(tail),
        evidence=tuple(
            Evidence(EPOCH + timedelta(microseconds=line.realtime), kind, line.message)
            for line, kind in evidence
        ),
        evidence_counts={kind: counts[kind] for kind in EVIDENCE_KINDS},
        kernel_lines=sum(s.kernel_lines for s in scans),
        uncleanly_shut_down_logged=any(s.uncleanly_logged for s in scans),
        damaged_files=tuple(sorted({s.source for s in scans if s.source is not None})),
    )


# -- the probe ----------------------------------------------------------------


@dataclass
class _FileVerdict:
    """What the check found in one file, kept until the file changes."""

    path: Path
    identity: tuple[int, int]  # (st_dev, st_ino): survives journald's rotation rename
    stat_key: tuple[int, int]  # (st_size, st_mtime_ns)
    error: JournalFileError | None
    openable: bool
    salvage: list[BootScan] | None = None  # a damaged file's boots, read forward

    @property
    def healthy(self) -> bool:
        return self.openable and self.error is None


class JournalProbe:
    """Reads the system journal (or ``directory``) and explains each boot's end.

    ``read()`` blocks; the agent calls it in a worker thread about once a
    minute. Past boots do not change, so their analysis is kept between reads
    and only new entries (in practice: the current boot's) are scanned;
    ``JournalReport.scanned_entries`` says how many a read looked at.
    """

    def __init__(
        self,
        directory: str | None = None,
        tail_entries: int = 20,
        evidence_per_kind: int = 20,
        max_boots: int = 20,
        current_boot_id: str | None = None,
    ) -> None:
        if tail_entries < 0 or evidence_per_kind < 1 or max_boots < 1:
            raise ValueError("expected tail_entries ≥ 0, evidence_per_kind ≥ 1, max_boots ≥ 1")
        self.directory = Path(directory) if directory is not None else None
        self.tail_entries = tail_entries
        self.evidence_per_kind = evidence_per_kind
        self.max_boots = max_boots
        self.current_boot_id = (
            normalise_boot_id(current_boot_id) if current_boot_id is not None else None
        )
        self._window = max(tail_entries, CLOSING_WINDOW)
        self._lock = threading.Lock()
        self._files: dict[Path, _FileVerdict] = {}
        self._scans: dict[str, BootScan] = {}
        self._scanned_from: frozenset[tuple[int, int]] = frozenset()
        self._scanned = 0  # entries looked at during the current read()

    @property
    def source(self) -> str:
        return str(self.directory) if self.directory is not None else "system journal"

    def read(self) -> JournalReport:
        """One observation. Never raises: problems become the report's state."""
        with self._lock:
            try:
                return self._read()
            except Exception as exc:  # the agent's worker thread must get a report
                log.exception("journal probe failed")
                return JournalReport(
                    "error", message=f"{type(exc).__name__}: {exc}", source=self.source
                )

    def _current_boot(self) -> str | None:
        if self.current_boot_id is not None:
            return self.current_boot_id
        try:
            return read_boot_id()
        except ProbeError:
            return None  # not Linux, or /proc hidden: then no boot is current

    def _unavailable(
        self, message: str, errors: tuple[JournalFileError, ...] = ()
    ) -> JournalReport:
        return JournalReport("unavailable", file_errors=errors, message=message, source=self.source)

    def _read(self) -> JournalReport:
        # A wrong directory, or no journal at all, first: those are the
        # operator's to fix whether or not the library is there.
        if self.directory is not None and not self.directory.is_dir():
            return JournalReport(
                "error", message=f"{self.directory}: not a directory", source=self.source
            )
        current = self._current_boot()
        files = journal_files(self.directory, None if self.directory else own_machine_id())
        if not files:
            denied = unlistable_folders(self.directory)
            if denied:
                return self._unavailable(
                    f"permission denied: cannot list {', '.join(map(str, denied))}"
                )
            return self._unavailable(f"no journal files in {self.source}")
        journal = journal_read.systemd_journal()
        if journal is None:
            return self._unavailable(
                "systemd-python is not installed (Debian: apt install python3-systemd; "
                "pip: systemd-python, which builds against libsystemd-dev)"
            )
        self._scanned = 0
        self._check_files(journal, files, current)
        if not any(v.openable for v in self._files.values()):
            return self._unavailable(
                f"no readable journal files in {self.source}", self._file_errors()
            )
        sources = self._scan_healthy(journal)
        for verdict in self._files.values():
            if verdict.openable and verdict.error is not None:
                self._salvage(journal, verdict, sources)
        chosen = sorted(sources, key=lambda b: (min(s.first.realtime for s in sources[b]), b))
        boots = tuple(
            _boot_record(sources[b], b == current, self.tail_entries, self.evidence_per_kind)
            for b in chosen[-self.max_boots :]
        )
        errors = self._file_errors()
        return JournalReport(
            "degraded" if errors else "ok",
            boots=boots,
            file_errors=errors,
            message=f"{len(errors)} journal file(s) damaged or unreadable" if errors else None,
            source=self.source,
            scanned_entries=self._scanned,
        )

    def _file_errors(self) -> tuple[JournalFileError, ...]:
        return tuple(v.error for v in self._files.values() if v.error is not None)

    def _check_files(self, journal: Any, files: Sequence[Path], current: str | None) -> None:
        verdicts: dict[Path, _FileVerdict] = {}
        for path in files:
            try:
                st = path.stat()
            except OSError as exc:
                verdicts[path] = _FileVerdict(path, (0, 0), (0, 0), open_error(path, exc), False)
                continue
            identity, key = (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns)
            known = self._files.get(path)
            if known is not None and (known.identity, known.stat_key) == (identity, key):
                verdicts[path] = known
                continue
            try:
                error = check_file(journal, path, current)
                verdict = _FileVerdict(path, identity, key, error, openable=True)
            except OSError as exc:
                verdict = _FileVerdict(path, identity, key, open_error(path, exc), openable=False)
            verdicts[path] = verdict
        self._files = verdicts  # files that are gone are forgotten

    def _scan_healthy(self, journal: Any) -> dict[str, list[BootScan]]:
        """Scan the healthy files as one merged view; find and set aside files whose
        index turns out to be damaged (that only shows while scanning)."""
        for _ in range(CATCH_UP_ROUNDS):
            healthy = [p for p, v in self._files.items() if v.healthy]
            identities = frozenset(self._files[p].identity for p in healthy)
            if not identities >= self._scanned_from:
                # A file we scanned before is gone or damaged: cached counts may
                # include its entries, so start over.
                self._scans.clear()
            self._scanned_from = identities
            if not healthy:
                return {}
            try:
                return self._scan_view(journal, healthy)
            except IndexBroken as broken:
                self._scans.pop(broken.args[0], None)
                if not self._set_aside_broken(journal, healthy, broken.args[0]):
                    raise RuntimeError(
                        f"boot {broken.args[0]}: forward reading stops early in the merged "
                        "journal, but in no single file"
                    ) from None
        raise RuntimeError("too many damaged journal files found while scanning")

    def _set_aside_broken(self, journal: Any, healthy: Sequence[Path], boot_id: str) -> bool:
        found = False
        for path in healthy:
            if index_broken(journal, path, boot_id):
                self._files[path].error = damaged_file(
                    path, f"index for boot {boot_id} damaged: reading forward stops early"
                )
                found = True
        return found

    def _salvage(
        self, journal: Any, verdict: _FileVerdict, sources: dict[str, list[BootScan]]
    ) -> None:
        if verdict.salvage is None:
            verdict.salvage, read = salvage_boots(
                journal, verdict.path, self._window, self.evidence_per_kind
            )
            self._scanned += read
        for scan in verdict.salvage:
            sources.setdefault(scan.boot_id, []).append(scan)

    def _scan_view(self, journal: Any, files: Sequence[Path]) -> dict[str, list[BootScan]]:
        sources: dict[str, list[BootScan]] = {}
        with journal.Reader(files=[str(p) for p in files]) as reader:
            bounds: dict[str, tuple[JournalLine, JournalLine]] = {}
            for value in reader.query_unique("_BOOT_ID"):
                boot_id = _boot_id_value(value)
                ends = None if boot_id is None else boot_bounds(reader, boot_id)
                if boot_id is not None and ends is not None:
                    bounds[boot_id] = ends
            newest = sorted(bounds, key=lambda b: bounds[b][0].realtime)[-self.max_boots :]
            scans: dict[str, BootScan] = {}
            for boot_id in newest:
                try:
                    scans[boot_id] = self._boot_scan(reader, boot_id, *bounds[boot_id])
                except IndexBroken:
                    self._scans.update(scans)  # keep what was scanned for the retry
                    raise IndexBroken(boot_id) from None
                sources[boot_id] = [scans[boot_id]]
        self._scans = scans  # boots that fell out of the window are forgotten
        return sources

    def _boot_scan(
        self, reader: Any, boot_id: str, first: JournalLine, last: JournalLine
    ) -> BootScan:
        scan = self._scans.get(boot_id)
        if scan is not None and scan.first.cursor == first.cursor:
            if scan.last.cursor == last.cursor:
                return scan  # nothing new in this boot
            try:
                self._evidence(reader, scan)
            except ResumeLost:
                pass
            else:
                scan.last = last
                scan.tail.clear()
                scan.tail.extend(read_tail(reader, boot_id, self._window))
                return scan
        scan = BootScan(boot_id, first, last, self._window, self.evidence_per_kind)
        self._evidence(reader, scan)
        scan.tail.extend(read_tail(reader, boot_id, self._window))
        return scan

    def _evidence(self, reader: Any, scan: BootScan) -> None:
        before = scan.lines_noted
        try:
            scan_evidence(reader, scan)
        finally:
            self._scanned += scan.lines_noted - before


def _boot_id_value(value: object) -> str | None:
    # Reader.query_unique converts _BOOT_ID to uuid.UUID, or leaves bytes when
    # the value is not a UUID (a bad entry); those cannot be matched sensibly.
    hex_value = getattr(value, "hex", None)
    if isinstance(hex_value, str) and ID128.match(hex_value):
        return hex_value
    return None
