"""Fuzz harnesses for the parsers that read what other machines send.

Each target is a function ``(data: bytes) -> None`` that feeds one parser the
way the product does and lets only that parser's documented errors escape
(``Target.expected``). Anything else that escapes is a finding. The same
functions drive the bounded hypothesis run (tests/fuzz) and the long run
(``python -m bench.fuzz``).

Targets:

- ``metrics``: vLLM's ``/metrics`` body (Prometheus text) through
  ``parse_metrics``, as the vLLM probe decodes it; ``MetricsFormatError``.
- ``journal``: journal entries (timestamps, boot ids, MESSAGE bytes, message
  ids) and a journal file header through the journal probe's checks, boot
  bounds, evidence scan, salvage and report; ``ProbeError``. sd-journal itself
  is replaced by an in-memory reader with the same accessors: the bytes a
  journal file yields are the input here, not the file format.
- ``snmp``: SNMP answers (BER-encoded VarBindLists, error statuses) through
  ``SnmpPdu``/``SnmpOutlet``'s decoding of sysObjectID, outlet status and the
  names walk; ``PowerError``. The transport is replaced; pysnmp's own decoder
  and the project's decoding are real.
- ``snapshot``: an agent's HTTP answer (status line, headers, body) through
  the controller's ``read_answer``, the snapshot reading of ``NodeWatch``,
  the detector and the fault-onset reading; ``HttpError``.
- ``config``: YAML text through ``read_yaml`` and the agent and controller
  config loaders; ``ConfigError``.
- ``intake``: an agent's ``/v1/state`` object (JSON text) through the
  controller's intake and what is built on it, down to the history and the
  page (bench/fuzz_intake.py); nothing expected: every bound is asserted.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import json
import math
import re
import tempfile
import uuid
from collections.abc import Callable, Coroutine, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.fuzz_intake import fuzz_intake

# -- a small deterministic reader of fuzz bytes ---------------------------------


class Bytes:
    """Reads typed values off fuzz input; past the end every read gives zeros."""

    def __init__(self, data: bytes) -> None:
        self.data = data
        self.pos = 0

    def left(self) -> int:
        return len(self.data) - self.pos

    def take(self, count: int) -> bytes:
        chunk = self.data[self.pos : self.pos + count]
        self.pos += len(chunk)
        return chunk

    def u8(self) -> int:
        chunk = self.take(1)
        return chunk[0] if chunk else 0

    def uint(self, size: int) -> int:
        return int.from_bytes(self.take(size).ljust(size, b"\0"), "little")

    def blob(self, limit: int) -> bytes:
        """A length byte (or two, for a limit above 255) and that many bytes."""
        length = self.uint(2) if limit > 255 else self.u8()
        return self.take(min(length, limit))

    def pick(self, options: Sequence[Any]) -> Any:
        return options[self.u8() % len(options)]


def drive(coro: Coroutine[Any, Any, Any]) -> Any:
    """Run a coroutine that never waits on I/O to its end, without an event loop."""
    try:
        coro.send(None)
    except StopIteration as done:
        return done.value
    coro.close()
    raise AssertionError("the harness's coroutine waited on something")


# -- metrics --------------------------------------------------------------------


def fuzz_metrics(data: bytes) -> None:
    from spark_watchdog.probes.vllm_metrics import models_seen, parse_metrics

    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return  # the probe reports "body is not UTF-8" before parsing
    engines = parse_metrics(text)
    for key, sample in engines.items():
        assert key == sample.engine
        for value in (
            sample.running,
            sample.waiting,
            sample.engine_steps,
            sample.generation_tokens,
            sample.prompt_tokens,
        ):
            assert value is None or type(value) is int, value
        kv = sample.kv_cache_usage
        assert kv is None or math.isfinite(kv), kv
    models_seen(engines.values())


# -- journal --------------------------------------------------------------------

_BOOTS = tuple(uuid.UUID(int=(0x5BA2C0FFEE << 64) + n).hex for n in range(1, 5))
_TRANSPORTS = (b"kernel", b"journal", b"syslog", b"stdout", b"driver", b"")
_IDENTIFIERS = (b"kernel", b"systemd-journald", b"systemd", b"sshd", b"")
_MESSAGE_IDS = (
    b"d93fb3c9c24d451a97cea615ce59c00b",  # journal stop
    b"f77379a8490b408bbe5f6940505a777b",  # journal start
    b"98268866d1d54a499c4e98921d93bc40",  # logind shutdown
    b"",
)
_MESSAGES = (
    b"NVRM: Xid (PCI:000f:01:00): 31, pid=1234, name=python3, Ch 00000008",
    b"NVRM: nvAssertOkFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY",
    b"NVRM: GPU 000f:01:00.0: GPU has fallen off the bus.",
    b"pcieport 0000:00:01.0: AER: Corrected error received: 0000:01:00.0",
    b"watchdog: BUG: soft lockup - CPU#3 stuck for 22s! [python3:4242]",
    b"INFO: task python3:4242 blocked for more than 122 seconds.",
    b"Journal stopped",
    b"Journal started",
    b"File /var/log/journal/x/system.journal corrupted or uncleanly shut down, renaming.",
    b"",
)
# sd-journal refuses entries whose realtime is 0 or at least 2^55 (VALID_REALTIME).
_MAX_REALTIME = (1 << 55) - 1
_HEADER_SIZE = 208
_JOURNAL_SIGNATURE = b"LPKSHHRH"


@dataclass
class FakeEntry:
    realtime: int
    monotonic: int
    entry_boot: bytes  # 16 bytes, the entry object's boot id
    fields: dict[str, bytes]
    cursor: str


class FakeReader:
    """The part of ``systemd.journal.Reader`` the journal probe uses, over a list.

    Matches follow sd-journal: terms of one ``add_match`` call and of
    successive calls are ANDed (the same field ORed), ``add_disjunction``
    starts an alternative.
    """

    def __init__(self, entries: Sequence[FakeEntry]) -> None:
        self.entries = list(entries)
        self.groups: list[dict[str, set[bytes]]] = [{}]
        self.pos = -1  # before the head
        self._view: list[FakeEntry] | None = self.entries

    @property
    def view(self) -> list[FakeEntry]:
        if self._view is None:
            self._refresh()
        assert self._view is not None
        return self._view

    def __enter__(self) -> FakeReader:
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def _refresh(self) -> None:
        groups = [g for g in self.groups if g]
        if not groups:
            self._view = self.entries
            return
        self._view = [
            e
            for e in self.entries
            if any(all(e.fields.get(name) in values for name, values in g.items()) for g in groups)
        ]

    def flush_matches(self) -> None:
        self.groups = [{}]
        self._view = None

    def add_match(self, **terms: str) -> None:
        for name, value in terms.items():
            self.groups[-1].setdefault(name, set()).add(value.encode())
        self._view = None

    def add_disjunction(self) -> None:
        self.groups.append({})
        self._view = None

    def seek_head(self) -> None:
        self.pos = -1

    def seek_tail(self) -> None:
        self.pos = len(self.view)

    def seek_cursor(self, cursor: str) -> None:
        for number, entry in enumerate(self.view):
            if entry.cursor == cursor:
                self.pos = number - 1  # the next _next() lands on it
                return
        self.pos = len(self.view)

    def test_cursor(self, cursor: str) -> bool:
        return 0 <= self.pos < len(self.view) and self.view[self.pos].cursor == cursor

    def _next(self) -> bool:
        if self.pos + 1 >= len(self.view):
            self.pos = len(self.view)
            return False
        self.pos += 1
        return True

    def _previous(self) -> bool:
        if self.pos - 1 < 0:
            self.pos = -1
            return False
        self.pos = min(self.pos, len(self.view)) - 1
        return True

    def _here(self) -> FakeEntry:
        if not 0 <= self.pos < len(self.view):
            raise OSError(99, "no entry here (EADDRNOTAVAIL)")
        return self.view[self.pos]

    def _get(self, name: str) -> bytes:
        return self._here().fields[name]

    def _get_realtime(self) -> int:
        return self._here().realtime

    def _get_monotonic(self) -> tuple[int, bytes]:
        entry = self._here()
        return entry.monotonic, entry.entry_boot

    def _get_cursor(self) -> str:
        return self._here().cursor

    def query_unique(self, name: str) -> set[object]:
        values: set[object] = set()
        for entry in self.entries:
            raw = entry.fields.get(name)
            if raw is None:
                continue
            # systemd.journal.Reader converts _BOOT_ID to a UUID, bytes when it cannot.
            try:
                values.add(uuid.UUID(raw.decode()))
            except (ValueError, UnicodeDecodeError):
                values.add(raw)
        return values


class FakeJournalModule:
    """Stands in for ``systemd.journal``: every file path gets its own entries."""

    def __init__(self, files: dict[str, list[FakeEntry]]) -> None:
        self.files = files

    def Reader(self, files: Sequence[str]) -> FakeReader:  # systemd.journal.Reader
        merged: list[FakeEntry] = []
        for path in files:
            if path not in self.files:
                raise OSError(74, f"Bad message: {path}")  # EBADMSG
            merged += self.files[path]
        # Merged files are read in time order, as sd-journal interleaves them.
        merged.sort(key=lambda e: (e.realtime, e.cursor))
        return FakeReader(merged)


def journal_entries(source: Bytes, count: int) -> list[FakeEntry]:
    entries: list[FakeEntry] = []
    for number in range(count):
        flags = source.u8()
        boot = _BOOTS[flags & 3]
        realtime = source.uint(8) & _MAX_REALTIME
        monotonic = source.uint(8) & ((1 << 63) - 1)
        fields: dict[str, bytes] = {}
        if flags & 4:
            fields["_BOOT_ID"] = source.blob(40)  # raw: any bytes a file may hold
        elif not flags & 8:
            fields["_BOOT_ID"] = boot.encode()
        fields["_TRANSPORT"] = source.pick(_TRANSPORTS)
        if flags & 16:
            fields["SYSLOG_IDENTIFIER"] = source.pick(_IDENTIFIERS)
        if flags & 32:
            fields["MESSAGE_ID"] = source.pick(_MESSAGE_IDS)
        message = source.pick(_MESSAGES)
        if flags & 64:
            message += source.blob(3000)
        if flags & 128:
            message = source.blob(3000)
        fields["MESSAGE"] = message
        entry_boot = bytes.fromhex(boot)
        entries.append(FakeEntry(realtime or 1, monotonic, entry_boot, fields, f"c;{number}"))
    return entries


def journal_header(entries: Sequence[FakeEntry], source: Bytes) -> bytes:
    """A header that agrees with ``entries``, then fuzz bytes written over part of it."""
    import struct

    head = entries[0] if entries else None
    tail = entries[-1] if entries else None
    values = [
        _JOURNAL_SIGNATURE,
        0,
        0,
        1,  # STATE_ONLINE
        b"\1" * 16,
        b"\2" * 16,
        tail.entry_boot if tail else b"\0" * 16,
        b"\3" * 16,
        *([0] * 8),
        len(entries),  # n_entries
        *([0] * 3),
        head.realtime if head else 0,
        tail.realtime if tail else 0,
        tail.monotonic if tail else 0,
    ]
    header = bytearray(struct.pack("<8sIIB7x16s16s16s16s15Q", *values))
    patches = source.u8() % 4
    for _ in range(patches):
        offset = source.u8() % _HEADER_SIZE
        chunk = source.blob(16)
        header[offset : offset + len(chunk)] = chunk
    return bytes(header[:_HEADER_SIZE])


@contextlib.contextmanager
def fake_journal(module: FakeJournalModule) -> Iterator[None]:
    from spark_watchdog.probes import journal_read

    # The one place the probe finds systemd's module (probes/journal_read.py).
    saved = journal_read.systemd_journal
    journal_read.systemd_journal = lambda: module
    try:
        yield
    finally:
        journal_read.systemd_journal = saved


_JOURNAL_DIR: Path | None = None


def _journal_dir() -> Path:
    global _JOURNAL_DIR
    if _JOURNAL_DIR is None:
        _JOURNAL_DIR = Path(tempfile.mkdtemp(prefix="spark-watchdog-fuzz-journal-"))
    return _JOURNAL_DIR


def fuzz_journal(data: bytes) -> None:
    """Input: layout byte, then per file a header patch and entries."""
    from spark_watchdog.probes.journal import JournalProbe

    source = Bytes(data)
    layout = source.u8()
    directory = _journal_dir()
    for old in directory.iterdir():
        old.unlink()
    files: dict[str, list[FakeEntry]] = {}
    for number in range(1 + (layout & 1)):
        entries = journal_entries(source, min(source.u8() % 24, source.left() // 4 + 1))
        path = directory / f"system@{number}.journal"
        path.write_bytes(journal_header(entries, source))
        if not layout & 2 or number:
            files[str(path)] = entries
    current = _BOOTS[(layout >> 2) & 3] if layout & 16 else None
    probe = JournalProbe(
        directory=str(directory),
        tail_entries=(layout >> 5) % 4,
        evidence_per_kind=1 + (layout >> 7),
        current_boot_id=current,
    )
    with fake_journal(FakeJournalModule(files)):
        # _read, not read(): read() turns any exception into an "error" report,
        # which would hide exactly what this harness looks for.
        report = probe._read()
        # A second read uses the cached verdicts and scans, like the agent's next minute.
        again = probe._read()
    assert report.state in ("ok", "degraded", "unavailable"), report
    for record in (report, again):
        json.dumps(record.to_json(), allow_nan=False)
        json.dumps(record.summary_json(), allow_nan=False)
        for boot in record.boots:
            assert re.fullmatch(r"[0-9a-f]{32}", boot.boot_id), boot.boot_id


# -- snmp -----------------------------------------------------------------------


def encode_varbinds(pairs: Sequence[tuple[str, Any]]) -> bytes:
    """A BER-encoded VarBindList, as it stands in an SNMP answer."""
    from pyasn1.codec.ber import encoder
    from pysnmp.proto import rfc1905
    from pysnmp.proto.api import v2c

    pdu = v2c.GetResponsePDU()
    v2c.apiPDU.set_defaults(pdu)
    v2c.apiPDU.set_varbinds(pdu, list(pairs))
    return bytes(encoder.encode(v2c.apiPDU.get_varbind_list(pdu), asn1Spec=rfc1905.VarBindList()))


def _decode_answer(source: Bytes, device: str) -> tuple[Any, Any, Any, list[Any]]:
    """One (errorIndication, errorStatus, errorIndex, varBinds) as pysnmp's hlapi gives."""
    from pyasn1.codec.ber import decoder
    from pyasn1.type import univ
    from pysnmp.proto import errind, rfc1905
    from pysnmp.proto.api import v2c

    from spark_watchdog.errors import Unreachable

    kind, status_byte, index_byte = source.u8(), source.u8(), source.u8()
    encoded = source.blob(600)
    if kind % 8 == 7:
        return errind.requestTimedOut, 0, 0, []
    if kind % 8 == 6:
        return errind.unknownUserName, 0, 0, []
    # errorStatus as the PDU's own type (named values); kind 5 carries an error.
    status = rfc1905.errorStatus.clone(status_byte % 20 if kind % 8 == 5 else 0)
    index = univ.Integer(index_byte % 4)
    try:
        decoded, _rest = decoder.decode(encoded, asn1Spec=rfc1905.VarBindList())
        var_binds = [v2c.apiVarBind.get_oid_value(vb) for vb in decoded]
    except Exception:
        # pysnmp drops a message it cannot decode and the request times out: to the
        # caller that is silence, Unreachable. Besides PyAsn1Error, pyasn1's decoder
        # raises OverflowError (a BER length past sys.maxsize), IndexError and
        # AttributeError on some malformed BER; in pysnmp's receive callback asyncio
        # logs them and the GET ends Unreachable (checked with a UDP responder on
        # loopback sending each of tests/fuzz/corpus/snmp/finding-pyasn1-*).
        raise Unreachable(device, "undecodable answer (dropped)") from None
    return None, status, index, var_binds


def _fuzz_pdu_class() -> type[Any]:
    from spark_watchdog.errors import Unreachable
    from spark_watchdog.power.snmp import SnmpPdu

    class FuzzPdu(SnmpPdu):
        """An SnmpPdu whose answers come from the fuzz input instead of UDP."""

        source: Bytes

        def _engine(self) -> Any:
            return None

        async def _target(self, device: str, retries: int) -> Any:
            return None

        async def _prime_command_engine(self, device: str) -> None:
            return None  # no command engine: nothing is sent

        async def _bounded_read(self, device: str, call: Any) -> Any:
            call.close()  # the pysnmp request coroutine is never sent
            if self.source.left() <= 0:
                raise Unreachable(device, "no answer (the input ran out)")
            return _decode_answer(self.source, device)

    return FuzzPdu


_FUZZ_PDU: type[Any] | None = None
_OUTLET_NAMES = ("spark-1", "spark-2", "Outlet 1", "")


def fuzz_snmp(data: bytes) -> None:
    from spark_watchdog.config.secrets import Secret
    from spark_watchdog.power.base import PowerState
    from spark_watchdog.power.snmp import SnmpCredentials
    from spark_watchdog.power.snmp_outlet import SnmpOutlet
    from spark_watchdog.power.snmp_profiles import PROFILES, generic_profile

    global _FUZZ_PDU
    if _FUZZ_PDU is None:
        _FUZZ_PDU = _fuzz_pdu_class()
    source = Bytes(data)
    choice = source.u8()
    vendors = ("auto", "generic", *PROFILES)
    vendor = vendors[choice % len(vendors)]
    profile = None
    if vendor == "generic":
        profile = generic_profile(
            control_oid="1.3.6.1.4.1.99.1.2",
            status_oid="1.3.6.1.4.1.99.1.1",
            control_on=1,
            control_off=2,
            status_on=1,
            status_off=2,
            names_oid="1.3.6.1.4.1.99.1.3" if choice & 0x80 else None,
        )
    pdu = _FUZZ_PDU(
        host="192.0.2.1",
        port=161,
        credentials=SnmpCredentials(version="2c", community=Secret("public", "fuzz input")),
        vendor=vendor,
        profile=profile,
    )
    pdu.source = source
    spec = source.u8()
    outlet: int | str = 1 + spec % 48 if spec & 1 else _OUTLET_NAMES[(spec >> 1) % 4]
    target = SnmpOutlet(pdu, outlet)
    state = drive(target.read_state())
    assert state in (PowerState.ON, PowerState.OFF), state
    description = drive(target.describe())
    json.dumps(description.to_json())
    names = drive(pdu.outlet_names())
    assert all(isinstance(n, int) and isinstance(v, str) for n, v in names.items())


# -- snapshot -------------------------------------------------------------------

_READ_LOOP: asyncio.AbstractEventLoop | None = None


def _answer(data: bytes) -> Any:
    from spark_watchdog.controller.look.http_client import read_answer

    global _READ_LOOP
    if _READ_LOOP is None:
        _READ_LOOP = asyncio.new_event_loop()
    reader = asyncio.StreamReader(loop=_READ_LOOP)
    reader.feed_data(data)
    reader.feed_eof()
    return drive(read_answer(reader, "GET http://spark-1:9720/v1/state"))


def fuzz_snapshot(data: bytes) -> None:
    from spark_watchdog.config.controller import NodeConfig
    from spark_watchdog.controller.decide.detector import DetectionPolicy, classify
    from spark_watchdog.controller.look.http_client import HttpError
    from spark_watchdog.controller.look.node_watch import NodeWatch, watch_json

    answer = _answer(data)
    watch = NodeWatch(NodeConfig(name="spark-1", agent="http://spark-1:9720"), 0.0)
    # Two polls of the same answer: the second compares against the first.
    for now in (1.0, 2.0):
        watch.note_http_answer(answer.status, answer.body, now, 1_700_000_000.0 + now)
        for judges in (True, False):
            finding = classify(watch.observation(now, True, judges), DetectionPolicy())
            finding.summary  # noqa: B018 (the text goes to logs and the history)
    onset = watch.serving_fault_onset(1_700_000_002.0)
    assert onset is None or math.isfinite(onset), onset
    json.dumps(watch_json(watch, 2.0))
    if answer.body:
        with contextlib.suppress(HttpError):
            # The answer's own JSON reading, as serving restarts and /v1/boots use it.
            answer.json()


# -- config ---------------------------------------------------------------------

_CONFIG_DIR: Path | None = None


def fuzz_config(data: bytes) -> None:
    """YAML text as a config file, read once and validated as an agent and as a
    controller config (what ``load_agent_config`` and ``load_controller_config``
    do, without reading the same text twice: the YAML reader is most of the cost,
    and without the agent's token-file check, which reads no input of the file's)."""
    from spark_watchdog.config.agent import parse_agent_config
    from spark_watchdog.config.controller import parse_controller_config
    from spark_watchdog.config.files import read_yaml

    global _CONFIG_DIR
    if _CONFIG_DIR is None:
        _CONFIG_DIR = Path(tempfile.mkdtemp(prefix="spark-watchdog-fuzz-config-"))
    path = _CONFIG_DIR / "config.yaml"
    path.write_bytes(data)
    parsed = read_yaml(path)
    for parse in (parse_agent_config, parse_controller_config):
        with contextlib.suppress(_config_error()):
            parse(copy.deepcopy(parsed), str(path))


def _config_error() -> type[Exception]:
    from spark_watchdog.errors import ConfigError

    return ConfigError


# -- the table ------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    name: str
    run: Callable[[bytes], None]
    expected: Callable[[], tuple[type[BaseException], ...]]


def _metrics_errors() -> tuple[type[BaseException], ...]:
    from spark_watchdog.errors import MetricsFormatError

    return (MetricsFormatError,)


def _journal_errors() -> tuple[type[BaseException], ...]:
    from spark_watchdog.errors import ProbeError

    return (ProbeError,)


def _snmp_errors() -> tuple[type[BaseException], ...]:
    from spark_watchdog.errors import PowerError

    return (PowerError,)


def _snapshot_errors() -> tuple[type[BaseException], ...]:
    from spark_watchdog.controller.look.http_client import HttpError

    return (HttpError,)


def _config_errors() -> tuple[type[BaseException], ...]:
    return (_config_error(),)


def _no_errors() -> tuple[type[BaseException], ...]:
    return ()


TARGETS: dict[str, Target] = {
    t.name: t
    for t in (
        Target("metrics", fuzz_metrics, _metrics_errors),
        Target("journal", fuzz_journal, _journal_errors),
        Target("snmp", fuzz_snmp, _snmp_errors),
        Target("snapshot", fuzz_snapshot, _snapshot_errors),
        Target("config", fuzz_config, _config_errors),
        Target("intake", fuzz_intake, _no_errors),
    )
}


def check(target: Target, data: bytes) -> BaseException | None:
    """Run one input; the exception that is a finding, or None."""
    try:
        target.run(data)
    except target.expected():
        return None
    except RecursionError as exc:  # before Exception: a deep input is a finding too
        return exc
    except Exception as exc:
        return exc
    return None


CORPUS = Path(__file__).resolve().parent.parent / "tests" / "fuzz" / "corpus"


def corpus(name: str) -> list[tuple[str, bytes]]:
    """The stored inputs of a target: seeds and every finding kept as an example."""
    folder = CORPUS / name
    if not folder.is_dir():
        return []
    return [(p.name, p.read_bytes()) for p in sorted(folder.iterdir()) if p.is_file()]


# -- seeds ----------------------------------------------------------------------


def _u(value: int, size: int) -> bytes:
    return value.to_bytes(size, "little")


def _blob(data: bytes, limit: int) -> bytes:
    """``Bytes.blob``'s input: the length (one byte, two above 255), then the bytes."""
    data = data[:limit]
    return (_u(len(data), 2) if limit > 255 else _u(len(data), 1)) + data


def _journal_entry(
    flags: int,
    realtime: int,
    monotonic: int,
    transport: int = 0,
    identifier: int = 0,
    message_id: int = 3,
    message: int = 9,
    extra: bytes = b"",
) -> bytes:
    """One entry in ``journal_entries``' input format (flags bit 0-1: boot 0-3)."""
    out = bytes([flags]) + _u(realtime, 8) + _u(monotonic, 8)
    if flags & 4:
        out += _blob(extra, 40)
    out += bytes([transport])
    if flags & 16:
        out += bytes([identifier])
    if flags & 32:
        out += bytes([message_id])
    out += bytes([message])
    if flags & 64 or flags & 128:
        out += _blob(extra, 3000)
    return out


def _journal_seeds() -> list[tuple[str, bytes]]:
    t0 = 1_751_000_000_000_000  # µs, mid-2025
    # Boot 0 froze after an Xid (no stop); boot 1 is the current one.
    frozen = [
        _journal_entry(0 | 16 | 32, t0, 1_000, transport=1, identifier=1, message_id=1, message=7),
        _journal_entry(0, t0 + 10, 2_000, transport=0, message=0),
        _journal_entry(0, t0 + 20, 3_000, transport=0, message=1),
        _journal_entry(0, t0 + 30, 4_000, transport=0, message=5),
    ]
    current = [
        _journal_entry(1 | 16 | 32, t0 + 99, 1_000, transport=1, identifier=1, message_id=1),
        _journal_entry(1 | 16, t0 + 100, 1_500, transport=1, identifier=1, message=8),
        _journal_entry(1, t0 + 110, 2_000, transport=0, message=3),
    ]
    clean = [
        _journal_entry(2 | 16 | 32, t0, 1_000, transport=1, identifier=1, message_id=1),
        _journal_entry(2, t0 + 5, 1_100, transport=0, message=4),
        _journal_entry(
            2 | 16 | 32, t0 + 9, 1_200, transport=1, identifier=1, message_id=0, message=6
        ),
    ]
    no_patch = b"\0"
    one_file = bytes([16 | 4])  # current boot 1
    two_files = bytes([1 | 16 | 4 | (1 << 5)])
    return [
        ("seed-frozen-then-current", one_file + bytes([7]) + b"".join(frozen + current) + no_patch),
        (
            "seed-two-files",
            two_files
            + bytes([4])
            + b"".join(frozen)
            + no_patch
            + bytes([6])
            + b"".join(clean + current)
            + no_patch,
        ),
        (
            "seed-header-patched",
            one_file + bytes([3]) + b"".join(clean) + b"\1" + bytes([184]) + _blob(b"\xff" * 8, 16),
        ),
        (
            "seed-odd-fields",
            one_file
            + bytes([2])
            + _journal_entry(4 | 128, t0, 5, extra=b"not-a-boot-id\xff\xfe")
            + _journal_entry(8 | 64, t0 + 1, 6, extra="é\u2028\x00".encode() * 10)
            + no_patch,
        ),
    ]


def _snmp_answer(pairs: Sequence[tuple[str, Any]], kind: int = 0, status: int = 0) -> bytes:
    return bytes([kind, status, 0]) + _blob(encode_varbinds(pairs), 600)


def _snmp_seeds() -> list[tuple[str, bytes]]:
    from pysnmp.proto.rfc1902 import Integer32, ObjectName, OctetString
    from pysnmp.proto.rfc1905 import EndOfMibView, NoSuchInstance

    from spark_watchdog.power.snmp_profiles import PROFILES, SYS_OBJECT_ID

    keys = ["auto", "generic", *PROFILES]
    seeds: list[tuple[str, bytes]] = []
    for key in ("apc_rpdu2", "raritan_px2", "eaton_epdu", "servertech_sentry4"):
        profile = PROFILES[key]
        outlet = 4  # spec byte 3: odd, so a number, 1 + 3 % 48
        sys_oid = profile.sys_object_ids[0].lstrip(".") + ".1"
        status = profile.instance(profile.status_oid, outlet)
        assert profile.names_oid is not None
        name_oid = profile.instance(profile.names_oid, outlet)
        root = profile.names_root()
        assert root is not None
        walk = [
            _snmp_answer([(f"{root}.{n}", OctetString(f"spark-{n}".encode()))]) for n in (1, 2, 4)
        ]
        walk.append(_snmp_answer([("1.3.6.1.6.3.1", Integer32(0))]))  # past the table
        answers = [
            _snmp_answer([(SYS_OBJECT_ID, ObjectName(sys_oid))]),
            _snmp_answer([(status, Integer32(profile.status_on[0]))]),
            _snmp_answer([(name_oid, OctetString(b"spark-4"))]),
            *walk,
        ]
        by_number = bytes([keys.index("auto"), outlet - 1])
        seeds.append((f"seed-auto-{key}", by_number + b"".join(answers)))
        # The same PDU asked for the outlet named "spark-2" (names walked first).
        by_name = bytes([keys.index(key), 2])  # even: a name, _OUTLET_NAMES[1]
        named = [
            *walk,
            _snmp_answer(
                [(profile.instance(profile.status_oid, 2), Integer32(profile.status_off[0]))]
            ),
            _snmp_answer([(profile.instance(profile.names_oid, 2), OctetString(b"spark-2"))]),
            *walk,
        ]
        seeds.append((f"seed-named-{key}", by_name + b"".join(named)))
    generic_status = "1.3.6.1.4.1.99.1.1.10"
    seeds.append(
        (
            "seed-generic-odd-answers",
            bytes([keys.index("generic"), 9])
            + _snmp_answer([(generic_status, NoSuchInstance(""))])
            + _snmp_answer([(generic_status, EndOfMibView(""))])
            + _snmp_answer([(generic_status, Integer32(7))], kind=5, status=2),
        )
    )
    return seeds


def _snapshot_seeds() -> list[tuple[str, bytes]]:
    stored = dict(corpus("snapshot"))
    real = stored.get("seed-real-v1-state.http")
    if real is None:
        return []
    _head, _, body = real.partition(b"\r\n\r\n")
    state = json.loads(body)
    state["probes"]["vllm"].update(
        state="stalled", seconds_without_progress=42.5, reason="4 request(s) running; stalled"
    )
    stalled = json.dumps(state).encode()
    chunked = b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n\r\n" + stalled
    return [
        ("seed-stalled", chunked),
        ("seed-503", b"HTTP/1.1 503 Service Unavailable\r\nContent-Length: 0\r\n\r\n"),
        ("seed-stopping", chunked.replace(b'"stopping": null', b'"stopping": {"system": true}')),
    ]


def _metrics_seeds() -> list[tuple[str, bytes]]:
    small = (
        b"# TYPE vllm:num_requests_running gauge\n"
        b'vllm:num_requests_running{engine="0",model_name="m"} 3.0\n'
        b'vllm:num_requests_waiting{engine="0",model_name="m"} 0.0\n'
        b'vllm:gpu_cache_usage_perc{model_name="m"} 0.5\n'
        b'vllm:iteration_tokens_total_count{engine="1",model_name="m"} 17.0 1751000000000\n'
        b'vllm:generation_tokens_total{engine="1",model_name="m"} 1.0e+03\n'
        b'vllm:prompt_tokens_total{engine="1",model_name="m"} 12\n'
        b'vllm:iteration_tokens_total_bucket{engine="1",le="+Inf",model_name="m"} 17.0\n'
    )
    return [("seed-small-old-names", small)]


def _config_seeds() -> list[tuple[str, bytes]]:
    root = Path(__file__).resolve().parent.parent / "config"
    if not root.is_dir():
        return []
    import yaml

    out = []
    for path in sorted(root.glob("*.yaml")):
        # The shipped examples, without their comments: the fuzzer's inputs stay short.
        data = yaml.safe_load(path.read_text())
        out.append((f"seed-{path.name}", yaml.safe_dump(data, sort_keys=False).encode()))
    return out


def _intake_seeds() -> list[tuple[str, bytes]]:
    real = dict(corpus("snapshot")).get("seed-real-v1-state.http")
    if real is None:
        return []
    state = json.loads(real.partition(b"\r\n\r\n")[2])
    fault = {"id": 1, "xid": 43, "what": "x", "at_unix": 1.7e15, "gpu": 0, "result": "stopped"}
    kill = {"id": 1, "at": "now", "at_unix": 1_764_000_000.0 - 2, "result": "killed"}
    odd = {
        **state,
        "seq": 10**31,
        "gpu_faults": {"watcher": "on", "faults": [fault, {**fault, "id": 2, "at_unix": -1}]},
        "memory_guard": {"kills": 1, "last_kill": kill},
        "peers": {"spark-3": {"seq": 4, "progress_ago_s": 1e300, "via": "http://x"}},
    }
    return [
        ("seed-real", json.dumps(state).encode()),
        ("seed-absurd-times", json.dumps(odd).encode()),
        ("seed-not-a-number", b'{"seq": 1, "stopping": {"since": NaN, "system": true}}'),
    ]


_SEEDS: dict[str, Callable[[], list[tuple[str, bytes]]]] = {
    "metrics": _metrics_seeds,
    "journal": _journal_seeds,
    "snmp": _snmp_seeds,
    "snapshot": _snapshot_seeds,
    "config": _config_seeds,
    "intake": _intake_seeds,
}


def seeds(name: str) -> list[tuple[str, bytes]]:
    """Built seeds plus the stored corpus (real captures and kept findings)."""
    return _SEEDS[name]() + corpus(name)


def assert_clean(name: str, data: bytes) -> None:
    """Raise the finding, if ``data`` makes target ``name`` raise something undocumented."""
    finding = check(TARGETS[name], data)
    if finding is not None:
        raise finding
