"""Node: does the journal survive a power cut, and can the previous boot be read back?

After a GB10 freeze and a power cycle the previous boot's journal is the only
record on the node (docs/facts.md, "Whole-host freezes"). It exists only with
persistent storage, and lines below CRIT reach the disk only every
``SyncIntervalSec`` (default 5 min; CRIT and above are synced at once:
journald.conf(5)).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

from spark_watchdog.config.agent import JournalProbeConfig
from spark_watchdog.doctor.result import Finding, fail, ok, skip, warn
from spark_watchdog.probes.journal import BootRecord, JournalProbe

# journald.conf(5), "CONFIGURATION DIRECTORIES AND PRECEDENCE": the first main
# file found wins; drop-ins from every directory are applied sorted by file
# name, a file in /etc replacing one of the same name in /run or /usr/lib.
_MAIN_FILES = (
    "etc/systemd/journald.conf",
    "run/systemd/journald.conf",
    "usr/local/lib/systemd/journald.conf",
    "usr/lib/systemd/journald.conf",
)
_DROPIN_DIRS = (  # lowest precedence first
    "usr/lib/systemd/journald.conf.d",
    "usr/local/lib/systemd/journald.conf.d",
    "run/systemd/journald.conf.d",
    "etc/systemd/journald.conf.d",
)
DROPIN = "/etc/systemd/journald.conf.d/spark-watchdog.conf"
DEFAULT_SYNC_INTERVAL_S = 300.0
# Above this, a freeze can take minutes of kernel lines (NVRM Xid and friends
# are not CRIT) down with it.
SYNC_WARN_ABOVE_S = 60.0


@dataclass(frozen=True)
class JournaldSetting:
    """One ``[Journal]`` key as journald would see it; ``source`` None: the built-in default."""

    value: str | None
    source: str | None


def journald_setting(key: str, root: Path = Path("/")) -> JournaldSetting:
    files: list[Path] = []
    main = next((root / f for f in _MAIN_FILES if (root / f).is_file()), None)
    if main is not None:
        files.append(main)
    dropins: dict[str, Path] = {}
    for folder in _DROPIN_DIRS:
        try:
            entries = sorted((root / folder).iterdir())
        except OSError:
            continue
        for entry in entries:
            if entry.name.endswith(".conf") and entry.is_file():
                dropins[entry.name] = entry
    files += [dropins[name] for name in sorted(dropins)]
    found = JournaldSetting(None, None)
    for path in files:
        value = _last_value(path, key)
        if value is not None:
            found = JournaldSetting(value, str(path))
    return found


def _last_value(path: Path, key: str) -> str | None:
    try:
        text = path.read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    section, value = "", None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = line[1:-1].strip()
            continue
        name, sep, rest = line.partition("=")
        if sep and section == "Journal" and name.strip() == key:
            value = rest.strip()
    return value


_TIMESPAN_UNITS = {
    "us": 1e-6, "usec": 1e-6, "µs": 1e-6,
    "ms": 1e-3, "msec": 1e-3,
    "s": 1.0, "sec": 1.0, "second": 1.0, "seconds": 1.0,
    "m": 60.0, "min": 60.0, "minute": 60.0, "minutes": 60.0,
    "h": 3600.0, "hr": 3600.0, "hour": 3600.0, "hours": 3600.0,
    "d": 86400.0, "day": 86400.0, "days": 86400.0,
    "w": 604800.0, "week": 604800.0, "weeks": 604800.0,
}  # fmt: skip
_TIMESPAN_PART = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zµ]*)")


def parse_timespan(text: str) -> float | None:
    """Seconds in a systemd time span (``5min``, ``1h 30s``, ``10``: seconds); None if invalid."""
    text = text.strip()
    if text == "infinity":
        return float("inf")
    total, position = 0.0, 0
    while position < len(text):
        match = _TIMESPAN_PART.match(text, position)
        if match is None or match.end() == position:
            return None
        number, unit = match.groups()
        if unit not in _TIMESPAN_UNITS and unit != "":
            return None
        total += float(number) * _TIMESPAN_UNITS.get(unit, 1.0)
        position = match.end()
        while position < len(text) and text[position].isspace():
            position += 1
    return total if text else None


def _where(setting: JournaldSetting, key: str, default: str) -> str:
    if setting.source is None:
        return f"{key}={default} (the default; no journald.conf sets it)"
    return f"{key}={setting.value} (from {setting.source})"


def check_persistent(directory: str | None, root: Path = Path("/")) -> Finding:
    """Storage= keeps the journal on disk, and the directory the agent reads exists."""
    storage = journald_setting("Storage", root)
    mode = (storage.value or "auto").strip().lower()
    where = _where(storage, "Storage", "auto")
    journal_dir = Path(directory) if directory else root / "var/log/journal"
    persist_fix = (
        f"put `[Journal]` and `Storage=persistent` in {DROPIN}, then "
        "`systemctl restart systemd-journald`"
    )
    if mode in ("volatile", "none"):
        return fail(
            f"journald keeps no journal on disk: {where}. After a freeze and a power cut "
            "the previous boot, and every kernel line before the freeze, is gone",
            persist_fix,
        )
    if not journal_dir.is_dir():
        if directory:
            return fail(
                f"probes.journal.directory {journal_dir} does not exist",
                "point probes.journal.directory at the journal directory, or remove the "
                "key to read the system journal",
            )
        if mode == "persistent":
            return fail(
                f"{journal_dir} does not exist although {where}: journald creates it when "
                "it starts, so it has not restarted since",
                "`systemctl restart systemd-journald`",
            )
        return fail(
            f"{journal_dir} does not exist, and with {where} journald then keeps the "
            "journal in /run (memory), which a power cut erases",
            persist_fix,
        )
    return ok(f"{journal_dir} exists and {where}: the journal survives a power cut")


def check_sync_interval(root: Path = Path("/")) -> Finding:
    setting = journald_setting("SyncIntervalSec", root)
    where = _where(setting, "SyncIntervalSec", "5min")
    seconds = DEFAULT_SYNC_INTERVAL_S if setting.value is None else parse_timespan(setting.value)
    if seconds is None:
        return warn(
            f"cannot read {where} as a time span; journald would ignore it and sync every 5 min",
            f"write it like `SyncIntervalSec=10s` ({DROPIN}, section [Journal])",
        )
    if seconds > SYNC_WARN_ABOVE_S:
        return warn(
            f"{where}: lines below CRIT (kernel NVRM Xid lines among them) reach the disk "
            f"only every {seconds:g} s, so a hard freeze can take the last minutes of "
            "evidence with it",
            f"put `[Journal]` and `SyncIntervalSec=10s` in {DROPIN}, then "
            "`systemctl restart systemd-journald`",
        )
    return ok(f"{where}: at most {seconds:g} s of lines are at risk in a hard freeze")


def _ending(boot: BootRecord) -> str:
    if boot.clean_shutdown:
        return "ended with a clean shutdown ('Journal stopped')"
    return "ended UNCLEANLY (no 'Journal stopped': power loss or freeze)"


def _evidence(boot: BootRecord) -> str:
    counts = [f"{kind} x{n}" for kind, n in boot.evidence_counts.items() if n]
    return f"kernel evidence: {', '.join(counts)}" if counts else "no kernel evidence lines"


def check_previous_boot(config: JournalProbeConfig) -> Finding:
    """Read the journal with the agent's own probe and its settings."""
    if not config.enabled:
        return skip("probes.journal.enabled is false: the agent does not read the journal")
    probe = JournalProbe(
        directory=config.directory,
        tail_entries=config.tail_entries,
        evidence_per_kind=config.evidence_per_kind,
        max_boots=config.max_boots,
    )
    report = probe.read()
    source = report.source
    if report.state in ("unavailable", "error"):
        message = report.message or report.state
        if "systemd-python" in message:
            fix = "`apt install python3-systemd` (or pip install systemd-python) for the agent"
        elif "permission denied" in message:
            fix = (
                "journald keeps its directories at mode 2755, group systemd-journal "
                "(`chmod 2755 DIR`); run doctor as root; the agent itself needs the "
                "systemd-journal group"
            )
        elif report.file_errors and "permission" in str(report.file_errors[0].reason):
            fix = "run doctor as root; the agent itself needs the systemd-journal group"
        elif message.startswith("no journal files"):
            fix = (
                "journald has written nothing there: check `systemctl status "
                "systemd-journald` and node.journal.persistent"
            )
        else:
            fix = "make the journal persistent (see node.journal.persistent) and check the path"
        return fail(f"cannot read {source}: {message}", fix)
    previous = report.previous_boot
    if previous is None:
        return warn(
            f"{source} holds {len(report.boots)} boot(s) and no previous one yet: nothing "
            "to read back",
            "nothing to repair if the node has not rebooted since the journal became "
            "persistent; run doctor again after the next reboot",
        )
    detail = (
        f"previous boot {previous.boot_id[:8]} read back from {source} "
        f"({previous.first_entry:%Y-%m-%d %H:%M} to {previous.last_entry:%Y-%m-%d %H:%M} UTC): "
        f"{_ending(previous)}; {_evidence(previous)}"
    )
    if report.state == "degraded":
        damaged = ", ".join(e.path for e in report.file_errors[:3])
        return warn(
            f"{detail}; {len(report.file_errors)} journal file(s) damaged or unreadable "
            f"({damaged})",
            "`journalctl --verify` names the damage; move damaged files out of the journal "
            "directory (journald starts new ones)",
        )
    return ok(detail)
