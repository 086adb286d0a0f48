"""The SQLite ledger's schema: the events table, its triggers, the index and checkpoint tables.

Why the triggers: UPDATE and DELETE on `events` are refused, and so is an INSERT
that clashes with an existing row, because `INSERT OR REPLACE` deletes the clashing
row without firing DELETE triggers when a connection has `recursive_triggers` off.
`table.transform()` would drop the triggers silently: never run it on `events`.

Why every constraint of `events` says `ON CONFLICT FAIL` and the version check is in
the insert trigger rather than a CHECK (store schema 3): an INSERT on a table with a
trigger whose constraints may ABORT runs under a statement journal, which copies
every page the row touches (six B-trees) before writing it; once that journal spills
to a temporary file it costs ~10 µs per row (benchmarks/trigger_probe.py). With FAIL
nothing can be undone part-way, so SQLite opens no statement journal. Each of our
INSERTs writes one row and the store rolls back the whole transaction on any error,
so FAIL and ABORT refuse the same rows; `INSERT OR REPLACE` is still refused by the
trigger before any row is deleted.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lifecycle_fsm.store.errors import StoreError
from lifecycle_fsm.store.records import EventFilter

if TYPE_CHECKING:  # imported by the caller only when a schema is created (its import is slow)
    import sqlite_utils

__all__ = [
    "EVENTS_TABLE",
    "EVENT_COLUMNS",
    "FILTER_INDEXES",
    "GUARDS",
    "LEGACY_REPLACE_TRIGGER",
    "OPENED_AS_IS",
    "SCHEMA",
    "STORE_SCHEMA_VERSION",
    "SYNCHRONOUS_MODES",
    "create_schema",
    "filter_sql",
    "guard_problems",
    "schema_version",
]

# 2: the filter indexes (a version 1 file gains them when it is first opened).
# 3: `events` constraints ON CONFLICT FAIL, the version check in the insert trigger: what a
#    new file gets. A version 2 file keeps its events table as written (an open never
#    rewrites the log's table); `lifecycle migrate` copies it into a version 3 file.
STORE_SCHEMA_VERSION = 3
# Versions a file is opened at as it is, without the write lock or any change.
OPENED_AS_IS = ("2", "3")
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
EVENT_COLUMNS = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, prev_hash, hash"
# `{name}` so an upgrade can build the new table beside the old one (see `_rebuild_events`).
EVENTS_TABLE = """CREATE TABLE IF NOT EXISTS {name} (
        seq INTEGER PRIMARY KEY ON CONFLICT FAIL,
        stream_id TEXT NOT NULL ON CONFLICT FAIL,
        version INTEGER NOT NULL ON CONFLICT FAIL,
        event_id TEXT NOT NULL ON CONFLICT FAIL,
        type TEXT NOT NULL ON CONFLICT FAIL,
        schema_version INTEGER NOT NULL ON CONFLICT FAIL,
        payload TEXT NOT NULL ON CONFLICT FAIL,
        recorded_at TEXT NOT NULL ON CONFLICT FAIL,
        actor TEXT NOT NULL ON CONFLICT FAIL,
        prev_hash TEXT NOT NULL ON CONFLICT FAIL,
        hash TEXT NOT NULL ON CONFLICT FAIL,
        UNIQUE (stream_id, version) ON CONFLICT FAIL,
        UNIQUE (event_id) ON CONFLICT FAIL
    )"""
SCHEMA = (
    EVENTS_TABLE.format(name="events"),
    """CREATE TRIGGER IF NOT EXISTS events_refuse_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END""",
    """CREATE TRIGGER IF NOT EXISTS events_refuse_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END""",
    # INSERT OR REPLACE deletes the clashing row without firing DELETE triggers when
    # another connection has recursive_triggers off; refusing the clash up front
    # closes that door whatever the connection's settings. RAISE(FAIL), not ABORT:
    # an ABORT anywhere in the insert's program brings back the statement journal.
    """CREATE TRIGGER IF NOT EXISTS events_refuse_replace BEFORE INSERT ON events
    WHEN NEW.version < 1
      OR EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)
      OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)
      OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)
    BEGIN
      SELECT RAISE(FAIL, 'events: version must be >= 1') WHERE NEW.version < 1;
      SELECT RAISE(FAIL, 'events are append-only: REPLACE refused');
    END""",
)


# The append-only triggers exactly as a store schema wrote them (whitespace aside): schema 3's
# (`SCHEMA`), and the replace trigger schemas 1 and 2 wrote (ABORT, no version check), which a
# file opened as it is keeps. `guard_problems` accepts nothing else: a `WHEN 0` or a body that
# no longer raises is as good as no trigger.
LEGACY_REPLACE_TRIGGER = """CREATE TRIGGER events_refuse_replace BEFORE INSERT ON events
    WHEN EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)
      OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)
      OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)
    BEGIN SELECT RAISE(ABORT, 'events are append-only: REPLACE refused'); END"""


def _words(sql: str) -> str:
    return " ".join(sql.replace("IF NOT EXISTS ", "").split())


GUARDS: dict[str, frozenset[str]] = {
    name: frozenset(
        {_words(statement) for statement in SCHEMA if f"TRIGGER IF NOT EXISTS {name} " in statement}
        | ({_words(LEGACY_REPLACE_TRIGGER)} if name == "events_refuse_replace" else set())
    )
    for name in ("events_refuse_update", "events_refuse_delete", "events_refuse_replace")
}


def guard_problems(conn: sqlite3.Connection) -> list[str]:
    """Each append-only trigger that is missing, or is not exactly as a store schema wrote it."""
    found = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'"))
    problems = []
    for name, accepted in GUARDS.items():
        sql = found.get(name)
        if sql is None:
            problems.append(f"trigger {name} is missing")
        elif _words(sql) not in accepted:
            problems.append(f"trigger {name} was altered")
    return problems


# What `select_matching` filters on besides seq (the primary key) and stream_id
# (UNIQUE(stream_id, version) is its index). Each costs one more B-tree insert per
# appended event: measured in README "Performance".
FILTER_INDEXES = (
    "CREATE INDEX IF NOT EXISTS events_type ON events (type)",
    "CREATE INDEX IF NOT EXISTS events_actor ON events (actor)",
    "CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at)",
)


def filter_sql(query: EventFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (with ORDER BY and LIMIT) and parameters of an `EventFilter`.

    Why it is written this way (measured on a 1M-event ledger, README "Performance"):
    - with a time filter the position bound is written `+seq`, so the planner takes the
      `recorded_at` index instead of walking the whole table in seq order;
    - a payload match first restricts the rows to its event types (the `type` index, or
      a scan in seq order when a LIMIT can stop it early), then looks for the value's
      JSON text followed by `,` `]` or `}` (a value, never a key: payloads are the
      store's own compact canonical JSON), and only then confirms it at its path with
      the JSON functions: a scalar equal to it, or an array holding it.
    """
    seq = "+seq" if query.since is not None or query.until is not None else "seq"
    where = [f"{seq} > ?"]
    params: list[Any] = [query.after]
    for sql, value in (
        (f"{seq} < ?", query.before),
        ("recorded_at >= ?", query.since),
        ("recorded_at <= ?", query.until),
        ("stream_id = ?", query.stream_id),
        ("actor = ?", query.actor),
    ):
        if value is not None:
            where.append(sql)
            params.append(value)
    if query.types:
        where.append(f"type IN ({','.join('?' * len(query.types))})")
        params.extend(query.types)
    if query.payload:
        # Only the matches' event types; in seq order (`+type`: no sort) when a LIMIT can stop early.
        match_types = sorted({m.type for m in query.payload})
        column = "+type" if query.limit is not None else "type"
        where.append(f"{column} IN ({','.join('?' * len(match_types))})")
        params.extend(match_types)
        needles = [orjson.dumps(v).decode() + end for v in sorted({m.value for m in query.payload}) for end in ",]}"]
        where.append("(" + " OR ".join("instr(payload, ?) > 0" for _ in needles) + ")")
        params.extend(needles)
        confirm = (
            "(type = ? AND (json_extract(payload, ?) = ? OR (json_type(payload, ?) = 'array' AND "
            "EXISTS (SELECT 1 FROM json_each(payload, ?) WHERE value = ?))))"
        )
        where.append("(" + " OR ".join(confirm for _ in query.payload) + ")")
        for m in query.payload:
            params.extend([m.type, m.path, m.value, m.path, m.path, m.value])
    sql = " AND ".join(where) + " ORDER BY seq"
    if query.limit is not None:
        sql += " LIMIT ?"
        params.append(query.limit)
    return sql, params


def schema_version(conn: sqlite3.Connection) -> str | None:
    """The store schema version a file records, None when it has none yet."""
    exists = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone()
    if not exists:
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()
    return None if row is None else str(row[0])


def create_schema(conn: sqlite3.Connection, db: sqlite_utils.Database, path: Path) -> None:
    """Create whatever is missing, under the caller's write lock; refuse an unknown version.

    A new file gets store schema 3. A version 1 file gains the filter indexes and becomes
    version 2; its events table (schema 2's ABORT constraints and CHECK) is kept as written:
    the same guarantees, only each insert costs a statement journal more.
    """
    found = schema_version(conn)
    if found not in (None, "1", *OPENED_AS_IS):
        raise StoreError(f"{path}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing to guess")
    if found is None and conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
        # Every release wrote its version with its first table: a log without one lost it by hand.
        raise StoreError(
            f"{path}: not a ledger (an events table but no store schema version: its meta table was dropped or "
            "emptied by hand); refusing to write to it"
        )
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
    if found not in OPENED_AS_IS:
        for statement in FILTER_INDEXES:  # version 1 had none; building them reads the log once
            conn.execute(statement)
        conn.execute(
            "INSERT INTO meta (key, value) VALUES ('store_schema_version', ?) "
            "ON CONFLICT(key) DO UPDATE SET value = excluded.value",
            (str(STORE_SCHEMA_VERSION) if found is None else "2",),
        )
