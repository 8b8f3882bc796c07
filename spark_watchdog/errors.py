"""The project's error hierarchy.

"Could not reach" and "the thing said no" are different failures and are
handled differently, so they are different classes. Each error carries a
message that names the bad thing and says what was expected.
"""

from __future__ import annotations


class WatchdogError(Exception):
    """Base class of every error spark_watchdog raises on purpose."""


class ConfigError(WatchdogError):
    """The configuration is invalid. ``problems`` lists every finding at once."""

    def __init__(self, source: str, problems: list[str]) -> None:
        self.source = source
        self.problems = list(problems)
        lines = "\n".join(f"  {p}" for p in self.problems)
        super().__init__(f"{source}: {len(self.problems)} problem(s):\n{lines}")


class ProbeError(WatchdogError):
    """A probe could not produce an observation."""


class JournalFileError(ProbeError):
    """One journal file could not be read (corrupt, truncated, unreadable)."""

    def __init__(self, path: str, reason: str) -> None:
        self.path = path
        self.reason = reason
        super().__init__(f"journal file {path}: {reason}")


class MetricsFormatError(ProbeError):
    """A /metrics body is not Prometheus text exposition."""


class PowerError(WatchdogError):
    """A power action or power read failed. ``device`` names the device."""

    def __init__(self, device: str, message: str) -> None:
        self.device = device
        self.message = message
        # The steps taken before the failure (PowerStep records), for the history.
        self.steps: tuple[object, ...] = ()
        super().__init__(f"{device}: {message}")


class Unreachable(PowerError):
    """No answer: a timeout, a refused connection, or credentials that look like silence."""


class Refused(PowerError):
    """The device answered and said no (bad value, not allowed, wrong credentials said aloud)."""


class StateTimeout(PowerError):
    """The command was accepted but the state never came within power_timeout."""


class Ambiguous(PowerError):
    """We do not know whether the command landed. Re-read the state before any retry."""


class Withdrawn(PowerError):
    """The command was certainly not sent: a last check right before sending said no
    (the host showed life after the step was recorded)."""


class SendRefused(PowerError):
    """The command was certainly not sent: a controller of a pair may not send
    now (history/leadership.py, its send gate). Recorded as withdrawn, so
    whoever leads resumes the rung from the top; never a false alarm."""


class HandedOver(PowerError):
    """The command was certainly not sent: another controller on the Sparks claims
    the node now (docs/design.md, "Controllers on the Sparks"). Nothing is held."""


class FoundOff(PowerError):
    """A cycle found the device already off (or mixed) before its off: not ours to undo.

    Someone switched it off by hand, or another tool did; switching it on
    could power a machine a person is working on. Nothing was sent.
    """


class HistoryLocked(WatchdogError):
    """Another process holds the freeze history's instance lock (a second controller).

    ``path`` is the lock file, ``holder`` what its holder wrote into it.
    """

    def __init__(self, path: str, holder: str) -> None:
        self.path = path
        self.holder = holder
        super().__init__(
            f"{path}: another controller is running on this history: {holder}; stop it first "
            "(systemctl stop spark-watchdog-controller) or point this one at another history"
        )


# -- the freeze history (spark_watchdog.history) ---------------------------------


class StoreError(WatchdogError):
    """The freeze history could not be read or written. ``path`` names the file."""

    def __init__(self, path: str, message: str) -> None:
        self.path = path
        super().__init__(message)


class StoreLocked(StoreError):
    """Another process held the write lock for longer than ``busy_timeout``."""


class StoreFull(StoreError):
    """SQLITE_FULL: the disk (or the database's page limit) is full."""


class StoreReadOnly(StoreError):
    """The file, its directory, or the store itself is read-only."""


class StoreCorrupt(StoreError):
    """Not a database, a malformed one, or a cell this store could not have written."""


class SchemaTooNew(StoreError):
    """The file was written by a newer spark-watchdog."""


class InvalidRecord(StoreError):
    """The caller passed a value the history cannot record (a bug in the caller)."""


class UnknownRecord(StoreError):
    """No such incident, action or serving restart."""


class NotLeader(StoreError):
    """A controller of a pair may not write: another took the leadership, or its
    lease has too little left (history/leadership.py). Nothing was written."""


class IncidentAlreadyOpen(WatchdogError):
    """A node may have one open host_frozen incident at a time; a second one is refused.

    Not a StoreError: the history is fine, the caller asked for a second
    incident of a node that already has one (two controllers, or a bug).
    """

    def __init__(self, node: str, incident_id: int) -> None:
        self.node = node
        self.incident_id = incident_id
        super().__init__(f"{node} already has open incident #{incident_id}")
