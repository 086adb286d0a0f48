"""The PostgreSQL ledger's schema, its connection settings and the psycopg error boundary.

Why it is built this way:
- `payload` and `recorded_at` are `text`, never `jsonb` / `timestamptz`: jsonb
  reorders keys and rewrites numbers, timestamptz rewrites `Z` as `+00:00` and drops
  zero fractions, and the chain hashes the exact strings (LIBRARY_NOTES).
- A `BEFORE UPDATE OR DELETE … FOR EACH ROW` trigger refuses edits (and `ON CONFLICT
  DO UPDATE`); TRUNCATE fires no row trigger, so it has its own statement trigger.
  The table owner can still disable triggers: run writers as a role holding only
  SELECT and INSERT on `events` (README, "PostgreSQL").
- The tables live in the URL's schema (`?options=-csearch_path%3Dx`); schema creation
  is serialised by the same advisory lock appends take, so two processes opening a
  new ledger at once do not race on `CREATE TABLE IF NOT EXISTS`.
- Every psycopg exception is translated here into the project's error tree, and no
  message ever carries the URL's password.
"""

from __future__ import annotations

import hashlib
import itertools
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, NoReturn
from urllib.parse import parse_qsl, urlsplit

import orjson
import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.pq import TransactionStatus

from lifecycle_fsm.store.errors import InputError, IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.open import redact_url
from lifecycle_fsm.store.options import busy_timeout_seconds, synchronous_mode
from lifecycle_fsm.store.postgres_pipeline import Pipeline
from lifecycle_fsm.store.records import EventFilter
from lifecycle_fsm.store.threads import ThreadOwner

__all__ = [
    "DDL",
    "EVENT_COLUMNS",
    "PG_GUARDS",
    "PG_GUARD_SOURCE",
    "STORE_SCHEMA_VERSION",
    "SYNCHRONOUS_COMMIT",
    "PgSession",
    "filter_sql",
]

STORE_SCHEMA_VERSION = 1
EVENT_COLUMNS = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, prev_hash, hash"
# SQLite's synchronous modes map onto synchronous_commit: FULL/EXTRA wait for the WAL
# flush (survives a server crash or power loss); NORMAL/OFF do not wait (a server crash
# may lose the last commits, never corrupt the ledger; the writer's own crash loses nothing).
SYNCHRONOUS_COMMIT = {"OFF": "off", "NORMAL": "off", "FULL": "on", "EXTRA": "on"}

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
    """CREATE TABLE IF NOT EXISTS streams (
        stream_id text PRIMARY KEY, version bigint NOT NULL, status text, category text
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoints (
        checkpoint_id bigint GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
        position bigint NOT NULL, head_hash text NOT NULL, schema_version integer NOT NULL,
        fingerprint text NOT NULL, snapshot text NOT NULL, snapshot_sha256 text NOT NULL, recorded_at text NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS checkpoint_streams (
        checkpoint_id bigint NOT NULL REFERENCES checkpoints, stream_id text NOT NULL, version bigint NOT NULL,
        state text NOT NULL, state_sha256 text NOT NULL, PRIMARY KEY (stream_id, checkpoint_id)
    )""",
    "CREATE TABLE IF NOT EXISTS meta (key text PRIMARY KEY, value text NOT NULL)",
    # What `select_matching` filters on besides seq and stream_id (as in SQLite's schema 2).
    "CREATE INDEX IF NOT EXISTS events_type ON events (type)",
    "CREATE INDEX IF NOT EXISTS events_actor ON events (actor)",
    "CREATE INDEX IF NOT EXISTS events_recorded_at ON events (recorded_at)",
)
# The append-only triggers as `pg_get_triggerdef` gives them back (the table's schema left out)
# and the body of the function they run, whitespace aside: what `guard_problems` accepts.
PG_GUARDS = {
    "events_refuse_update_delete": "CREATE TRIGGER events_refuse_update_delete BEFORE DELETE OR UPDATE ON events "
    "FOR EACH ROW EXECUTE FUNCTION lifecycle_refuse_change()",
    "events_refuse_truncate": "CREATE TRIGGER events_refuse_truncate BEFORE TRUNCATE ON events "
    "FOR EACH STATEMENT EXECUTE FUNCTION lifecycle_refuse_change()",
}
PG_GUARD_SOURCE = " ".join(next(d for d in DDL if "FUNCTION lifecycle_refuse_change()" in d).split("$$")[1].split())


def filter_sql(query: EventFilter) -> tuple[str, list[Any]]:
    """The WHERE clause (no ORDER BY or LIMIT: the caller pages by seq) of an `EventFilter`.

    The same meaning as SQLite's (`store.sqlite_schema.filter_sql`): a payload match
    restricts to its types, looks for the value's JSON text (`strpos`), then confirms
    it at its path on the parsed payload: a string equal to it, or an array holding it.
    """
    where = ["seq > %s"]
    params: list[Any] = [query.after]
    for clause, value in (
        ("seq < %s", query.before),
        ("recorded_at >= %s", query.since),
        ("recorded_at <= %s", query.until),
        ("stream_id = %s", query.stream_id),
        ("actor = %s", query.actor),
    ):
        if value is not None:
            where.append(clause)
            params.append(value)
    if query.types:
        where.append("type = ANY(%s::text[])")
        params.append(list(query.types))
    if query.payload:
        where.append("type = ANY(%s::text[])")
        params.append(sorted({m.type for m in query.payload}))
        ors = []
        for m in query.payload:
            path = m.path.removeprefix("$.").split(".")
            ors.append(
                "(type = %s AND strpos(payload, %s) > 0 AND ((payload::jsonb #> %s::text[]) = to_jsonb(%s::text) OR "
                "(jsonb_typeof(payload::jsonb #> %s::text[]) = 'array' AND (payload::jsonb #> %s::text[]) ? %s)))"
            )
            params.extend([m.type, orjson.dumps(m.value).decode(), path, m.value, path, path, m.value])
        where.append("(" + " OR ".join(ors) + ")")
    return " AND ".join(where), params


def _secrets(url: str) -> list[str]:
    """Every spelling of the URL's password a driver message might echo."""
    found = []
    try:
        parts = urlsplit(url)
        if parts.password:
            found.append(parts.password)
        found += [v for k, v in parse_qsl(parts.query) if k.lower() == "password" and v]
    except ValueError:
        pass
    match = re.search(r"://[^:/@]*:([^@]*)@", url)  # a raw, possibly unparsable user:password@
    if match and match.group(1):
        found.append(match.group(1))
    return sorted({s for s in found if s} | {url}, key=len, reverse=True)


# A timeout the URL's `options` set (pg_settings.source 'client') is kept; otherwise ours.
_SET_UNLESS_IN_URL = (
    "set_config('{name}', CASE WHEN (SELECT source FROM pg_settings WHERE name = '{name}') = 'client' "
    "THEN current_setting('{name}') ELSE %s END, false)"
)


_MAX_IDENTIFIER_BYTES = 63  # NAMEDATALEN - 1: longer names are cut
_MAX_PREPARED = 64  # statement shapes (rows per insert, checks) prepared per connection


def _first_entry(search_path: str) -> str:
    """The first entry of a search_path as written: a quoted name may hold commas (`"a,b", public`)."""
    path = search_path.strip()
    if path.startswith('"'):
        end = 1
        while (end := path.find('"', end)) != -1:
            if path[end + 1 : end + 2] != '"':
                return path[: end + 1]
            end += 2
    return path.split(",")[0].strip()


def _lock_key(schema: str) -> int:
    """The advisory-lock key for one ledger: its schema name, hashed to a signed 64-bit int."""
    return int.from_bytes(hashlib.sha256(b"lifecycle-fsm:" + schema.encode()).digest()[:8], "big", signed=True)


class PgSession:
    """One connection to a ledger's schema, with the error boundary every call goes through."""

    def __init__(self, url: str, *, synchronous: str, busy_timeout: float, idle_timeout: float) -> None:
        scheme, sep, rest = url.partition("://")
        url = self.url = scheme.lower() + sep + rest  # `POSTGRESQL://` is a URL to `is_postgres_url`, not to libpq
        self.where = redact_url(url)
        # The thread that may use this connection (store/threads.py); in a forked child, none may (and
        # psycopg never closes, so never sends a Terminate for, a connection it frees in another process).
        self.owner = ThreadOwner(self.where)
        self._secrets = _secrets(url)
        mode = SYNCHRONOUS_COMMIT[synchronous_mode(synchronous, SYNCHRONOUS_COMMIT)]
        busy_timeout = busy_timeout_seconds(busy_timeout)
        if busy_timeout_seconds(idle_timeout, "idle_timeout") == 0:
            raise InputError(f"idle_timeout must be above 0 seconds, not {idle_timeout!r}")
        self.busy_timeout = busy_timeout
        self.idle_timeout = idle_timeout
        self._setup = (f"{max(1, int(busy_timeout * 1000))}ms", f"{max(1, int(idle_timeout * 1000))}ms", mode)
        self._closed = False  # `close()` was called: a closed session is never reconnected
        self.held = False  # a transaction of the store's own is open on `conn`: never recovered under it
        self.reconnects = 0  # sessions opened after the first one dropped
        self._listener: psycopg.Connection[Any] | None = None  # `listener()`'s LISTEN connection
        self.conn, row = self._connect("cannot connect")
        try:
            self.lock_timeout: str = row[0]  # as the server shows it ("30s", "500ms"): for messages
            self.idle_timeout_shown: str = row[1]
            self.search_path: str = row[4]
            self.schema: str | None = self._url_schema(row[3])
            self._quotes_plainly: bool = row[5]  # a backslash in a '…' literal is a backslash (see `literal`)
            self.lock_key = _lock_key(self.schema or self._first_schema())
            self.lock_sql = f"SELECT pg_advisory_xact_lock({self.lock_key})"
            self.channel = f"lifecycle_{self.lock_key & 0xFFFF_FFFF_FFFF_FFFF:x}"  # one per ledger schema
            self.notify_sql = f"NOTIFY {self.channel}"
            self.binder = psycopg.ClientCursor(self.conn)  # binds values client-side for multi-statement trips
            self._seen: set[str] = set()
            self._prepared: dict[str, str] = {}
            # Names are never reused: a PREPARE interrupted (Ctrl-C) may or may not have run on the server,
            # so the statement is prepared again under a new name (as `Pipeline` does).
            self._serial = itertools.count()
            self.pipeline = Pipeline(self)
        except BaseException:
            self.conn.close()
            raise

    def _connect(self, what: str) -> tuple[psycopg.Connection[Any], tuple[Any, ...]]:
        """A new connection, set up as every session of this store is; and what the setup read back."""
        with self.mapped(what, lost=None):
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10, application_name="lifecycle-fsm")
            # Statements are prepared by `prepare_if_repeated`, never by psycopg: psycopg sends
            # DEALLOCATE ALL after a ROLLBACK when it has prepared any, which would drop ours too.
            conn.prepare_threshold = None
        try:
            with self.mapped("cannot configure the session", lost=None):
                # lock_timeout bounds the wait for the write lock (SQLite's busy timeout);
                # idle_in_transaction_session_timeout ends a writer that stalls holding it.
                # Either one given in the URL (`options=-clock_timeout%3D5s`) wins. Never 0: that
                # would mean "wait forever" here, not "fail at once" as in SQLite.
                row = conn.execute(
                    f"SELECT {_SET_UNLESS_IN_URL.format(name='lock_timeout')}, "
                    f"{_SET_UNLESS_IN_URL.format(name='idle_in_transaction_session_timeout')}, "
                    "set_config('synchronous_commit', %s, false), current_schema(), "
                    "current_setting('search_path'), current_setting('standard_conforming_strings') = 'on', "
                    "set_config('client_encoding', 'UTF8', false)",  # the pipeline sends and reads UTF-8 bytes
                    self._setup,
                ).fetchone()
        except BaseException:
            conn.close()
            raise
        assert row is not None
        return conn, row

    # --- a connection lost, or left unusable by an interrupted call ----------------------------

    def ready(self) -> None:
        """Before an operation of the store: a connection that cannot take it is made usable (`recover`).
        Two attribute reads when it can (the common case)."""
        pg = self.conn.pgconn
        if pg.transaction_status or pg.pipeline_status:  # not IDLE (0), or libpq left in pipeline mode
            self.recover()

    def recover(self) -> None:
        """Make the connection usable again before an operation starts, never under a transaction the
        store has open (`held`: the operation then fails on its own, and the store rolls back):

        - a transaction nobody holds (an interrupt cut its cleanup short) is rolled back;
        - a connection left with answers unread or in pipeline mode (interrupted mid-exchange) is closed:
          the server rolls back whatever it had not committed;
        - a closed one (the server restarted, failed over or ended the session; psycopg or the pipeline
          closed it after an interrupt) is replaced by a new session set up as at open: the same URL, so
          the same search_path and schema, the session settings again, prepared statements forgotten
          (they are prepared again on use) and the follower's LISTEN connection reopened on its next wait.

        A session `close()` closed stays closed.
        """
        if self.held or self._closed:
            return
        conn = self.conn
        pg = conn.pgconn
        status = pg.transaction_status
        if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR) and not pg.pipeline_status:
            try:
                conn.execute("ROLLBACK")
            except psycopg.Error:
                conn.close()
        elif not conn.closed:
            conn.close()
        if conn.closed:
            self._reconnect()

    def _reconnect(self) -> None:
        conn, row = self._connect("lost its connection to the server and cannot connect again")
        if (self._url_schema(row[3]), row[5]) != (self.schema, self._quotes_plainly):
            conn.close()
            raise StoreError(
                f"{self.where}: lost its connection to the server; a new session finds schema {row[3]!r}, not "
                f"{self.schema!r}: open the ledger again"
            )
        try:  # what the old session prepared is forgotten before the new one is put in its place
            self._seen.clear()
            self._prepared.clear()
            self.pipeline.forget()
            binder = psycopg.ClientCursor(conn)
        except BaseException:  # interrupted: the old session stays (closed), the next call tries again
            conn.close()
            raise
        old = self.conn
        self.conn, self.binder = conn, binder  # one step: no interrupt lands between the two
        self.reconnects += 1
        old.close()  # closed already (psycopg's close is then a no-op)

    def listener(self) -> psycopg.Connection[Any]:
        """A connection listening on this ledger's channel (`wait_for_new`), opened on first use and again
        after it was lost (notifications sent meanwhile are lost: the caller re-reads by seq after LISTEN)."""
        listener = self._listener
        if listener is not None and listener.closed:
            self._listener = listener = None
        if listener is None:
            with self.mapped("cannot listen for new events"):
                listener = psycopg.connect(self.url, autocommit=True, connect_timeout=10)
                try:
                    listener.execute(f"LISTEN {self.channel}")
                except BaseException:
                    listener.close()
                    raise
            self._listener = listener
        return listener

    def _url_schema(self, current: str | None) -> str | None:
        """The URL's schema if it exists, else None. PostgreSQL's current_schema() skips a missing first
        schema (`search_path=mine,public` without `mine` is `public`): that would be another ledger."""
        if _first_entry(self.search_path) in ("$user", '"$user"'):
            return current  # the default path: whichever schema it resolves to
        return current if current == self._first_schema() else None

    def _first_schema(self) -> str:
        """The first schema of the search_path as PostgreSQL reads it: a quoted name as written, an unquoted one
        folded to lower case (ASCII letters, as `downcase_identifier`): `MySchema` is the schema `myschema`;
        either cut to 63 bytes (a whole character), as the server cuts every identifier."""
        first = _first_entry(self.search_path)
        if first.startswith('"'):
            name = first[1:-1].replace('""', '"')
        else:
            name = "".join(chr(ord(c) + 32) if "A" <= c <= "Z" else c for c in first)
        return name.encode()[:_MAX_IDENTIFIER_BYTES].decode(errors="ignore")

    # --- statements in a multi-statement round trip ------------------------------------------

    def prepare_if_repeated(self, sql: str, params: Sequence[Any] | None) -> None:
        """PREPARE `sql` the second time its shape is seen (a one-command CLI process never pays
        the extra round trip); `inline` then sends `EXECUTE name(values)`, which skips planning
        (the guarded insert plans in about as long as it runs)."""
        if not params or sql in self._prepared or len(self._prepared) >= _MAX_PREPARED or "%%" in sql:
            return
        if sql not in self._seen:
            self._seen.add(sql)
            return
        name = f"lifecycle_stmt_{next(self._serial)}"
        numbers = itertools.count(1)
        with self.mapped("cannot prepare a statement"):
            self.conn.execute(f"PREPARE {name} AS " + re.sub("%s", lambda _: f"${next(numbers)}", sql))
        self._prepared[sql] = name

    def query(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        """A read outside any transaction, as EXECUTE of a prepared statement once its shape repeats."""
        pg = self.conn.pgconn
        if pg.transaction_status or pg.pipeline_status:  # `ready()`, inlined: every read passes here
            self.recover()
            pg = self.conn.pgconn
        if pg.transaction_status == TransactionStatus.IDLE:
            self.prepare_if_repeated(sql, params)
        if sql in self._prepared:
            return self.conn.execute(self.inline(sql, params))
        return self.conn.execute(sql, params)

    def inline(self, sql: str, params: Sequence[Any]) -> str:
        """`sql` with its values bound client-side, as EXECUTE of its prepared statement if there is one."""
        name = self._prepared.get(sql)
        if name is not None:
            sql = f"EXECUTE {name}({', '.join(['%s'] * len(params))})"
        pieces = sql.split("%s")
        if not self._quotes_plainly or "%%" in sql or len(pieces) != len(params) + 1:
            return self.binder.mogrify(sql, params)
        text = [pieces[0]]
        for param, piece in zip(params, pieces[1:], strict=True):
            text += (self.literal(param), piece)
        return "".join(text)

    def literal(self, value: Any) -> str:
        """`value` as an SQL literal. With standard_conforming_strings on (checked at connect),
        a string's only special character is the quote, doubled: ~1 µs a value where psycopg's
        mogrify costs ~3 µs and its list quoting ~40 µs an element. Other types go to psycopg."""
        kind = type(value)
        if isinstance(value, str) and kind is str:
            if "\0" in value:  # PostgreSQL text cannot hold NUL (psycopg refuses it too)
                raise InputError(f"{self.where}: the database cannot store this value (text containing NUL)")
            return "'" + value.replace("'", "''") + "'"
        if kind is int:
            return str(value)
        if value is None:
            return "NULL"
        if kind is list:
            return f"ARRAY[{', '.join(map(self.literal, value))}]" if value else "'{}'"
        return self.binder.mogrify("%s", (value,))

    # --- the error boundary --------------------------------------------------------------

    def scrub(self, text: str) -> str:
        for secret in self._secrets:
            text = text.replace(secret, "***" if secret != self.url else self.where)
        return text

    def fail(self, what: str, e: psycopg.Error, lost: str | None = "") -> NoReturn:
        """Raise `e` as the project error it means, from `e`, without any password in it (`lost`: what a
        connection lost during the call means for a write; None: a connection being opened, not lost)."""
        detail = self.scrub(str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__)
        prefix = f"{self.where}: {what}"
        error: LifecycleError
        if isinstance(e, pg_errors.LockNotAvailable):
            holder, table = self._lock_holder(), ""
            if not holder:  # not a writer: a session holding a table lock (`LOCK TABLE`, `ALTER TABLE`, …)?
                table, holder = self._table_lock_holder()
            held = f"a lock on the ledger's table `{table}`" if table else "the ledger's write lock"
            error = StoreError(
                f"{prefix}: another {'session' if table else 'writer'} held {held} for more than "
                f"{self.lock_timeout} (lock_timeout{holder}); nothing was appended, retry later"
            )
        elif isinstance(e, pg_errors.IdleInTransactionSessionTimeout) or "idle-in-transaction" in detail:
            error = StoreError(
                f"{prefix}: the server ended this session after it sat idle inside a write transaction for more "
                f"than {self.idle_timeout_shown} (idle_in_transaction_session_timeout); nothing it was writing was kept"
            )
        elif isinstance(e, pg_errors.RestrictViolation):
            error = IntegrityError(f"{prefix}: {detail}")
        elif isinstance(e, psycopg.DataError):
            error = InputError(f"{prefix}: the database cannot store this value ({detail})")
        elif isinstance(e, pg_errors.UndefinedTable):
            error = StoreError(f"{prefix}: not a ledger (no ledger tables in schema {self.schema!r}) ({detail})")
        elif lost is not None and isinstance(e, psycopg.OperationalError) and self._lost():
            note = f"; {lost}" if lost else ""
            error = StoreError(f"{prefix}: the connection to the server was lost ({detail}){note}; the next call "
                               "on this ledger connects again")  # fmt: skip
        else:
            error = StoreError(f"{prefix} ({detail})")
        raise error from e

    def _lock_holder(self) -> str:
        """Who holds the write lock (`; held by pid … (app, state, for N s)`), asked on a connection of its own."""
        key = self.lock_key & 0xFFFF_FFFF_FFFF_FFFF  # pg_locks shows a bigint key as two oids
        row = self._ask_aside(
            "SELECT a.pid, a.application_name, a.state, "
            "round(extract(epoch FROM now() - a.xact_start))::int FROM pg_locks l "
            "JOIN pg_stat_activity a ON a.pid = l.pid WHERE l.locktype = 'advisory' AND l.granted "
            "AND l.classid = %s::bigint::oid AND l.objid = %s::bigint::oid AND l.objsubid = 1",
            (key >> 32, key & 0xFFFF_FFFF),
        )
        return "" if row is None else _held_by(*row)

    def _table_lock_holder(self) -> tuple[str, str]:
        """A session holding a lock on a ledger table that blocks reads or appends: (table, `; held by …`),
        or ("", "") when there is none (any more), asked on a connection of its own."""
        row = self._ask_aside(
            "SELECT c.relname, a.pid, a.application_name, a.state, "
            "round(extract(epoch FROM now() - a.xact_start))::int FROM pg_locks l "
            "JOIN pg_class c ON c.oid = l.relation JOIN pg_stat_activity a ON a.pid = l.pid "
            "WHERE l.locktype = 'relation' AND l.granted AND c.relnamespace = "
            "(SELECT oid FROM pg_namespace WHERE nspname = %s) AND c.relname = ANY(%s) AND l.mode IN "
            "('ShareLock', 'ShareRowExclusiveLock', 'ExclusiveLock', 'AccessExclusiveLock') "
            "ORDER BY l.mode = 'AccessExclusiveLock' DESC, a.xact_start LIMIT 1",
            (self.schema, ["events", "streams", "checkpoints", "checkpoint_streams", "meta"]),
        )
        return ("", "") if row is None else (row[0], _held_by(*row[1:]))

    def _ask_aside(self, query: str, params: tuple[Any, ...]) -> tuple[Any, ...] | None:
        """One row from a connection of its own (this session's may be the one waiting); None when the
        server cannot say (the error message stays useful without it)."""
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                row: tuple[Any, ...] | None = conn.execute(query, params).fetchone()
        except psycopg.Error:
            return None
        return row

    def _lost(self) -> bool:
        """The session's connection is gone (not by `close()`): the next operation connects again."""
        conn: psycopg.Connection[Any] | None = getattr(self, "conn", None)  # None: the first connect failed
        return conn is not None and conn.closed and not self._closed

    @contextmanager
    def mapped(self, what: str, *, lost: str | None = "") -> Iterator[None]:
        """Translate any psycopg exception raised inside into the project's error tree (and refuse
        a thread other than the session's own before anything is sent)."""
        self.owner.check()
        try:
            yield
        except psycopg.Error as e:
            self.fail(what, e, lost)

    # --- schema ----------------------------------------------------------------------------

    def schema_version(self) -> str | None:
        """The store schema version this schema records; None when it holds no ledger yet."""
        if self.schema is None:  # the URL's schema does not exist, or this role may not use it
            self._refuse_unusable_schema()
            return None  # no ledger (a table later in the path is another's)
        with self.mapped("cannot read the ledger schema"):
            found = self.conn.execute(
                "SELECT to_regclass(format('%%I.meta', %s::text)) IS NOT NULL, "
                "to_regclass(format('%%I.events', %s::text)) IS NOT NULL",
                (self.schema, self.schema),
            )
            row = found.fetchone()
            assert row is not None
            has_meta, has_events = row
            if not has_meta:
                if has_events:
                    raise StoreError(f"{self.where}: schema {self.schema!r} has an `events` table but is not a ledger")
                return None
            value = self.conn.execute("SELECT value FROM meta WHERE key = 'store_schema_version'").fetchone()
        if value is None and has_events:  # the version went in with the tables: removed by hand since
            raise StoreError(f"{self.where}: schema {self.schema!r} has an `events` table but no store schema version "
                             "(emptied by hand): not a ledger; refusing to write to it")  # fmt: skip
        return None if value is None else str(value[0])

    def _refuse_unusable_schema(self) -> None:
        """A schema that exists but that this role lacks USAGE on is left out of the search path by PostgreSQL,
        so it looks missing: say which grant is missing instead of "no ledger, create one"."""
        name = self._first_schema()
        with self.mapped("cannot read the ledger schema"):
            row = self.conn.execute(
                "SELECT NOT has_schema_privilege(oid, 'USAGE') FROM pg_namespace WHERE nspname = %s", (name,)
            ).fetchone()
        if row is not None and row[0]:
            raise StoreError(
                f"{self.where}: this role may not use schema {name!r} (permission denied; the owner must "
                f'GRANT USAGE ON SCHEMA and the table privileges to it: README, "PostgreSQL")'
            )

    def ensure_schema(self, *, create: bool) -> None:
        """Check (and with `create`, make) the ledger's tables; refuse another schema version."""
        found = self.schema_version()
        if found == str(STORE_SCHEMA_VERSION):
            return  # an existing ledger opens without DDL: a role with only SELECT/INSERT can use it
        if found is not None:
            raise StoreError(f"{self.where}: store schema version {found} is not {STORE_SCHEMA_VERSION}; refusing")
        if not create:
            raise InputError(f"no ledger at {self.where} (create one with `lifecycle init`)")
        with self.mapped("cannot create the ledger schema"), self.conn.transaction():
            self.conn.execute("SELECT pg_advisory_xact_lock(%s)", (self.lock_key,))
            if self.schema is None:  # the URL's schema does not exist yet: make it
                name = self._first_schema()
                self.conn.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(name)))
                self.schema = name
            for statement in DDL:
                self.conn.execute(statement)
            self.conn.execute(
                "INSERT INTO meta (key, value) VALUES ('store_schema_version', %s) ON CONFLICT (key) DO NOTHING",
                (str(STORE_SCHEMA_VERSION),),
            )
        if self.schema_version() != str(STORE_SCHEMA_VERSION):  # pragma: no cover - a concurrent other version
            raise StoreError(f"{self.where}: store schema version is not {STORE_SCHEMA_VERSION}; refusing")

    def execute(self, sql: str, params: Any = None) -> psycopg.Cursor[Any]:
        """One statement through the error boundary."""
        with self.mapped("query failed"):
            return self.conn.execute(sql, params)

    def close(self) -> None:
        self.owner.release()
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        self.conn.close()


def _held_by(pid: int, app: str | None, state: str, seconds: int) -> str:
    return f"; held by server pid {pid} ({app or 'no application_name'}, {state}, transaction open {seconds} s)"
