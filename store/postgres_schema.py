"""The PostgreSQL ledger's schema (and which one a URL's search_path names) and the SQL of the auditor's filter.

- `payload` and `recorded_at` are `text`: jsonb and timestamptz would rewrite the exact strings hashed.
- A row trigger refuses UPDATE and DELETE, a statement trigger TRUNCATE (the table owner can still
  disable them: run writers as a role with only SELECT and INSERT, docs/postgres.md).
- Schema creation takes the appends' advisory lock, so two processes creating a ledger do not race;
  an existing ledger opens without DDL, so such a role can use it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

import orjson
from psycopg import errors as pg_errors
from psycopg import sql

from lifecycle_fsm.errors import InputError, StoreError
from lifecycle_fsm.store.chain import EVENT_COLUMNS, GENESIS_HASH, STORED_TIME, header_parts, stamp_limit
from lifecycle_fsm.store.records import EventFilter, NewEvent
from lifecycle_fsm.store.sql import CHECKPOINTS_ORDER, DERIVED_TABLES, INDEXED, event_conditions

if TYPE_CHECKING:
    from lifecycle_fsm.store.postgres_session import PgSession

STORE_SCHEMA_VERSION = 1

# The event index (`store.sql.CATCH_UP`), in place of indexes on `events` that every commit would pay for.
_EVENT_INDEX_DDL = (
    """CREATE TABLE IF NOT EXISTS event_index (
        seq bigint PRIMARY KEY, type text NOT NULL, actor text NOT NULL, recorded_at text NOT NULL
    )""",
    "CREATE INDEX IF NOT EXISTS event_index_type ON event_index (type)",
    "CREATE INDEX IF NOT EXISTS event_index_actor ON event_index (actor)",
    "CREATE INDEX IF NOT EXISTS event_index_recorded_at ON event_index (recorded_at)",
    "DROP INDEX IF EXISTS events_type, events_actor, events_recorded_at",
)
# Tables derived from the log, made again (empty) when dropped by hand; copies of checkpoints that are gone
# go too (their ids come again).
_DERIVED_DDL = (
    "DO $$ BEGIN IF to_regclass('checkpoints') IS NULL THEN DROP TABLE IF EXISTS checkpoint_streams; END IF; END $$",
    """CREATE TABLE IF NOT EXISTS streams (
        stream_id text PRIMARY KEY, version bigint NOT NULL, status text, category text
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        checkpoint_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        position bigint NOT NULL, head_hash text NOT NULL, schema_version integer NOT NULL,
        fingerprint text NOT NULL, snapshot text NOT NULL, snapshot_sha256 text NOT NULL, recorded_at text NOT NULL
    )""",
    f"CREATE INDEX IF NOT EXISTS {CHECKPOINTS_ORDER} ON checkpoints (position, checkpoint_id)",
    """CREATE TABLE IF NOT EXISTS checkpoint_streams (
        checkpoint_id bigint NOT NULL REFERENCES checkpoints, stream_id text NOT NULL, version bigint NOT NULL,
        state text NOT NULL, state_sha256 text NOT NULL, PRIMARY KEY (stream_id, checkpoint_id)
    )""",
    *_EVENT_INDEX_DDL,
)
_DERIVED_PRESENT = "SELECT " + " AND ".join(
    f"to_regclass('{name}') IS NOT NULL" for name in (*DERIVED_TABLES, CHECKPOINTS_ORDER)
)
DDL = (
    """CREATE TABLE IF NOT EXISTS events (
        seq bigint PRIMARY KEY CHECK (seq >= 1),
        stream_id text NOT NULL,
        version bigint NOT NULL CHECK (version >= 1),
        event_id text NOT NULL UNIQUE,
        type text NOT NULL,
        schema_version integer NOT NULL,
        payload text NOT NULL,
        recorded_at text NOT NULL,
        actor text NOT NULL,
        prev_hash text NOT NULL,
        hash text NOT NULL,
        UNIQUE (stream_id, version)
    )""",
    """CREATE OR REPLACE FUNCTION lifecycle_refuse_change() RETURNS trigger LANGUAGE plpgsql AS $$
    BEGIN
        RAISE EXCEPTION 'events are append-only: % refused', TG_OP USING ERRCODE = 'restrict_violation';
    END $$""",
    """CREATE OR REPLACE TRIGGER events_refuse_update_delete BEFORE UPDATE OR DELETE ON events
        FOR EACH ROW EXECUTE FUNCTION lifecycle_refuse_change()""",
    """CREATE OR REPLACE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON events
        FOR EACH STATEMENT EXECUTE FUNCTION lifecycle_refuse_change()""",
    "CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL)",
    *_DERIVED_DDL,
)
# `chain.stamped` in SQL: the time an event is stored with, after the head's (`last.recorded_at`). A time
# in the ledger's form needs no escaping in JSON: the hashed header quotes a stamped one as it is.
STAMPED = (
    f'CASE WHEN last.recorded_at COLLATE "C" > p_recorded_at AND last.recorded_at COLLATE "C" <= p_stamp_limit '
    f"AND last.recorded_at ~ '^{STORED_TIME}$' AND p_recorded_at ~ '^{STORED_TIME}$' "
    "THEN last.recorded_at ELSE p_recorded_at END"
)
# One event appended in one statement (`append_one`): the lock, then (each statement a new snapshot) the
# head and the expected versions, the time stamped, the hash from `chain.header_parts`, the row, and the
# notification. When a check fails nothing is written and the row returned is NULLs.
_APPEND_FUNCTION = f"""CREATE OR REPLACE FUNCTION lifecycle_append(lock_key bigint, p_stream text, p_version bigint,
    p_event_id text, p_type text, p_schema_version integer, p_payload text, p_recorded_at text, p_stamp_limit text,
    p_actor text,
    p_header_before text, p_time_json text, p_header_middle text, p_header_after text, p_checks text,
    p_check_id boolean, p_channel text, OUT r_seq bigint, OUT r_prev_hash text, OUT r_hash text, OUT r_recorded_at text)
LANGUAGE plpgsql AS $$
BEGIN
    PERFORM pg_advisory_xact_lock(lock_key);
    SELECT coalesce(last.seq, 0) + 1, coalesce(last.hash, '{GENESIS_HASH}'), {STAMPED}
    INTO r_seq, r_prev_hash, r_recorded_at
    FROM (SELECT) AS one LEFT JOIN (SELECT seq, hash, recorded_at FROM events ORDER BY seq DESC LIMIT 1) AS last ON true
    WHERE NOT EXISTS (SELECT FROM jsonb_array_elements(p_checks::jsonb) AS c WHERE (c->>1)::bigint
                      <> coalesce((SELECT max(e.version) FROM events e WHERE e.stream_id = c->>0), 0))
      AND NOT (p_check_id AND EXISTS (SELECT FROM events e WHERE e.event_id = p_event_id));
    IF NOT FOUND THEN
        RETURN;
    END IF;
    r_hash := encode(sha256(convert_to(r_prev_hash || E'\\n' || p_header_before
        || CASE WHEN r_recorded_at = p_recorded_at THEN p_time_json ELSE '"' || r_recorded_at || '"' END
        || p_header_middle || r_seq::text || p_header_after || E'\\n' || p_payload, 'UTF8')), 'hex');
    INSERT INTO events ({EVENT_COLUMNS}) VALUES (r_seq, p_stream, p_version, p_event_id, p_type,
        p_schema_version, p_payload, r_recorded_at, p_actor, r_prev_hash, r_hash);
    PERFORM pg_notify(p_channel, NULL);
END $$"""
_HAS_APPEND_FUNCTION = (
    "SELECT to_regprocedure('lifecycle_append(bigint, text, bigint, text, text, integer, text, text, text, "
    "text, text, text, text, text, text, boolean, text)') IS NOT NULL"
)
APPEND_ONE = "SELECT r_seq, r_prev_hash, r_hash, r_recorded_at FROM lifecycle_append(" + ", ".join(["%s"] * 17) + ")"
# The append-only triggers as `pg_get_triggerdef` gives them (schema left out), and their function's body.
_PG_GUARDS = {
    "events_refuse_update_delete": "CREATE TRIGGER events_refuse_update_delete BEFORE DELETE OR UPDATE ON events "
    "FOR EACH ROW EXECUTE FUNCTION lifecycle_refuse_change()",
    "events_refuse_truncate": "CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON events "
    "FOR EACH STATEMENT EXECUTE FUNCTION lifecycle_refuse_change()",
}
_PG_GUARD_SOURCE = " ".join(next(d for d in DDL if "FUNCTION lifecycle_refuse_change()" in d).split("$$")[1].split())
# The keys the database enforces the log's order and idempotency with, as `pg_get_constraintdef` gives them.
_PG_KEYS = ("PRIMARY KEY (seq)", "UNIQUE (event_id)", "UNIQUE (stream_id, version)")
KEY_ROWS = "SELECT pg_get_constraintdef(oid) FROM pg_constraint WHERE conrelid = 'events'::regclass"
GUARD_ROWS = (
    "SELECT t.tgname, t.tgenabled, pg_get_triggerdef(t.oid), p.prosrc FROM pg_trigger t "
    "JOIN pg_proc p ON p.oid = t.tgfoid WHERE t.tgrelid = 'events'::regclass AND NOT t.tgisinternal"
)


def guard_problems(rows: Sequence[tuple[Any, ...]], keys: Sequence[tuple[Any, ...]] = ()) -> list[str]:
    """Each append-only trigger on `events` that is missing, not enabled for every session, or not exactly
    as `DDL` made it; any other trigger on it (one could rewrite every row appended); each key missing."""
    found = {
        name: (enabled, re.sub(r" ON [^ ]+\.events ", " ON events ", definition), " ".join(source.split()))
        for name, enabled, definition, source in rows
    }
    problems = []
    for name, definition in _PG_GUARDS.items():
        if name not in found:
            problems.append(f"trigger {name} is missing")
        elif found[name][0] not in ("O", "A"):
            problems.append(f"trigger {name} is disabled")
        elif found[name][1:] != (definition, _PG_GUARD_SOURCE):
            problems.append(f"trigger {name} was altered")
    problems += [f"trigger {name} is not one of the ledger's own" for name in sorted(found.keys() - _PG_GUARDS.keys())]
    present = {" ".join(str(definition).split()) for (definition,) in keys}
    problems += [f"{key} on events is missing" for key in _PG_KEYS if key not in present]
    return problems


def append_one(
    event: NewEvent, payload: str, version: int, checks: Sequence[tuple[str, int]], session: PgSession, check_id: bool
) -> list[Any]:
    """`APPEND_ONE`'s values: append `event` (its canonical `payload`) as `version` of its stream, only if
    every `(stream, version)` of `checks` holds and (`check_id`) its id is not taken."""
    e = event
    parts = header_parts(e.actor, e.event_id, e.recorded_at, e.schema_version, e.stream_id, e.type, version)
    columns = [e.stream_id, version, e.event_id, e.type, e.schema_version, payload, e.recorded_at]
    limit = stamp_limit(e.recorded_at)
    checked = orjson.dumps(checks).decode()
    return [session.lock_key, *columns, limit, e.actor, *parts, checked, check_id, session.channel]


def filter_sql(query: EventFilter, *, indexed: bool) -> tuple[str, list[Any]]:
    """The SELECT of an `EventFilter`'s rows in seq order, no LIMIT (the caller pages); the meaning of
    SQLite's `filter_sql`, the payload's value looked for as text (`strpos`) before it is parsed."""
    where, params, looked_up = event_conditions(query)
    if query.payload:
        ors = []
        for m in query.payload:
            path = m.path.removeprefix("$.").split(".")
            ors.append(
                "(type = %s AND strpos(payload, %s) > 0 AND ((payload::jsonb #> %s::text[]) = to_jsonb(%s::text) OR "
                "(jsonb_typeof(payload::jsonb #> %s::text[]) = 'array' AND (payload::jsonb #> %s::text[]) ? %s)))"
            )
            params.extend([m.type, orjson.dumps(m.value).decode(), path, m.value, path, path, m.value])
        where.append("(" + " OR ".join(ors) + ")")
    condition = " AND ".join(where)
    if not (indexed and looked_up):
        return f"SELECT {EVENT_COLUMNS} FROM events WHERE {condition} ORDER BY seq", params
    index_where = " AND ".join(["seq > %s", *(sql for sql, _ in looked_up)])
    sql = (
        f"(SELECT {EVENT_COLUMNS} FROM events WHERE seq IN (SELECT seq FROM event_index WHERE {index_where}) "
        f"AND {condition} UNION ALL SELECT {EVENT_COLUMNS} FROM events WHERE seq > {INDEXED} AND {condition}) "
        "ORDER BY seq"
    )
    return sql, [query.after, *(value for _, values in looked_up for value in values), *params, *params]


def schema_version(session: PgSession) -> str | None:
    """The store schema version this schema records; None when it holds no ledger yet."""
    if session.schema is None:  # the URL's schema does not exist, or this role may not use it
        _refuse_unusable_schema(session)
        return None  # no ledger (a table later in the path is another's)
    with session.mapped("cannot read the ledger schema"):
        found = session.conn.execute(
            "SELECT to_regclass(format('%%I.meta', %s::text)) IS NOT NULL, "
            "to_regclass(format('%%I.events', %s::text)) IS NOT NULL",
            (session.schema, session.schema),
        )
        row = found.fetchone()
        assert row is not None
        has_meta, has_events = row
        if not has_meta:
            if has_events:
                raise StoreError(
                    f"{session.where}: schema {session.schema!r} has an `events` table but is not a ledger"
                )
            return None
        value = session.conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()
    if value is None and has_events:  # the version went in with the tables: removed by hand since
        raise StoreError(
            f"{session.where}: schema {session.schema!r} has an `events` table but no store schema version "
            "(emptied by hand): not a ledger; refusing to write to it"
        )
    return None if value is None else str(value[0])


def _refuse_unusable_schema(session: PgSession) -> None:
    """A schema this role lacks USAGE on looks missing: say which grant is missing, not "no ledger"."""
    name = session.ledger_schema
    with session.mapped("cannot read the ledger schema"):
        row = session.conn.execute(
            "SELECT NOT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = %s", (name,)
        ).fetchone()
    if row is not None and row[0]:
        raise StoreError(
            f"{session.where}: this role may not use schema {name!r} (permission denied; the owner must "
            "GRANT USAGE ON SCHEMA and the table privileges to it: docs/postgres.md, "
            '"The role the supervisors run as")'
        )


def ensure_schema(session: PgSession, *, create: bool) -> bool:
    """Check (with `create`, make) the ledger's tables, refusing another schema version; whether the ledger
    has the event index."""
    found = schema_version(session)
    if found == str(STORE_SCHEMA_VERSION):
        return ensure_derived_tables(session, create=create)
    if found is not None:
        raise StoreError(f"{session.where}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing")
    if not create:
        raise InputError(f"no ledger at {session.where} (create one with `lifecycle init`)")
    with session.mapped("cannot create the ledger schema"), session.conn.transaction():
        session.conn.execute("SELECT pg_advisory_xact_lock(%s)", (session.lock_key,))
        if session.schema is None:  # the URL's schema does not exist yet: make it
            name = session.ledger_schema
            session.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name)))
            session.schema = name
        for statement in (*DDL, _APPEND_FUNCTION):
            session.conn.execute(statement)
        session.conn.execute(
            "INSERT INTO meta (key, value) VALUES ('store_schema_version', %s) ON CONFLICT (key) DO NOTHING",
            (str(STORE_SCHEMA_VERSION),),
        )
    return True


def ensure_append_function(session: PgSession, *, create: bool) -> bool:
    """Whether the ledger has the current append function (an older ledger gets it when a role that may
    change the schema opens it; until then its appends are refused)."""
    return _upgraded(session, _HAS_APPEND_FUNCTION, (_APPEND_FUNCTION,), create=create)


def ensure_derived_tables(session: PgSession, *, create: bool, lost: str = "") -> bool:
    """Whether the ledger has the event index; a writer whose role may change the schema first makes each
    derived table the ledger lacks (otherwise it is read as it is)."""
    if _upgraded(session, _DERIVED_PRESENT, _DERIVED_DDL, create=create, lost=lost):
        return True
    with session.mapped("cannot read the ledger schema", lost=lost):
        row = session.conn.execute("SELECT to_regclass('event_index') IS NOT NULL").fetchone()
    return bool(row is not None and row[0])


def _upgraded(session: PgSession, present: str, statements: Sequence[str], *, create: bool, lost: str = "") -> bool:
    """Whether the ledger has what `present` asks; if not and `create`, make it with `statements` under
    the ledger's lock (False for a role that may not)."""
    with session.mapped("cannot read or update the ledger schema", lost=lost):
        row = session.conn.execute(present).fetchone()
        if row is not None and row[0]:
            return True
        if not create:
            return False
        try:
            with session.conn.transaction():
                session.conn.execute("SELECT pg_advisory_xact_lock(%s)", (session.lock_key,))
                for statement in statements:
                    session.conn.execute(statement)
        except pg_errors.InsufficientPrivilege:
            return False
    return True


_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: longer names are cut
_ENTRY = re.compile(r'\s*("(?:[^"]|"")*"?[^,]*|[^,]*),?')  # one search_path entry: a quoted name may hold commas


def _entries(search_path: str) -> list[str]:
    return [entry.strip() for entry in _ENTRY.findall(search_path) if entry.strip()]


def _identifier(entry: str) -> str:
    """A search_path entry as the schema name PostgreSQL reads it: a quoted name as written, an unquoted one
    with ASCII letters lower-cased; either cut to 63 bytes (whole characters), as the server does."""
    if entry.startswith('"'):
        name = entry[1:-1].replace('""', '"')
    else:
        name = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in entry)
    return name.encode()[:_MAX_IDENTIFIER_BYTES].decode(errors="ignore")


_USER_ENTRIES = ("$user", '"$user"')


def ledger_schema(search_path: str, user: str) -> str:
    """The schema of the ledger a URL names: the first its search_path names, `$user` entries skipped, else
    the role's own. Never which schemas exist: with `"$user", public` that would change the day someone
    creates the role's schema. The session is then pinned to this one schema."""
    named = [e for e in _entries(search_path) if e not in _USER_ENTRIES]
    return _identifier(named[0]) if named else user


def names_user(search_path: str) -> bool:
    """Whether a search_path has a `$user` entry."""
    return any(e in _USER_ENTRIES for e in _entries(search_path))
