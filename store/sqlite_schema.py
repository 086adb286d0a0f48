"""The SQLite ledger's schema: the events table, its triggers, the index and checkpoint tables.

Why the triggers: UPDATE and DELETE on `events` are refused, and so is an INSERT
that clashes with an existing row, because `INSERT OR REPLACE` deletes the clashing
row without firing DELETE triggers when a connection has `recursive_triggers` off.
`table.transform()` would drop the triggers silently: never run it on `events`.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import sqlite_utils

from store.errors import StoreError

__all__ = ["EVENT_COLUMNS", "SCHEMA", "STORE_SCHEMA_VERSION", "SYNCHRONOUS_MODES", "create_schema", "schema_version"]

STORE_SCHEMA_VERSION = 1
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
EVENT_COLUMNS = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, prev_hash, hash"
SCHEMA = (
    """CREATE TABLE IF NOT EXISTS events (
        seq INTEGER PRIMARY KEY,
        stream_id TEXT NOT NULL,
        version INTEGER NOT NULL CHECK (version >= 1),
        event_id TEXT NOT NULL,
        type TEXT NOT NULL,
        schema_version INTEGER NOT NULL,
        payload TEXT NOT NULL,
        recorded_at TEXT NOT NULL,
        actor TEXT NOT NULL,
        prev_hash TEXT NOT NULL,
        hash TEXT NOT NULL,
        UNIQUE (stream_id, version),
        UNIQUE (event_id)
    )""",
    """CREATE TRIGGER IF NOT EXISTS events_refuse_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS events_refuse_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END""",
    # INSERT OR REPLACE deletes the clashing row without firing DELETE triggers when
    # another connection has recursive_triggers off; refusing the clash up front
    # closes that door whatever the connection's settings.
    """CREATE TRIGGER IF NOT EXISTS events_refuse_replace BEFORE INSERT ON events
    WHEN EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)
      OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)
      OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)
    BEGIN SELECT RAISE(ABORT, 'events are append-only: REPLACE refused'); END""",
)


def schema_version(conn: sqlite3.Connection) -> str | None:
    """The store schema version a file records, None when it has none yet."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if not exists:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()
    return None if row is None else str(row[0])


def create_schema(conn: sqlite3.Connection, db: sqlite_utils.Database, path: Path) -> None:
    """Create whatever is missing, under the caller's write lock; refuse another schema version."""
    for statement in SCHEMA:
        conn.execute(statement)
    db.table("streams").create(
        {"stream_id": str, "version": int, "status": str, "category": str},
        pk="stream_id",
        not_null={"version"},
        if_not_exists=True,
    )
    db.table("checkpoints").create(
        {
            "checkpoint_id": int, "position": int, "head_hash": str, "schema_version": int,
            "fingerprint": str, "snapshot": str, "snapshot_sha256": str, "recorded_at": str,
        },
        pk="checkpoint_id",
        if_not_exists=True,
    )  # fmt: skip
    db.table("checkpoint_streams").create(
        {"checkpoint_id": int, "stream_id": str, "version": int, "state": str, "state_sha256": str},
        pk=("stream_id", "checkpoint_id"),
        not_null={"version", "state", "state_sha256"},
        if_not_exists=True,
    )
    db.table("meta").create({"key": str, "value": str}, pk="key", if_not_exists=True)
    found = schema_version(conn)
    if found is None:
        conn.execute("INSERT INTO meta (key, value) VALUES ('store_schema_version', ?)", (str(STORE_SCHEMA_VERSION),))
    elif found != str(STORE_SCHEMA_VERSION):
        raise StoreError(f"{path}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing to guess")
