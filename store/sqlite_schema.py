"""The SQLite ledger's schema, created through sqlite-utils, and the SQL of the auditor's filter.

- Unique indexes on `(stream_id, version)` and `event_id` are the concurrency and idempotency guarantees.
- Triggers refuse UPDATE, DELETE and an INSERT that clashes with a row (`INSERT OR REPLACE` deletes
  without firing DELETE triggers when `recursive_triggers` is off); `table.transform()` would drop
  them silently: never run it on `events`. `verify` reports a guard missing or altered.
- The insert trigger raises FAIL, never ABORT (which puts every row of an insert under a statement
  journal), and the store inserts with `INSERT OR FAIL`.
- `events` has no index for the auditor's filter (each would slow every commit): it looks rows up in
  `event_index`, a derived table caught up in bulk (`store.sql.CATCH_UP`).
"""

from __future__ import annotations

import os
import sqlite3
from collections.abc import Callable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.store.chain import EVENT_COLUMNS, FOLD_COLUMNS
from lifecycle_fsm.store.records import EventFilter, StreamShare
from lifecycle_fsm.store.sql import CHECKPOINTS_ORDER, DERIVED_TABLES, INDEXED, event_conditions

if TYPE_CHECKING:
    import sqlite_utils

STORE_SCHEMA_VERSION = "1"
SYNCHRONOUS_MODES = ("OFF", "NORMAL", "FULL", "EXTRA")
_EVENTS = dict.fromkeys(EVENT_COLUMNS.split(", "), str) | {"seq": int, "version": int, "schema_version": int}
# The unique indexes and triggers `guard_problems` holds the file to, by name.
_GUARDS = {
    "events_stream_version": 'CREATE UNIQUE INDEX "events_stream_version" ON "events" ("stream_id", "version")',
    "events_event_id": 'CREATE UNIQUE INDEX "events_event_id" ON "events" ("event_id")',
    "events_refuse_update": """CREATE TRIGGER events_refuse_update BEFORE UPDATE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: UPDATE refused'); END""",
    "events_refuse_delete": """CREATE TRIGGER events_refuse_delete BEFORE DELETE ON events
    BEGIN SELECT RAISE(ABORT, 'events are append-only: DELETE refused'); END""",
    "events_refuse_replace": """CREATE TRIGGER events_refuse_replace BEFORE INSERT ON events
    WHEN NEW.version < 1
      OR EXISTS (SELECT 1 FROM events WHERE seq = NEW.seq)
      OR EXISTS (SELECT 1 FROM events WHERE event_id = NEW.event_id)
      OR EXISTS (SELECT 1 FROM events WHERE stream_id = NEW.stream_id AND version = NEW.version)
    BEGIN
      SELECT RAISE(FAIL, 'events: version must be >= 1') WHERE NEW.version < 1;
      SELECT RAISE(FAIL, 'events are append-only: REPLACE refused');
    END""",
}
# The triggers as statements that leave one in place (SQLite stores them without `IF NOT EXISTS`).
SCHEMA = tuple(
    sql.replace("CREATE TRIGGER", "CREATE TRIGGER IF NOT EXISTS", 1)
    for name, sql in _GUARDS.items()
    if name.startswith("events_refuse")
)


def schema_version(conn: sqlite3.Connection) -> str | None:
    """The store schema version a file records, None when it has none yet."""
    if not conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = 'meta'").fetchone():
        return None
    row = conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()
    return None if row is None else str(row[0])


def ensure_schema(
    conn: sqlite3.Connection, path: Path, found: str | None, locked: Callable[[], AbstractContextManager[object]]
) -> None:
    """Create the schema a new file lacks (`found` None) under the write lock; refuse any other version."""
    if found is None:
        with locked():
            found = schema_version(conn)  # another process may have created it meanwhile
            if found is None:
                if conn.execute("SELECT 1 FROM sqlite_master WHERE name = 'events'").fetchone():
                    raise StoreError(
                        f"{path}: not a ledger (an events table but no store schema version: its meta table was "
                        "dropped or emptied by hand); refusing to write to it"
                    )
                if conn.execute("SELECT 1 FROM sqlite_master").fetchone():
                    raise StoreError(f"{path}: another application's database, not a ledger; refusing to write to it")
                _make_private(path)
                # Imported only here: it costs a read command's start-up as much again (click, pluggy).
                import sqlite_utils

                create_schema(sqlite_utils.Database(conn, execute_plugins=False))
                found = STORE_SCHEMA_VERSION
    if found != STORE_SCHEMA_VERSION:
        raise StoreError(f"{path}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing to guess")


def _make_private(path: Path) -> None:
    """A ledger file is its owner's alone (0600), also when an empty file made by someone else becomes one."""
    try:
        if path.is_file():
            os.chmod(path, 0o600)
    except OSError as e:
        raise StoreError(f"{path}: cannot make the ledger file private to its owner ({e.strerror})") from e


def create_schema(db: sqlite_utils.Database) -> None:
    """Every table, index and trigger of a new ledger, inside the caller's write transaction."""
    events = db.table("events").create(_EVENTS, pk="seq", not_null=set(_EVENTS) - {"seq"})
    events.create_index(["stream_id", "version"], index_name="events_stream_version", unique=True)
    events.create_index(["event_id"], index_name="events_event_id", unique=True)
    for statement in SCHEMA:
        db.execute(statement)
    _create_derived(db)
    db.table("meta").create({"key": str, "value": str}, pk="key")
    db.table("meta").insert({"key": "store_schema_version", "value": STORE_SCHEMA_VERSION})


_OLD_FILTER_INDEXES = ("events_type", "events_actor", "events_recorded_at")


def _create_derived(db: sqlite_utils.Database) -> None:
    """Each derived table that is not there, empty (the log fills it: a checkpoint, `replay --full`, a catch-up)."""
    if not db.table("event_index").exists():
        index = db.table("event_index").create(
            {"seq": int, "type": str, "actor": str, "recorded_at": str},
            pk="seq",
            not_null={"type", "actor", "recorded_at"},
        )
        for column in ("type", "actor", "recorded_at"):  # what the auditor's filter looks rows up by
            index.create_index([column], index_name=f"event_index_{column}")
    db.table("streams").create(
        {"stream_id": str, "version": int, "status": str, "category": str},
        pk="stream_id",
        not_null={"version"},
        if_not_exists=True,
    )
    if not db.table("checkpoints").exists() and db.table("checkpoint_streams").exists():
        db.execute("DELETE FROM checkpoint_streams")  # copies of checkpoints that are gone, whose ids come again
    db.table("checkpoints").create(
        {
            "checkpoint_id": int,
            "position": int,
            "head_hash": str,
            "schema_version": int,
            "fingerprint": str,
            "snapshot": str,
            "snapshot_sha256": str,
            "recorded_at": str,
        },
        pk="checkpoint_id",
        if_not_exists=True,
    )
    # A load reads the newest checkpoint first: walked in this order, never sorted with every snapshot.
    db.table("checkpoints").create_index(
        ["position", "checkpoint_id"], index_name=CHECKPOINTS_ORDER, if_not_exists=True
    )
    db.table("checkpoint_streams").create(
        {"checkpoint_id": int, "stream_id": str, "version": int, "state": str, "state_sha256": str},
        pk=("stream_id", "checkpoint_id"),
        not_null={"version", "state", "state_sha256"},
        if_not_exists=True,
    )


def ensure_derived_tables(
    conn: sqlite3.Connection, writable: bool, locked: Callable[[], AbstractContextManager[object]]
) -> bool:
    """Whether the file has the event index; a writer first makes each derived table the file lacks (a
    read-only handle reads the file as it is)."""
    found = {name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'index')")}
    if found.issuperset((*DERIVED_TABLES, CHECKPOINTS_ORDER)) or not writable:
        return "event_index" in found
    with locked():  # another process may make them meanwhile: each is made only if still missing
        import sqlite_utils

        _create_derived(sqlite_utils.Database(conn, execute_plugins=False))
        for name in _OLD_FILTER_INDEXES:
            conn.execute(f"DROP INDEX IF EXISTS {name}")
    return True


def _words(sql: str) -> str:
    return " ".join(sql.split())


def guard_problems(conn: sqlite3.Connection) -> list[str]:
    """Each guard that is missing or not exactly as `_GUARDS` writes it, and any other trigger on `events`
    (one `BEFORE INSERT` could rewrite every row appended)."""
    found = dict(conn.execute("SELECT name, sql FROM sqlite_master WHERE tbl_name = 'events' AND sql IS NOT NULL"))
    triggers = {
        name
        for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger' AND tbl_name = 'events'")
    }
    problems = []
    for name, sql in _GUARDS.items():
        kind = "trigger" if name.startswith("events_refuse") else "unique index"
        if name not in found:
            problems.append(f"{kind} {name} is missing")
        elif _words(found[name]) != _words(sql):
            problems.append(f"{kind} {name} was altered")
    return problems + [f"trigger {name} is not one of the ledger's own" for name in sorted(triggers - _GUARDS.keys())]


def filter_sql(query: EventFilter, *, indexed: bool) -> tuple[str, list[Any]]:
    """The SELECT (in seq order, with its LIMIT) of an `EventFilter`, and its parameters.

    A filter on type, actor or time takes the rows the event index names, then those past its position
    from the log (without the index, `+seq` steers the planner to the `recorded_at` index). A payload
    match restricts to its types, looks for the value's JSON text followed by `,` `]` or `}` (a value,
    never a key, in canonical JSON), then confirms it at its path: a scalar equal to it, or an array holding it.
    """
    timed = query.since is not None or query.until is not None
    seq = "+seq" if timed and not indexed else "seq"
    # without the event index, `+type` keeps the walk in seq order when a LIMIT can stop it early
    plus = "+" if query.limit is not None and not indexed else ""
    where, params, looked_up = event_conditions(query, seq, plus)
    if query.payload:
        needles = [orjson.dumps(v).decode() + end for v in sorted({m.value for m in query.payload}) for end in ",]}"]
        where.append("(" + " OR ".join("instr(payload, %s) > 0" for _ in needles) + ")")
        confirm = (
            "(type = %s AND (json_extract(payload, %s) = %s OR (json_type(payload, %s) = 'array' AND "
            "EXISTS (SELECT 1 FROM json_each(payload, %s) WHERE value = %s))))"
        )
        where.append("(" + " OR ".join(confirm for _ in query.payload) + ")")
        params += needles
        for m in query.payload:
            params += [m.type, m.path, m.value, m.path, m.path, m.value]
    condition = " AND ".join(where)
    sql = f"SELECT {EVENT_COLUMNS} FROM events WHERE {condition} ORDER BY seq"
    if indexed and looked_up:
        index_where = " AND ".join(sql for sql, _ in looked_up)
        index_params = [value for _, values in looked_up for value in values]
        sql = (
            f"SELECT {EVENT_COLUMNS} FROM events WHERE seq IN (SELECT seq FROM event_index WHERE {index_where}) "
            f"AND {condition} UNION ALL SELECT {EVENT_COLUMNS} FROM events WHERE seq > {INDEXED} AND {condition} "
            "ORDER BY seq"
        )
        params = [*index_params, *params, *params]
    if query.limit is not None:
        sql += " LIMIT %s"
        params.append(query.limit)
    return sql, params


def fold_sql(after: int, before: int | None, streams: StreamShare | None) -> tuple[str, list[Any]]:
    """The SELECT of a slice's fold columns, only `streams`' rows if given (`+stream_id` keeps the planner
    off the stream index, which would need a sort)."""
    where, params, _ = event_conditions(EventFilter(after=after, before=before))
    if streams is not None:
        where.append(f"+stream_id {'NOT IN' if streams.others else 'IN'} (SELECT value FROM json_each(%s))")
        params.append(orjson.dumps(sorted(streams.names)).decode())
    return f"SELECT {FOLD_COLUMNS} FROM events WHERE {' AND '.join(where)} ORDER BY seq", params
