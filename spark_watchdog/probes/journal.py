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

import errno
import importlib
import logging
import re
import struct
import threading
from collections import Counter, deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from spark_watchdog.errors import JournalFileError, ProbeError
from spark_watchdog.probes.host import read_boot_id

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

EVIDENCE_KINDS = ("xid", "nv_err_no_memory", "fallen_off_bus", "aer", "soft_lockup", "hung_task")
_EVIDENCE_PATTERNS: dict[str, re.Pattern[str]] = {
    # NVIDIA driver error report; Xid 31 is the MMU fault that comes with an
    # illegal memory access (vllm #54385, #53726).
    "xid": re.compile(r"NVRM: Xid\b"),
    # Allocation failures before GB10 freezes (open-gpu-kernel-modules #1358);
    # also seen in healthy boots (vllm #56824), so evidence, not a verdict.
    "nv_err_no_memory": re.compile(r"NV_ERR_NO_MEMORY"),
    "fallen_off_bus": re.compile(r"fallen off the bus", re.IGNORECASE),
    # pcieport "AER: ... error received" and "PCIe Bus Error: severity=...".
    "aer": re.compile(r"\bAER:|PCIe Bus Error"),
    "soft_lockup": re.compile(r"soft lockup", re.IGNORECASE),
    "hung_task": re.compile(r"\btask \S+ blocked for more than \d+ seconds"),
}
# journald logs this at start when the previous boot's file was left open.
_UNCLEAN_FILE = re.compile(r"corrupted or uncleanly shut down")
_JOURNALD = "systemd-journald"

MAX_MESSAGE_CHARS = 2048
# \Z, not $: "$" also matches before a final newline, which a _BOOT_ID field may hold.
_ID128 = re.compile(r"^[0-9a-f]{32}\Z")
_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
SYSTEM_JOURNAL_ROOTS = (Path("/run/log/journal"), Path("/var/log/journal"))


def _iso(usec: int) -> str:
    """A journal timestamp (µs since the epoch) for a message.

    Header fields are read raw from the file: a damaged header can hold any
    64-bit value, far past what ``datetime`` holds (year 9999).
    """
    try:
        return (_EPOCH + timedelta(microseconds=usec)).isoformat(timespec="microseconds")
    except OverflowError:
        return f"{usec} µs after 1970, past year 9999"


def _text(raw: bytes | None) -> str:
    if raw is None:
        return ""
    text = raw.decode("utf-8", "replace")
    if len(text) > MAX_MESSAGE_CHARS:
        return text[:MAX_MESSAGE_CHARS] + "…"
    return text


def normalise_boot_id(raw: str) -> str:
    """A boot id as journald writes it: 32 lowercase hex digits, no dashes."""
    boot_id = raw.strip().replace("-", "").lower()
    if not _ID128.match(boot_id):
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


# -- reading entries ----------------------------------------------------------


@dataclass(frozen=True)
class _Line:
    """The few fields of one entry the probe needs (read where the reader stands)."""

    realtime: int  # µs since the epoch
    monotonic: int  # µs since boot
    entry_boot: str  # the entry object's boot id (present even without _BOOT_ID)
    boot_id: str  # the _BOOT_ID field, "" when missing
    transport: str
    identifier: str
    message_id: str
    message: str
    cursor: str

    @property
    def order(self) -> tuple[int, int]:
        # Within one boot sd-journal orders by the monotonic clock.
        return (self.monotonic, self.realtime)


def _field(reader: Any, name: str) -> bytes | None:
    try:
        value = reader._get(name)
    except KeyError:
        return None
    return value if isinstance(value, bytes) else None


def _line_here(reader: Any) -> _Line:
    # The public get_next() decodes every field of every entry (~15 µs each,
    # measured); the _Reader accessors it is built on fetch only what we ask
    # for (~2 µs), which matters when a boot has 10^5 NVRM lines.
    monotonic, entry_boot = reader._get_monotonic()
    return _Line(
        realtime=int(reader._get_realtime()),
        monotonic=int(monotonic),
        entry_boot=bytes(entry_boot).hex(),
        boot_id=_text(_field(reader, "_BOOT_ID")),
        transport=_text(_field(reader, "_TRANSPORT")),
        identifier=_text(_field(reader, "SYSLOG_IDENTIFIER")),
        message_id=_text(_field(reader, "MESSAGE_ID")),
        message=_text(_field(reader, "MESSAGE")),
        cursor=str(reader._get_cursor()),
    )


@dataclass
class _BootScan:
    """What one source (the merged healthy files, or one damaged file) holds of a boot."""

    boot_id: str
    first: _Line
    last: _Line
    window: int
    evidence_per_kind: int
    tail: deque[_Line] = field(init=False)
    evidence: dict[str, deque[_Line]] = field(init=False)
    counts: Counter[str] = field(default_factory=Counter)
    kernel_lines: int = 0
    lines_noted: int = 0
    uncleanly_logged: bool = False
    resume_cursor: str | None = None  # last entry the evidence scan has seen
    source: str | None = None  # the damaged file this came from, if any

    def __post_init__(self) -> None:
        self.tail = deque(maxlen=self.window)
        self.evidence = {k: deque(maxlen=self.evidence_per_kind) for k in EVIDENCE_KINDS}

    def note(self, line: _Line) -> None:
        """Count one kernel or journald line of the boot."""
        self.lines_noted += 1
        if line.identifier == _JOURNALD and _UNCLEAN_FILE.search(line.message):
            self.uncleanly_logged = True
        if line.transport != "kernel":
            return
        self.kernel_lines += 1
        for kind, pattern in _EVIDENCE_PATTERNS.items():
            if pattern.search(line.message):
                self.counts[kind] += 1
                self.evidence[kind].append(line)


def _evidence_matches(reader: Any, boot_id: str) -> None:
    """Kernel lines of the boot, or journald's own lines (any transport)."""
    reader.flush_matches()
    reader.add_match(_BOOT_ID=boot_id, _TRANSPORT="kernel")
    reader.add_disjunction()
    reader.add_match(_BOOT_ID=boot_id, SYSLOG_IDENTIFIER=_JOURNALD)


def _boot_bounds(reader: Any, boot_id: str) -> tuple[_Line, _Line] | None:
    reader.flush_matches()
    reader.add_match(_BOOT_ID=boot_id)
    reader.seek_head()
    if not reader._next():
        return None
    first = _line_here(reader)
    reader.seek_tail()
    if not reader._previous():
        return None
    return first, _line_here(reader)


def _read_tail(reader: Any, boot_id: str, count: int) -> list[_Line]:
    reader.flush_matches()
    reader.add_match(_BOOT_ID=boot_id)
    reader.seek_tail()
    lines: list[_Line] = []
    while len(lines) < count and reader._previous():
        lines.append(_line_here(reader))
    lines.reverse()
    return lines


def _scan_forward(reader: Any, resume: str | None, visit: Callable[[_Line], None]) -> str | None:
    """Visit every matching entry after ``resume``; return the cursor of the last one.

    sd-journal's forward iteration silently stops where an entry index is
    damaged, while seeking to the tail finds a later entry, or none at all
    (both seen by experiment). So the scan must end on the entry ``seek_tail``
    finds; when it cannot get there, :class:`_IndexBroken`. Entries appended
    meanwhile (the live boot) just mean another round.
    """
    stuck_at: str | None = None
    for _ in range(_CATCH_UP_ROUNDS):
        if resume is None:
            reader.seek_head()
        else:
            reader.seek_cursor(resume)
            # seek_cursor lands on the remembered entry; step onto it first.
            if not (reader._next() and reader.test_cursor(resume)):
                raise _ResumeLost
        progressed = False
        while reader._next():
            line = _line_here(reader)
            visit(line)
            resume, progressed = line.cursor, True
        reader.seek_tail()
        if not reader._previous():
            if resume is None:
                return None  # nothing matches
            raise _IndexBroken  # read forward, yet not there from the end
        if resume is not None and reader.test_cursor(resume):
            return resume
        tail = str(reader._get_cursor())
        # No step forward twice towards the same tail: not a race with a writer.
        if not progressed and tail == stuck_at:
            raise _IndexBroken
        stuck_at = None if progressed else tail
    return resume


_CATCH_UP_ROUNDS = 5


class _ResumeLost(Exception):
    """The entry an incremental scan stopped at is gone: scan the boot again."""


class _IndexBroken(Exception):
    """Reading forward stops before the last matching entry: an index is damaged."""


def _scan_evidence(reader: Any, scan: _BootScan) -> None:
    """Feed the boot's kernel/journald lines after ``scan.resume_cursor`` to ``scan``."""
    _evidence_matches(reader, scan.boot_id)
    scan.resume_cursor = _scan_forward(reader, scan.resume_cursor, scan.note)


def _index_broken(journal: Any, path: Path, boot_id: str) -> bool:
    """Whether this one file's index stops forward reads of the boot's evidence early."""
    with journal.Reader(files=[str(path)]) as reader:
        _evidence_matches(reader, boot_id)
        try:
            _scan_forward(reader, None, lambda line: None)
        except _IndexBroken:
            return True
    return False


# -- checking files -----------------------------------------------------------

# Header layout from https://systemd.io/JOURNAL_FILE_FORMAT/: signature, flags,
# state, ids, then le64 fields up to tail_entry_monotonic (208 bytes).
_HEADER = struct.Struct("<8sIIB7x16s16s16s16s15Q")


@dataclass(frozen=True)
class _Header:
    tail_boot: str
    n_entries: int
    head_realtime: int
    tail_realtime: int
    tail_monotonic: int


def _read_header(path: Path) -> _Header | None:
    try:
        with path.open("rb") as handle:
            raw = handle.read(_HEADER.size)
    except OSError:
        return None
    if len(raw) < _HEADER.size:
        return None
    values = _HEADER.unpack(raw)
    if values[0] != b"LPKSHHRH":
        return None
    return _Header(
        tail_boot=bytes(values[6]).hex(),
        n_entries=values[16],
        head_realtime=values[20],
        tail_realtime=values[21],
        tail_monotonic=values[22],
    )


_OPEN_HINTS = {
    errno.ENODATA: "file is shorter than its header says (truncated)",
    errno.EBADMSG: "not a valid journal file (corrupt header)",
    errno.EPROTONOSUPPORT: "journal format too new for this libsystemd",
    errno.EACCES: "permission denied (run as root or in group systemd-journal or adm)",
    errno.EPERM: "permission denied (run as root or in group systemd-journal or adm)",
    errno.ENOENT: "file vanished (rotated or vacuumed)",
}


def _open_error(path: Path, exc: OSError) -> JournalFileError:
    hint = _OPEN_HINTS.get(exc.errno or 0, exc.strerror or str(exc))
    return JournalFileError(str(path), f"cannot open: {hint} [{exc.strerror or exc}]")


def _check_file(journal: Any, path: Path, current_boot: str | None) -> JournalFileError | None:
    """None when the file is healthy; a JournalFileError saying what is wrong otherwise.

    Raises OSError when the file cannot be opened at all.
    """
    with journal.Reader(files=[str(path)]) as reader:
        header = _read_header(path)
        if header is None:
            return JournalFileError(str(path), "cannot read the journal header")
        if header.n_entries == 0:
            return None
        if header.tail_boot == current_boot:
            # journald may be appending to it right now (it flips files OFFLINE
            # between syncs, so the state field does not tell): header and
            # entries race. Damage matters for finished boots.
            return None
        reader.seek_head()
        if not reader._next():
            return _damage(path, f"header lists {header.n_entries} entries, none readable")
        head = _line_here(reader)
        reader.seek_tail()
        if not reader._previous():
            return _damage(path, "no entry readable from the end (entry index damaged)")
        tail = _line_here(reader)
        if head.realtime != header.head_realtime:
            return _damage(
                path, f"first entry unreadable (header says {_iso(header.head_realtime)})"
            )
        if _older_than_header(tail, header):
            return _damage(
                path,
                f"last readable entry is at {_iso(tail.realtime)}, header says "
                f"{_iso(header.tail_realtime)}: entries at the end are unreadable",
            )
        for line, bound in ((head, "first"), (tail, "last")):
            if line.boot_id != line.entry_boot:
                continue  # an entry without a proper _BOOT_ID field: nothing to match
            ends = _boot_bounds(reader, line.boot_id)
            found = None if ends is None else ends[0 if bound == "first" else 1]
            if found is None or found.cursor != line.cursor:
                return _damage(
                    path, f"index for boot {line.boot_id} damaged: its {bound} entry is lost"
                )
    return None


def _older_than_header(tail: _Line, header: _Header) -> bool:
    if (tail.realtime, tail.monotonic, tail.entry_boot) == (
        header.tail_realtime,
        header.tail_monotonic,
        header.tail_boot,
    ):
        return False
    # A header page that missed the disk lags its entries: that loses nothing.
    if tail.entry_boot == header.tail_boot:
        return tail.monotonic < header.tail_monotonic
    return tail.realtime < header.tail_realtime


def _damage(path: Path, reason: str) -> JournalFileError:
    return JournalFileError(str(path), f"damaged: {reason}; salvaged what reads forward")


def _salvage(journal: Any, path: Path, window: int, per_kind: int) -> tuple[list[_BootScan], int]:
    """Read a damaged file forward without matches, boot by boot."""
    scans: dict[str, _BootScan] = {}
    read = 0
    with journal.Reader(files=[str(path)]) as reader:
        reader.seek_head()
        while _next_or_stop(reader):
            line = _line_here(reader)
            read += 1
            boot = line.boot_id if _ID128.match(line.boot_id) else line.entry_boot
            scan = scans.get(boot)
            if scan is None:
                scan = scans[boot] = _BootScan(boot, line, line, window, per_kind)
                scan.source = str(path)
            scan.last = line
            scan.tail.append(line)
            if line.transport == "kernel" or line.identifier == _JOURNALD:
                scan.note(line)
    return list(scans.values()), read


def _next_or_stop(reader: Any) -> bool:
    try:
        return bool(reader._next())
    except OSError:  # salvage keeps what it read before the damage
        return False


def journal_files(directory: Path | None, machine_id: str | None = None) -> list[Path]:
    """The files sd-journal would read: ``*.journal`` and ``*.journal~`` in each
    root and its machine-id subdirectories (only this machine's for the system
    journal, like journalctl's default)."""
    roots = [directory] if directory is not None else list(SYSTEM_JOURNAL_ROOTS)
    found: list[Path] = []
    for root in roots:
        folders = [root]
        try:
            children = sorted(root.iterdir())
        except OSError:
            continue
        for child in children:
            if child.is_dir() and _ID128.match(child.name):
                if directory is None and machine_id is not None and child.name != machine_id:
                    continue
                folders.append(child)
        for folder in folders:
            try:
                names = sorted(folder.iterdir())
            except OSError:
                continue
            found += [
                p for p in names if p.name.endswith((".journal", ".journal~")) and p.is_file()
            ]
    return found


def unlistable_folders(directory: Path | None) -> list[Path]:
    """The journal folders :func:`journal_files` would list but may not (mode 000, or
    no systemd-journal group): "no journal files" would be wrong there."""
    roots = [directory] if directory is not None else list(SYSTEM_JOURNAL_ROOTS)
    denied: list[Path] = []
    for root in roots:
        try:
            children = sorted(root.iterdir())
        except PermissionError:
            denied.append(root)
            continue
        except OSError:
            continue
        for child in children:
            if _ID128.match(child.name) and child.is_dir():
                try:
                    next(iter(child.iterdir()), None)
                except PermissionError:
                    denied.append(child)
                except OSError:
                    continue
    return denied


def _machine_id() -> str | None:
    try:
        text = Path("/etc/machine-id").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if _ID128.match(text) else None


def _systemd_journal() -> Any | None:
    try:
        return importlib.import_module("systemd.journal")
    except ImportError:
        return None


# -- merging and judging ------------------------------------------------------


def _clean_shutdown(tail: Sequence[_Line]) -> bool:
    for line in reversed(tail[-CLOSING_WINDOW:]):
        if line.message_id == JOURNAL_STOP:
            return True
        if line.message_id == JOURNAL_START:
            return False
    return False


def _boot_record(
    scans: Sequence[_BootScan], current: bool, tail_entries: int, per_kind: int
) -> BootRecord:
    def newest(lines: Iterable[_Line], count: int) -> list[_Line]:
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
        first_entry=_EPOCH + timedelta(microseconds=first.realtime),
        last_entry=_EPOCH + timedelta(microseconds=last.realtime),
        current=current,
        clean_shutdown=None if current else _clean_shutdown(tail),
        evidence=tuple(
            Evidence(_EPOCH + timedelta(microseconds=line.realtime), kind, line.message)
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
    salvage: list[_BootScan] | None = None  # a damaged file's boots, read forward

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
        self._scans: dict[str, _BootScan] = {}
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
        files = journal_files(self.directory, None if self.directory else _machine_id())
        if not files:
            denied = unlistable_folders(self.directory)
            if denied:
                return self._unavailable(
                    f"permission denied: cannot list {', '.join(map(str, denied))}"
                )
            return self._unavailable(f"no journal files in {self.source}")
        journal = _systemd_journal()
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
                verdicts[path] = _FileVerdict(path, (0, 0), (0, 0), _open_error(path, exc), False)
                continue
            identity, key = (st.st_dev, st.st_ino), (st.st_size, st.st_mtime_ns)
            known = self._files.get(path)
            if known is not None and (known.identity, known.stat_key) == (identity, key):
                verdicts[path] = known
                continue
            try:
                error = _check_file(journal, path, current)
                verdict = _FileVerdict(path, identity, key, error, openable=True)
            except OSError as exc:
                verdict = _FileVerdict(path, identity, key, _open_error(path, exc), openable=False)
            verdicts[path] = verdict
        self._files = verdicts  # files that are gone are forgotten

    def _scan_healthy(self, journal: Any) -> dict[str, list[_BootScan]]:
        """Scan the healthy files as one merged view; find and set aside files whose
        index turns out to be damaged (that only shows while scanning)."""
        for _ in range(_CATCH_UP_ROUNDS):
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
            except _IndexBroken as broken:
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
            if _index_broken(journal, path, boot_id):
                self._files[path].error = _damage(
                    path, f"index for boot {boot_id} damaged: reading forward stops early"
                )
                found = True
        return found

    def _salvage(
        self, journal: Any, verdict: _FileVerdict, sources: dict[str, list[_BootScan]]
    ) -> None:
        if verdict.salvage is None:
            verdict.salvage, read = _salvage(
                journal, verdict.path, self._window, self.evidence_per_kind
            )
            self._scanned += read
        for scan in verdict.salvage:
            sources.setdefault(scan.boot_id, []).append(scan)

    def _scan_view(self, journal: Any, files: Sequence[Path]) -> dict[str, list[_BootScan]]:
        sources: dict[str, list[_BootScan]] = {}
        with journal.Reader(files=[str(p) for p in files]) as reader:
            bounds: dict[str, tuple[_Line, _Line]] = {}
            for value in reader.query_unique("_BOOT_ID"):
                boot_id = _boot_id_value(value)
                ends = None if boot_id is None else _boot_bounds(reader, boot_id)
                if boot_id is not None and ends is not None:
                    bounds[boot_id] = ends
            newest = sorted(bounds, key=lambda b: bounds[b][0].realtime)[-self.max_boots :]
            scans: dict[str, _BootScan] = {}
            for boot_id in newest:
                try:
                    scans[boot_id] = self._boot_scan(reader, boot_id, *bounds[boot_id])
                except _IndexBroken:
                    self._scans.update(scans)  # keep what was scanned for the retry
                    raise _IndexBroken(boot_id) from None
                sources[boot_id] = [scans[boot_id]]
        self._scans = scans  # boots that fell out of the window are forgotten
        return sources

    def _boot_scan(self, reader: Any, boot_id: str, first: _Line, last: _Line) -> _BootScan:
        scan = self._scans.get(boot_id)
        if scan is not None and scan.first.cursor == first.cursor:
            if scan.last.cursor == last.cursor:
                return scan  # nothing new in this boot
            try:
                self._evidence(reader, scan)
            except _ResumeLost:
                pass
            else:
                scan.last = last
                scan.tail.clear()
                scan.tail.extend(_read_tail(reader, boot_id, self._window))
                return scan
        scan = _BootScan(boot_id, first, last, self._window, self.evidence_per_kind)
        self._evidence(reader, scan)
        scan.tail.extend(_read_tail(reader, boot_id, self._window))
        return scan

    def _evidence(self, reader: Any, scan: _BootScan) -> None:
        before = scan.lines_noted
        try:
            _scan_evidence(reader, scan)
        finally:
            self._scanned += scan.lines_noted - before


def _boot_id_value(value: object) -> str | None:
    # Reader.query_unique converts _BOOT_ID to uuid.UUID, or leaves bytes when
    # the value is not a UUID (a bad entry); those cannot be matched sensibly.
    hex_value = getattr(value, "hex", None)
    if isinstance(hex_value, str) and _ID128.match(hex_value):
        return hex_value
    return None
