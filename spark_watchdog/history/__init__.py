"""The controller's freeze history: incidents, their write-ahead log, actions,
boots, serving restarts, holds and cluster settings, in one SQLite file.

``core`` owns the file (connection, transactions, errors); ``boots``,
``incidents``, ``actions``, ``serving`` and ``holds`` hold each table's
queries; ``checks`` and ``decode`` check what goes in and decode what comes
out; ``store.HistoryStore`` is all of it together."""

from spark_watchdog.errors import (
    IncidentAlreadyOpen,
    InvalidRecord,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
    UnknownRecord,
)
from spark_watchdog.history.records import (
    CLUSTER,
    Action,
    Boot,
    Hold,
    Incident,
    IncidentStep,
    IncidentTimeline,
    Node,
    ServingRestart,
    Setting,
    iso_utc,
)
from spark_watchdog.history.schema import SCHEMA_VERSION
from spark_watchdog.history.store import HistoryStore

__all__ = [
    "CLUSTER",
    "SCHEMA_VERSION",
    "Action",
    "Boot",
    "HistoryStore",
    "Hold",
    "Incident",
    "IncidentAlreadyOpen",
    "IncidentStep",
    "IncidentTimeline",
    "InvalidRecord",
    "Node",
    "SchemaTooNew",
    "ServingRestart",
    "Setting",
    "StoreCorrupt",
    "StoreError",
    "StoreFull",
    "StoreLocked",
    "StoreReadOnly",
    "UnknownRecord",
    "iso_utc",
]
