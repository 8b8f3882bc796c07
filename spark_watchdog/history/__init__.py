"""The controller's freeze history: incidents, their write-ahead log, actions,
boots, serving restarts, holds and cluster settings, in one SQLite file."""

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
from spark_watchdog.history.store import (
    HistoryStore,
    InvalidRecord,
    SchemaTooNew,
    StoreCorrupt,
    StoreError,
    StoreFull,
    StoreLocked,
    StoreReadOnly,
    UnknownRecord,
)

__all__ = [
    "CLUSTER",
    "SCHEMA_VERSION",
    "Action",
    "Boot",
    "HistoryStore",
    "Hold",
    "Incident",
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
