"""Write real systemd journal files, for tests and for the lab's simulated nodes.

Entries are serialised in the journal export format
(https://systemd.io/JOURNAL_EXPORT_FORMATS/) and piped to
``systemd-journal-remote --output=FILE.journal -``, which writes a genuine
journal file that ``journalctl`` and ``systemd.journal.Reader`` read like any
other. ``--split-mode=none`` is required for a single output file (and for
reading from stdin); the output name must end in ``.journal``.

Found by experiment (systemd 252): writing to an existing file appends to it;
an entry without ``__REALTIME_TIMESTAMP`` is dropped ("Entry is invalid,
ignoring"); the file header gets the writing machine's machine id whatever
``_MACHINE_ID`` the entries carry.

One file per boot in a node's journal directory is the lab's layout: sd-journal
merges every ``*.journal`` file of a directory, so a new boot is a new file.
"""

from __future__ import annotations

import os
import re
import struct
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone
from enum import Enum
from pathlib import Path

from spark_watchdog.errors import WatchdogError

JOURNAL_REMOTE_PATHS = (
    Path("/lib/systemd/systemd-journal-remote"),
    Path("/usr/lib/systemd/systemd-journal-remote"),
)

# Message ids from systemd's sd-messages.h (docs/facts.md, "How a boot ended").
JOURNAL_START = "f77379a8490b408bbe5f6940505a777b"
JOURNAL_STOP = "d93fb3c9c24d451a97cea615ce59c00b"
LOGIND_SHUTDOWN = "98268866d1d54a499c4e98921d93bc40"

_EPOCH = datetime(1970, 1, 1, tzinfo=timezone.utc)
DEFAULT_MACHINE_ID = "5ba2c0ffee5ba2c0ffee5ba2c0ffee01"
_ID128 = re.compile(r"^[0-9a-f]{32}$")
_FIELD_NAME = re.compile(r"^_{0,2}[A-Z0-9][A-Z0-9_]*$")


class JournalWriteError(WatchdogError):
    """A journal file could not be written (tool missing, or it refused the input)."""


class Fault(Enum):
    """Kernel lines that precede or accompany a GB10 host freeze
    (docs/facts.md, "Freeze precursors")."""

    XID_31 = "xid"
    NV_ERR_NO_MEMORY = "nv_err_no_memory"
    FALLEN_OFF_BUS = "fallen_off_bus"
    AER = "aer"
    SOFT_LOCKUP = "soft_lockup"
    HUNG_TASK = "hung_task"


class Ending(Enum):
    """How a boot's journal ends."""

    # logind (optional), PID 1 and systemd-shutdown lines, then journald's
    # "Journal stopped": the last thing a journald instance writes.
    CLEAN_SHUTDOWN = "clean_shutdown"
    # The journal just stops: power loss, a frozen host, or a boot still running.
    POWER_LOSS = "power_loss"


# Shapes of real driver/kernel lines. Xid 31 and the _memdescAllocInternal
# assertion: vllm #54385, #53726, #56824; the rest are stock kernel wording.
FAULT_MESSAGES: dict[Fault, str] = {
    Fault.XID_31: (
        "NVRM: Xid (PCI:000f:01:00): 31, pid=4242, name=python3, Ch 00000008, intr 00000000. "
        "MMU Fault: ENGINE GRAPHICS GPCCLIENT_T1_0 faulted @ 0x7f3a_1c000000. "
        "Fault is of type FAULT_PDE ACCESS_TYPE_VIRT_READ"
    ),
    Fault.NV_ERR_NO_MEMORY: (
        "NVRM: nvAssertOkFailedNoLog: Assertion failed: Out of memory [NV_ERR_NO_MEMORY] "
        "(0x00000051) returned from _memdescAllocInternal(pMemDesc) @ mem_desc.c:1359"
    ),
    Fault.FALLEN_OFF_BUS: "NVRM: GPU at PCI:000f:01:00: GPU-5ba2c0ff has fallen off the bus.",
    Fault.AER: (
        "pcieport 000f:00:00.0: AER: Uncorrected (Fatal) error message received from 000f:01:00.0"
    ),
    Fault.SOFT_LOCKUP: "watchdog: BUG: soft lockup - CPU#7 stuck for 26s! [python3:4242]",
    Fault.HUNG_TASK: "INFO: task python3:4242 blocked for more than 120 seconds.",
}


@dataclass(frozen=True)
class JournalEntry:
    """One journal entry. ``message=None`` or ``boot_id=None`` leave the field out."""

    realtime: datetime
    monotonic_usec: int
    boot_id: str | None
    message: str | bytes | None
    priority: int | None = 6
    transport: str = "kernel"
    identifier: str | None = None
    message_id: str | None = None
    pid: int | None = None
    hostname: str = "spark-1"
    machine_id: str = DEFAULT_MACHINE_ID
    extra: tuple[tuple[str, str | bytes], ...] = ()

    def __post_init__(self) -> None:
        if self.realtime.tzinfo is None:
            raise ValueError("JournalEntry.realtime must be timezone-aware")
        for name, value in (("boot_id", self.boot_id), ("machine_id", self.machine_id)):
            if value is not None and not _ID128.match(value):
                raise ValueError(f"JournalEntry.{name}: expected 32 lowercase hex, got {value!r}")
        for name, _ in self.extra:
            if not _FIELD_NAME.match(name):
                raise ValueError(f"JournalEntry.extra: invalid journal field name {name!r}")

    def fields(self) -> list[tuple[str, str | bytes]]:
        """The entry's fields in export order (the ``__`` timestamps first)."""
        usec = (self.realtime - _EPOCH) // timedelta(microseconds=1)
        out: list[tuple[str, str | bytes]] = [
            ("__REALTIME_TIMESTAMP", str(usec)),
            ("__MONOTONIC_TIMESTAMP", str(self.monotonic_usec)),
        ]
        if self.boot_id is not None:
            out.append(("_BOOT_ID", self.boot_id))
        out += [("_MACHINE_ID", self.machine_id), ("_HOSTNAME", self.hostname)]
        out.append(("_TRANSPORT", self.transport))
        if self.priority is not None:
            out.append(("PRIORITY", str(self.priority)))
        if self.identifier is not None:
            out.append(("SYSLOG_IDENTIFIER", self.identifier))
        if self.pid is not None:
            out.append(("_PID", str(self.pid)))
        if self.message_id is not None:
            out.append(("MESSAGE_ID", self.message_id))
        if self.message is not None:
            out.append(("MESSAGE", self.message))
        out += list(self.extra)
        return out

    def export(self) -> bytes:
        """The entry in journal export format, ending with the blank separator line."""
        return b"".join(_export_field(name, value) for name, value in self.fields()) + b"\n"


def _export_field(name: str, value: str | bytes) -> bytes:
    raw = value.encode("utf-8") if isinstance(value, str) else value
    # Text form only for printable UTF-8 without newlines; anything else (a
    # multi-line message, control bytes, invalid UTF-8) needs the binary form:
    # name, newline, little-endian 64-bit length, the bytes, newline.
    if _is_plain_text(raw):
        return name.encode("ascii") + b"=" + raw + b"\n"
    return name.encode("ascii") + b"\n" + struct.pack("<Q", len(raw)) + raw + b"\n"


def _is_plain_text(raw: bytes) -> bool:
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return all(ch == "\t" or (ch >= " " and ch != "\x7f") for ch in text)


def export_stream(entries: Iterable[JournalEntry]) -> bytes:
    """Entries in journal export format, ready for ``systemd-journal-remote``."""
    return b"".join(entry.export() for entry in entries)


def find_journal_remote() -> Path:
    """Path of ``systemd-journal-remote``; :class:`JournalWriteError` if not installed."""
    for path in JOURNAL_REMOTE_PATHS:
        if os.access(path, os.X_OK):
            return path
    where = " or ".join(str(p) for p in JOURNAL_REMOTE_PATHS)
    raise JournalWriteError(
        f"systemd-journal-remote not found at {where}: install the Debian/Ubuntu package "
        "systemd-journal-remote (Fedora: systemd-journal-remote) to write journal files"
    )


def write_journal(
    path: str | os.PathLike[str],
    entries: Sequence[JournalEntry],
    *,
    journal_remote: str | os.PathLike[str] | None = None,
) -> Path:
    """Write (or append) ``entries`` to the journal file ``path`` (must end in ``.journal``)."""
    target = Path(path)
    if target.suffix != ".journal":
        raise JournalWriteError(f"{target}: a journal file name must end in .journal")
    if not entries:
        raise JournalWriteError(f"{target}: no entries to write")
    tool = Path(journal_remote) if journal_remote is not None else find_journal_remote()
    if not os.access(tool, os.X_OK):
        raise JournalWriteError(
            f"{tool}: not an executable systemd-journal-remote; install the Debian package "
            "systemd-journal-remote"
        )
    argv = [str(tool), "--split-mode=none", "--compress=yes", f"--output={target}", "-"]
    try:
        done = subprocess.run(
            argv, input=export_stream(entries), capture_output=True, timeout=60, check=False
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise JournalWriteError(f"{target}: running {tool} failed: {exc}") from exc
    stderr = done.stderr.decode("utf-8", "replace").strip()
    if done.returncode != 0:
        raise JournalWriteError(f"{target}: {tool} exited {done.returncode}: {stderr}")
    # journal-remote drops entries it finds invalid and only says so on stderr.
    written = re.search(r"Finishing after writing (\d+) entries", stderr)
    if written is not None and int(written.group(1)) != len(entries):
        raise JournalWriteError(
            f"{target}: {tool} wrote {written.group(1)} of {len(entries)} entries: {stderr}"
        )
    return target


def write_boot(directory: str | os.PathLike[str], entries: Sequence[JournalEntry]) -> Path:
    """Append one boot's entries to ``DIRECTORY/boot-<boot id>.journal``.

    Calling it again for the same boot appends to the same file, which is how
    the lab grows a running boot's journal.
    """
    boot_ids = {entry.boot_id for entry in entries}
    if len(boot_ids) != 1 or None in boot_ids:
        raise JournalWriteError(f"write_boot: expected entries of one boot, got {boot_ids}")
    (boot_id,) = boot_ids
    folder = Path(directory)
    folder.mkdir(parents=True, exist_ok=True)
    return write_journal(folder / f"boot-{boot_id}.journal", entries)


class BootTimeline:
    """Builds one boot's entries in time order: each line ``step`` after the last.

    The monotonic clock counts from ``start`` (the boot), so keep one timeline
    per boot and let it grow: :meth:`write` appends only what is new.
    """

    def __init__(
        self,
        boot_id: str,
        start: datetime,
        *,
        hostname: str = "spark-1",
        machine_id: str = DEFAULT_MACHINE_ID,
        step: timedelta = timedelta(seconds=1),
    ) -> None:
        self.boot_id = boot_id
        self.start = start
        self.hostname = hostname
        self.machine_id = machine_id
        self.step = step
        self.entries: list[JournalEntry] = []
        self._written = 0

    def write(self, directory: str | os.PathLike[str]) -> Path | None:
        """Append the entries added since the last write to the boot's file in
        ``directory`` (see :func:`write_boot`); None when there is nothing new."""
        fresh = self.entries[self._written :]
        if not fresh:
            return None
        path = write_boot(directory, fresh)
        self._written = len(self.entries)
        return path

    def add(
        self,
        message: str | bytes | None,
        *,
        transport: str = "kernel",
        identifier: str | None = None,
        message_id: str | None = None,
        priority: int | None = 6,
        pid: int | None = None,
    ) -> JournalEntry:
        offset = self.step * (len(self.entries) + 1)
        entry = JournalEntry(
            realtime=self.start + offset,
            monotonic_usec=offset // timedelta(microseconds=1),
            boot_id=self.boot_id,
            message=message,
            priority=priority,
            transport=transport,
            identifier=identifier,
            message_id=message_id,
            pid=pid,
            hostname=self.hostname,
            machine_id=self.machine_id,
        )
        self.entries.append(entry)
        return entry

    def kernel(self, message: str, priority: int = 6) -> JournalEntry:
        return self.add(message, identifier="kernel", priority=priority)

    def journald(self, message: str, message_id: str | None = None) -> JournalEntry:
        # journald's own structured messages arrive over the "driver" transport;
        # its log_*() lines go through kmsg and come back as "kernel".
        transport = "driver" if message_id is not None else "kernel"
        return self.add(
            message,
            transport=transport,
            identifier="systemd-journald",
            message_id=message_id,
            pid=412,
        )

    def service(self, identifier: str, message: str, pid: int = 2100) -> JournalEntry:
        return self.add(message, transport="stdout", identifier=identifier, pid=pid)

    def fault(self, fault: Fault) -> JournalEntry:
        return self.kernel(FAULT_MESSAGES[fault], priority=3)


def boot_entries(
    boot_id: str,
    start: datetime,
    *,
    hostname: str = "spark-1",
    machine_id: str = DEFAULT_MACHINE_ID,
    service_lines: int = 3,
    faults: Sequence[Fault] = (),
    ending: Ending = Ending.CLEAN_SHUTDOWN,
    logind_shutdown: bool = True,
    after_unclean: bool = False,
    step: timedelta = timedelta(seconds=1),
) -> list[JournalEntry]:
    """A boot's worth of entries: kernel start, journald start, services, faults, ending.

    ``after_unclean`` adds journald's complaint about the previous boot's file,
    which it logs at start after an unclean stop. ``faults`` are injected in
    order after the service lines (repeat an item for several lines).
    """
    boot = BootTimeline(boot_id, start, hostname=hostname, machine_id=machine_id, step=step)
    boot.kernel("Booting Linux on physical CPU 0x0000000000 [0x410fd871]", priority=5)
    boot.kernel("Linux version 6.11.0-1016-nvidia (buildd@lab) #16-Ubuntu SMP PREEMPT_DYNAMIC")
    boot.kernel("Machine model: NVIDIA DGX Spark")
    boot.journald("Journal started", JOURNAL_START)
    if after_unclean:
        boot.journald(
            f"File /var/log/journal/{machine_id}/system.journal corrupted or uncleanly shut "
            "down, renaming and replacing."
        )
    boot.add("Started vllm-rank.service - vLLM rank.", transport="journal", identifier="systemd")
    for n in range(service_lines):
        boot.service("vllm", f"INFO Engine 000: Avg generation throughput: {40 + n}.0 tokens/s")
    for fault in faults:
        boot.fault(fault)
    if ending is Ending.CLEAN_SHUTDOWN:
        if logind_shutdown:
            boot.add(
                "System is powering down.",
                transport="journal",
                identifier="systemd-logind",
                message_id=LOGIND_SHUTDOWN,
                pid=980,
            )
        boot.add(
            "Stopped vllm-rank.service - vLLM rank.", transport="journal", identifier="systemd"
        )
        boot.add("Shutting down.", transport="journal", identifier="systemd", pid=1)
        boot.add("Syncing filesystems and block devices.", identifier="systemd-shutdown", pid=1)
        boot.journald("Received SIGTERM from PID 1 (systemd-shutdown).")
        boot.journald("Journal stopped", JOURNAL_STOP)
    return boot.entries


def shutdown_lines(boot: BootTimeline) -> None:
    """How a reboot ends a boot's journal: logind, PID 1, systemd-shutdown,
    then journald's "Journal stopped" (what makes a boot's end clean)."""
    boot.add(
        "System is rebooting.",
        transport="journal",
        identifier="systemd-logind",
        message_id=LOGIND_SHUTDOWN,
        pid=980,
    )
    boot.add("Stopped spark-watchdog-agent.service.", transport="journal", identifier="systemd")
    boot.add("Shutting down.", transport="journal", identifier="systemd", pid=1)
    boot.add("Syncing filesystems and block devices.", identifier="systemd-shutdown", pid=1)
    boot.journald("Received SIGTERM from PID 1 (systemd-shutdown).")
    boot.journald("Journal stopped", JOURNAL_STOP)
