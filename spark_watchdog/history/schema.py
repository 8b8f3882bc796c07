"""The history database's schema, as an ordered list of migrations.

``PRAGMA user_version`` is the schema version: a file at version N has had
``MIGRATIONS[0:N]`` applied. The store applies the missing ones on open, each
in its own write transaction together with the new ``user_version``, so a
crash mid-migration leaves the file at the previous version, never between.

Rules for whoever adds a version:

- append a script; never edit a released one (files in the field were built
  from it, and ``tests/history/fixtures/history_v1.sql`` pins version 1);
- one statement per ``;`` boundary; triggers are fine (the splitter uses
  ``sqlite3.complete_statement``);
- SQLite before 3.37 has no STRICT tables and Python 3.10 on older distros
  ships such SQLite, so types are kept honest with CHECK constraints instead;
- value sets that will grow (step names, action operations and results) are
  checked in Python, not in CHECK constraints, so growing them needs no
  table rebuild; sets fixed by the design (status, resolution) are checked here.

Times are UNIX seconds (REAL, UTC). JSON columns hold text that the store has
serialised itself.
"""

from __future__ import annotations

import sqlite3

# "SWDH" (spark-watchdog history) in the header's application_id field, so
# `file` and the store can tell our database from any other SQLite file.
APPLICATION_ID = 0x53574448

_V1 = """
CREATE TABLE nodes (
    name         TEXT PRIMARY KEY,
    first_seen   REAL NOT NULL,
    last_boot_id TEXT
);

CREATE TABLE incidents (
    id                INTEGER PRIMARY KEY,
    kind              TEXT NOT NULL,
    opened_at         REAL NOT NULL,
    detected_at       REAL NOT NULL,
    -- the last time the node(s) were seen healthy; NULL when unknown
    fault_onset       REAL,
    evidence          TEXT NOT NULL,  -- JSON object
    dry_run           INTEGER NOT NULL CHECK (dry_run IN (0, 1)),
    status            TEXT NOT NULL CHECK (status IN ('open', 'resolved')),
    resolution        TEXT CHECK (resolution IN ('recovered', 'gave_up', 'false_alarm')),
    resolved_at       REAL,
    time_to_detect_s  REAL,
    time_to_recover_s REAL,
    CHECK ((status = 'open') = (resolution IS NULL)),
    CHECK ((status = 'open') = (resolved_at IS NULL))
);
CREATE INDEX incidents_by_status ON incidents (status);
CREATE INDEX incidents_by_detected_at ON incidents (detected_at);

-- An incident may span several nodes (TP=4: one freeze stalls all four).
CREATE TABLE incident_nodes (
    incident_id INTEGER NOT NULL REFERENCES incidents (id),
    position    INTEGER NOT NULL,
    node        TEXT NOT NULL REFERENCES nodes (name),
    PRIMARY KEY (incident_id, node)
);
CREATE INDEX incident_nodes_by_node ON incident_nodes (node);

-- The write-ahead log: a step is committed before the controller acts on it.
CREATE TABLE incident_steps (
    incident_id INTEGER NOT NULL REFERENCES incidents (id),
    seq         INTEGER NOT NULL CHECK (seq >= 1),
    at          REAL NOT NULL,
    node        TEXT REFERENCES nodes (name),
    step        TEXT NOT NULL,
    detail      TEXT NOT NULL,  -- JSON object
    PRIMARY KEY (incident_id, seq)
);

CREATE TABLE boots (
    node           TEXT NOT NULL REFERENCES nodes (name),
    boot_id        TEXT NOT NULL,
    first_entry    REAL,
    last_entry     REAL,
    -- 1 clean ("Journal stopped"), 0 unclean, NULL unknown / still running
    clean_shutdown INTEGER CHECK (clean_shutdown IN (0, 1)),
    evidence       TEXT NOT NULL,  -- JSON object
    recorded_at    REAL NOT NULL,
    updated_at     REAL NOT NULL,
    incident_id    INTEGER REFERENCES incidents (id),
    PRIMARY KEY (node, boot_id)
);
CREATE INDEX boots_by_incident ON boots (incident_id);

CREATE TABLE actions (
    id           INTEGER PRIMARY KEY,
    incident_id  INTEGER REFERENCES incidents (id),  -- NULL: operator-initiated
    node         TEXT NOT NULL REFERENCES nodes (name),
    rung         INTEGER,
    device       TEXT NOT NULL,
    operation    TEXT NOT NULL,
    requested_at REAL NOT NULL,
    verified_at  REAL,
    result       TEXT NOT NULL,
    error        TEXT,
    dry_run      INTEGER NOT NULL CHECK (dry_run IN (0, 1))
);
CREATE INDEX actions_by_node_time ON actions (node, requested_at);
CREATE INDEX actions_by_time ON actions (requested_at);
CREATE INDEX actions_by_incident ON actions (incident_id);

CREATE TABLE serving_restarts (
    id             INTEGER PRIMARY KEY,
    incident_id    INTEGER REFERENCES incidents (id),  -- NULL: operator-initiated
    profile        TEXT NOT NULL,
    started_at     REAL NOT NULL,
    finished_at    REAL,
    duration_s     REAL,
    result         TEXT NOT NULL,
    error          TEXT,
    step_durations TEXT NOT NULL  -- JSON object: step name -> seconds, in order
);
CREATE INDEX serving_restarts_by_incident ON serving_restarts (incident_id);

-- node is a node name or '*' for the whole cluster.
CREATE TABLE holds (
    id          INTEGER PRIMARY KEY,
    node        TEXT NOT NULL,
    reason      TEXT NOT NULL,
    created_at  REAL NOT NULL,
    created_by  TEXT NOT NULL,
    released_at REAL,
    released_by TEXT
);
-- At most one active hold per target; the CLI and the controller both write here.
CREATE UNIQUE INDEX holds_one_active ON holds (node) WHERE released_at IS NULL;

CREATE TABLE settings (
    key        TEXT PRIMARY KEY,
    value      TEXT NOT NULL,  -- JSON
    changed_at REAL NOT NULL,
    changed_by TEXT NOT NULL
);
"""

# Version 2: the controller pair (docs/design.md, "Controller pair"). One row
# per leadership (name 'controller'): who holds it, at which epoch, until when
# by the database's own clock; every step records the epoch of the leader that
# wrote it (NULL: a controller without a lease, on SQLite, or the CLI); the
# standbys seen.
_V2 = """
CREATE TABLE leadership (
    name        TEXT PRIMARY KEY,
    holder      TEXT NOT NULL,
    epoch       INTEGER NOT NULL CHECK (epoch >= 1),
    acquired_at REAL NOT NULL,
    renewed_at  REAL NOT NULL,
    expires_at  REAL NOT NULL,
    -- the holder's promise to its own checked writes: two send deadlines
    fence_s     REAL NOT NULL CHECK (fence_s >= 0),
    -- set by a step-down: no write, no renewal; expires fence_s later
    released_at REAL
);

ALTER TABLE incident_steps ADD COLUMN epoch INTEGER;

-- The standbys of a pair, each as it last tried to take the lease (the
-- database's clock), so `ha status` can say who would take over.
CREATE TABLE standbys (
    holder  TEXT PRIMARY KEY,
    seen_at REAL NOT NULL
);
"""

# MIGRATIONS[i] takes a file from version i to version i + 1.
MIGRATIONS: tuple[str, ...] = (_V1, _V2)

SCHEMA_VERSION = len(MIGRATIONS)


def statements(script: str) -> list[str]:
    """Split a migration script into single statements (``execute`` runs only one).

    ``executescript`` would be simpler but it commits any open transaction
    first, and a migration must run inside the store's own transaction.
    """
    out: list[str] = []
    pending = ""
    *pieces, tail = script.split(";")
    for piece in pieces:
        pending += piece + ";"
        if sqlite3.complete_statement(pending):
            if pending.strip(" \n\t;"):
                out.append(pending.strip())
            pending = ""
    # Whatever follows the last complete statement must be blank.
    pending += tail
    if pending.strip():
        raise ValueError(f"migration script ends in an incomplete statement: {pending.strip()!r}")
    return out
