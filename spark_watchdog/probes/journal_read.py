"""Reading systemd journal files for the journal probe (probes/journal.py): the
entries of a boot, its bounds and its last lines, the kernel evidence in it,
and the files themselves, checked before they are trusted and salvaged when
damaged (docs/facts.md, "Persistent journal and sync")."""

from __future__ import annotations

import errno
import importlib
import logging
import re
import struct
from collections import Counter, deque
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

from spark_watchdog.errors import JournalFileError

log = logging.getLogger("spark_watchdog.probes.journal")


EVIDENCE_KINDS = ("xid", "nv_err_no_memory", "fallen_off_bus", "aer", "soft_lockup", "hung_task")

EVIDENCE_PATTERNS: dict[str, re.Pattern[str]] = {
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
UNCLEAN_FILE = re.compile(r"corrupted or uncleanly shut down")

JOURNALD = "systemd-journald"


MAX_MESSAGE_CHARS = 2048

# \Z, not $: "$" also matches before a final newline, which a _BOOT_ID field may hold.
ID128 = re.compile(r"^[0-9a-f]{32}\Z")

EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)


SYSTEM_JOURNAL_ROOTS = (Path("/run/log/journal"), Path("/var/log/journal"))


def iso_time(usec: int) -> str:
    """A journal timestamp (µs since the epoch) for a message.

    Header fields are read raw from the file: a damaged header can hold any
    64-bit value, far past what ``datetime`` holds (year 9999).
    """
    try:
        return (EPOCH + timedelta(microseconds=usec)).isoformat(timespec="microseconds")
    except OverflowError:
        return f"{usec} µs after 1970, past year 9999"


def decoded_text(raw: bytes | None) -> str:
    if raw is None:
        return ""
    text = raw.decode("utf-8", "replace")
    if len(text) > MAX_MESSAGE_CHARS:
        return text[:MAX_MESSAGE_CHARS] + "…"
    return text


@dataclass(frozen=True)
class JournalLine:
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


def _line_here(reader: Any) -> JournalLine:
    # The public get_next() decodes every field of every entry (~15 µs each,
    # measured); the _Reader accessors it is built on fetch only what we ask
    # for (~2 µs), which matters when a boot has 10^5 NVRM lines.
    monotonic, entry_boot = reader._get_monotonic()
    return JournalLine(
        realtime=int(reader._get_realtime()),
        monotonic=int(monotonic),
        entry_boot=bytes(entry_boot).hex(),
        boot_id=decoded_text(_field(reader, "_BOOT_ID")),
        transport=decoded_text(_field(reader, "_TRANSPORT")),
        identifier=decoded_text(_field(reader, "SYSLOG_IDENTIFIER")),
        message_id=decoded_text(_field(reader, "MESSAGE_ID")),
        message=decoded_text(_field(reader, "MESSAGE")),
        cursor=str(reader._get_cursor()),
    )


@dataclass
class BootScan:
    """What one source (the merged healthy files, or one damaged file) holds of a boot."""

    boot_id: str
    first: JournalLine
    last: JournalLine
    window: int
    evidence_per_kind: int
    tail: deque[JournalLine] = field(init=False)
    evidence: dict[str, deque[JournalLine]] = field(init=False)
    counts: Counter[str] = field(default_factory=Counter)
    kernel_lines: int = 0
    lines_noted: int = 0
    uncleanly_logged: bool = False
    resume_cursor: str | None = None  # last entry the evidence scan has seen
    source: str | None = None  # the damaged file this came from, if any

    def __post_init__(self) -> None:
        self.tail = deque(maxlen=self.window)
        self.evidence = {k: deque(maxlen=self.evidence_per_kind) for k in EVIDENCE_KINDS}

    def note(self, line: JournalLine) -> None:
        """Count one kernel or journald line of the boot."""
        self.lines_noted += 1
        if line.identifier == JOURNALD and UNCLEAN_FILE.search(line.message):
            self.uncleanly_logged = True
        if line.transport != "kernel":
            return
        self.kernel_lines += 1
        for kind, pattern in EVIDENCE_PATTERNS.items():
            if pattern.search(line.message):
                self.counts[kind] += 1
                self.evidence[kind].append(line)


def _evidence_matches(reader: Any, boot_id: str) -> None:
    """Kernel lines of the boot, or journald's own lines (any transport)."""
    reader.flush_matches()
    reader.add_match(_BOOT_ID=boot_id, _TRANSPORT="kernel")
    reader.add_disjunction()
    reader.add_match(_BOOT_ID=boot_id, SYSLOG_IDENTIFIER=JOURNALD)


def boot_bounds(reader: Any, boot_id: str) -> tuple[JournalLine, JournalLine] | None:
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


def read_tail(reader: Any, boot_id: str, count: int) -> list[JournalLine]:
    reader.flush_matches()
    reader.add_match(_BOOT_ID=boot_id)
    reader.seek_tail()
    lines: list[JournalLine] = []
    while len(lines) < count and reader._previous():
        lines.append(_line_here(reader))
    lines.reverse()
    return lines


def _scan_forward(
    reader: Any, resume: str | None, visit: Callable[[JournalLine], None]
) -> str | None:
    """Visit every matching entry after ``resume``; return the cursor of the last one.

    sd-journal's forward iteration silently stops where an entry index is
    damaged, while seeking to the tail finds a later entry, or none at all
    (both seen by experiment). So the scan must end on the entry ``seek_tail``
    finds; when it cannot get there, :class:`IndexBroken`. Entries appended
    meanwhile (the live boot) just mean another round.
    """
    stuck_at: str | None = None
    for _ in range(CATCH_UP_ROUNDS):
        if resume is None:
            reader.seek_head()
        else:
            reader.seek_cursor(resume)
            # seek_cursor lands on the remembered entry; step onto it first.
            if not (reader._next() and reader.test_cursor(resume)):
                raise ResumeLost
        progressed = False
        while reader._next():
            line = _line_here(reader)
            visit(line)
            resume, progressed = line.cursor, True
        reader.seek_tail()
        if not reader._previous():
            if resume is None:
                return None  # nothing matches
            raise IndexBroken  # read forward, yet not there from the end
        if resume is not None and reader.test_cursor(resume):
            return resume
        tail = str(reader._get_cursor())
        # No step forward twice towards the same tail: not a race with a writer.
        if not progressed and tail == stuck_at:
            raise IndexBroken
        stuck_at = None if progressed else tail
    return resume


CATCH_UP_ROUNDS = 5


class ResumeLost(Exception):
    """The entry an incremental scan stopped at is gone: scan the boot again."""


class IndexBroken(Exception):
    """Reading forward stops before the last matching entry: an index is damaged."""


def scan_evidence(reader: Any, scan: BootScan) -> None:
    """Feed the boot's kernel/journald lines after ``scan.resume_cursor`` to ``scan``."""
    _evidence_matches(reader, scan.boot_id)
    scan.resume_cursor = _scan_forward(reader, scan.resume_cursor, scan.note)


def index_broken(journal: Any, path: Path, boot_id: str) -> bool:
    """Whether this one file's index stops forward reads of the boot's evidence early."""
    with journal.Reader(files=[str(path)]) as reader:
        _evidence_matches(reader, boot_id)
        try:
            _scan_forward(reader, None, lambda line: None)
        except IndexBroken:
            return True
    return False


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


def open_error(path: Path, exc: OSError) -> JournalFileError:
    hint = _OPEN_HINTS.get(exc.errno or 0, exc.strerror or str(exc))
    return JournalFileError(str(path), f"cannot open: {hint} [{exc.strerror or exc}]")


def check_file(journal: Any, path: Path, current_boot: str | None) -> JournalFileError | None:
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
            return damaged_file(path, f"header lists {header.n_entries} entries, none readable")
        head = _line_here(reader)
        reader.seek_tail()
        if not reader._previous():
            return damaged_file(path, "no entry readable from the end (entry index damaged)")
        tail = _line_here(reader)
        if head.realtime != header.head_realtime:
            return damaged_file(
                path, f"first entry unreadable (header says {iso_time(header.head_realtime)})"
            )
        if _older_than_header(tail, header):
            return damaged_file(
                path,
                f"last readable entry is at {iso_time(tail.realtime)}, header says "
                f"{iso_time(header.tail_realtime)}: entries at the end are unreadable",
            )
        for line, bound in ((head, "first"), (tail, "last")):
            if line.boot_id != line.entry_boot:
                continue  # an entry without a proper _BOOT_ID field: nothing to match
            ends = boot_bounds(reader, line.boot_id)
            found = None if ends is None else ends[0 if bound == "first" else 1]
            if found is None or found.cursor != line.cursor:
                return damaged_file(
                    path, f"index for boot {line.boot_id} damaged: its {bound} entry is lost"
                )
    return None


def _older_than_header(tail: JournalLine, header: _Header) -> bool:
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


def damaged_file(path: Path, reason: str) -> JournalFileError:
    return JournalFileError(str(path), f"damaged: {reason}; salvaged what reads forward")


def salvage_boots(
    journal: Any, path: Path, window: int, per_kind: int
) -> tuple[list[BootScan], int]:
    """Read a damaged file forward without matches, boot by boot."""
    scans: dict[str, BootScan] = {}
    read = 0
    with journal.Reader(files=[str(path)]) as reader:
        reader.seek_head()
        while _next_or_stop(reader):
            line = _line_here(reader)
            read += 1
            boot = line.boot_id if ID128.match(line.boot_id) else line.entry_boot
            scan = scans.get(boot)
            if scan is None:
                scan = scans[boot] = BootScan(boot, line, line, window, per_kind)
                scan.source = str(path)
            scan.last = line
            scan.tail.append(line)
            if line.transport == "kernel" or line.identifier == JOURNALD:
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
            if child.is_dir() and ID128.match(child.name):
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
            if ID128.match(child.name) and child.is_dir():
                try:
                    next(iter(child.iterdir()), None)
                except PermissionError:
                    denied.append(child)
                except OSError:
                    continue
    return denied


def own_machine_id() -> str | None:
    try:
        text = Path("/etc/machine-id").read_text(encoding="ascii").strip()
    except (OSError, UnicodeDecodeError):
        return None
    return text if ID128.match(text) else None


def systemd_journal() -> Any | None:
    try:
        return importlib.import_module("systemd.journal")
    except ImportError:
        return None
