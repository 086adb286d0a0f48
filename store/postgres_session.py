"""One connection to a PostgreSQL ledger: its settings, the error boundary, a new session after a lost one,
and the write transaction that goes through it (`PostgresTransaction`).

- `lock_timeout` (from `busy_timeout`) bounds the wait for the write lock, and
  `idle_in_transaction_session_timeout` ends a writer stalled holding it; either one set in the URL wins.
- Every psycopg exception is translated into the project's error tree (`mapped`), never with a password.
- A connection the server dropped fails the call that met it, once; the next call opens a new session
  before it starts, never inside a transaction (`recover`): a Ledger survives a failover.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any, NoReturn
from urllib.parse import parse_qsl, urlsplit

import psycopg
from psycopg import errors as pg_errors
from psycopg import sql
from psycopg.pq import ExecStatus, TransactionStatus

from lifecycle_fsm.errors import InputError, IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.base import id_taken
from lifecycle_fsm.store.chain import EVENT_COLUMNS
from lifecycle_fsm.store.open import busy_timeout_seconds, redact_url, synchronous_mode
from lifecycle_fsm.store.postgres_schema import ledger_schema, names_user
from lifecycle_fsm.store.records import Row
from lifecycle_fsm.store.sql import RECORD_FIRST, SQLTransaction, derived_table_dropped
from lifecycle_fsm.store.threads import ThreadOwner

if TYPE_CHECKING:
    from lifecycle_fsm.store.postgres import PostgresEventStore

# SQLite's synchronous modes as synchronous_commit: FULL/EXTRA wait for the WAL flush; NORMAL/OFF do not
# (a server crash may lose the last commits, never corrupt the ledger).
_SYNCHRONOUS_COMMIT = {"OFF": "off", "NORMAL": "off", "FULL": "on", "EXTRA": "on"}
# What a connection lost during a write means, before COMMIT was sent and after.
NOTHING_COMMITTED = "nothing of this transaction was committed"
COMMIT_UNKNOWN = (
    "whether it committed is unknown: repeat the command with the same event_id (a retry appends nothing twice)"
)


def _secrets(url: str) -> list[str]:
    """Every spelling of the URL's password a driver message might echo (longest first)."""
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


# A timeout the URL's `options` set is kept, unless it is 0 (to PostgreSQL "wait for ever"); otherwise ours.
_SET_UNLESS_IN_URL = (
    "set_config('{name}', CASE WHEN (SELECT source FROM pg_settings WHERE name = '{name}') = 'client' "
    "AND current_setting('{name}') <> '0' THEN current_setting('{name}') ELSE %s END, false)"
)
_HAS_LEDGER = (
    "EXISTS (SELECT FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
    "WHERE n.nspname = %s AND c.relname = 'meta')"
)
# After the session is pinned: the ledger's schema if it exists, whether a `$user` schema other than it holds
# a ledger while it holds none, and whether this role may insert into `meta`.
_PINNED = (
    f"SELECT current_schema(), %s AND %s <> %s AND NOT {_HAS_LEDGER} AND {_HAS_LEDGER}, "
    "coalesce((SELECT has_table_privilege(c.oid, 'INSERT') FROM pg_class c WHERE c.oid = to_regclass('meta')), true)"
)


class PgSession:
    """One connection to a ledger's schema, with the error boundary every call goes through."""

    def __init__(self, url: str, *, synchronous: str, busy_timeout: float, idle_timeout: float) -> None:
        scheme, sep, rest = url.partition("://")
        url = self.url = scheme.lower() + sep + rest  # `POSTGRESQL://` is a URL to `is_postgres_url`, not to libpq
        self.where = redact_url(url)
        # In a forked child no thread may use it (and psycopg never sends a Terminate from another process).
        self.owner = ThreadOwner(self.where)
        self._secrets = _secrets(url)
        mode = _SYNCHRONOUS_COMMIT[synchronous_mode(synchronous, _SYNCHRONOUS_COMMIT)]
        busy_timeout = busy_timeout_seconds(busy_timeout)
        if busy_timeout_seconds(idle_timeout, "idle_timeout") == 0:
            raise InputError(f"idle_timeout must be above 0 seconds, not {idle_timeout!r}")
        self._setup = (f"{max(1, int(busy_timeout * 1000))}ms", f"{max(1, int(idle_timeout * 1000))}ms", mode)
        self._closed = False  # `close()` was called: a closed session is never reconnected
        self.held = False  # a transaction of the store's own is open on `conn`: never recovered under it
        self.reconnects = 0  # sessions opened after the first one dropped
        self._listener: psycopg.Connection[Any] | None = None  # `listener()`'s LISTEN connection
        self.conn, row = self._connect("cannot connect")
        try:
            self.lock_timeout: str = row[0]  # as the server shows it ("30s", "500ms"): for messages
            self.idle_timeout_shown: str = row[1]
            self.ledger_schema: str = row[6]
            self.schema: str | None = row[3]  # None while the ledger's schema does not exist (or may not be used)
            if row[7]:
                raise StoreError(
                    f"{self.where}: schema {row[5]!r} holds a ledger that this URL's search_path reached through "
                    f"its `$user` entry; a URL's ledger is in the first schema its path names "
                    f"({self.ledger_schema!r}), which holds none: name the schema in the URL "
                    f"(options=-csearch_path%3D{row[5]})"
                )
            digest = hashlib.sha256(b"lifecycle-fsm:" + self.ledger_schema.encode()).digest()
            self.lock_key = int.from_bytes(digest[:8], "big", signed=True)
            self.may_record: bool = row[8]  # may insert into `meta` (a role granted only SELECT on it may not)
            self.lock_sql = f"SELECT pg_advisory_xact_lock({self.lock_key})"
            self.channel = f"lifecycle_{self.lock_key & 0xFFFF_FFFF_FFFF_FFFF:x}"  # one per ledger schema
            self.notify_sql = f"NOTIFY {self.channel}"
            self.cursor = self.conn.cursor()
            self.batch = psycopg.ClientCursor(self.conn)  # several statements in one message, values bound here
        except BaseException:
            self.conn.close()
            raise

    def _connect(self, what: str) -> tuple[psycopg.Connection[Any], tuple[Any, ...]]:
        """A new connection, set up as every session of this store is, and what the setup read back."""
        with self.mapped(what, lost=None):
            conn = psycopg.connect(self.url, autocommit=True, connect_timeout=10, application_name="lifecycle-fsm")
        try:
            with self.mapped("cannot configure the session", lost=None):
                # Timeouts never 0: that would mean "wait forever" here, not "fail at once" as in SQLite.
                row = conn.execute(
                    f"SELECT {_SET_UNLESS_IN_URL.format(name='lock_timeout')}, "
                    f"{_SET_UNLESS_IN_URL.format(name='idle_in_transaction_session_timeout')}, "
                    "set_config('synchronous_commit', %s, false), current_schema(), "
                    "current_setting('search_path'), set_config('client_encoding', 'UTF8', false), current_user",
                    self._setup,
                ).fetchone()
                assert row is not None
                search_path, user = row[4], row[6]
                schema = ledger_schema(search_path, user)
                conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(schema)))
                pinned = conn.execute(_PINNED, (names_user(search_path), user, schema, schema, user)).fetchone()
                assert pinned is not None
        except BaseException:
            conn.close()
            raise
        return conn, (row[0], row[1], row[2], pinned[0], search_path, user, schema, pinned[1], pinned[2])

    def ready(self) -> None:
        """Before an operation of the store: a connection that cannot take it is made usable (`recover`)."""
        if self.conn.pgconn.transaction_status:  # not IDLE (0)
            self.recover()

    def recover(self) -> None:
        """Make the connection usable before an operation starts, never under the store's own transaction
        (`held`) nor after `close()`: a transaction nobody holds (an interrupt cut its cleanup short) is
        rolled back; one left with answers unread is closed; a closed one is replaced by a new session
        set up as at open (the same schema and settings; the LISTEN connection reopens on its next wait)."""
        if self.held or self._closed:
            return
        conn = self.conn
        pg = conn.pgconn
        status = pg.transaction_status
        if status in (TransactionStatus.INTRANS, TransactionStatus.INERROR):
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
        if row[3] != self.schema:
            conn.close()
            raise StoreError(
                f"{self.where}: lost its connection to the server; a new session finds schema {row[3]!r}, not "
                f"{self.schema!r}: open the ledger again"
            )
        try:
            cursors = conn.cursor(), psycopg.ClientCursor(conn)
        except BaseException:  # interrupted: the old session stays (closed), the next call tries again
            conn.close()
            raise
        old = self.conn
        self.conn, (self.cursor, self.batch) = conn, cursors  # one step: no interrupt lands between the two
        self.reconnects += 1
        old.close()  # closed already (psycopg's close is then a no-op)

    def listener(self) -> psycopg.Connection[Any]:
        """A connection listening on this ledger's channel, opened on first use and again after it was lost
        (notifications sent meanwhile are lost: the caller re-reads by seq after LISTEN)."""
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

    def scrub(self, text: str) -> str:
        text = text.replace(f' in URI: "{self.url}"', "")  # libpq's message quoting the URL it could not parse
        for secret in self._secrets:
            text = text.replace(secret, "***" if secret != self.url else self.where)
        return text

    def fail(self, what: str, e: psycopg.Error, lost: str | None = "") -> NoReturn:
        """Raise `e` as the project error it means, without any password (`lost`: what a connection lost
        during the call means for a write; None: a connection being opened)."""
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
                f"{self.lock_timeout} (lock_timeout{holder}); {'nothing was appended, ' if lost else ''}retry later"
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
            missing = re.search(r'relation "([^"]+)" does not exist', detail)
            error = derived_table_dropped(prefix, missing[1] if missing else "", detail) or StoreError(
                f"{prefix}: not a ledger (no ledger tables in schema {self.schema!r}) ({detail})"
            )
        elif lost is not None and isinstance(e, psycopg.OperationalError) and self._lost():
            note = f"; {lost}" if lost else ""
            error = StoreError(
                f"{prefix}: the connection to the server was lost ({detail}){note}; the next call "
                "on this ledger connects again"
            )
        else:
            error = StoreError(f"{prefix} ({detail})")
        raise error from e

    def _lock_holder(self) -> str:
        """Who holds the write lock (`; held by pid …`), asked on a connection of its own."""
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
        or ("", "")."""
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
        """One row from a connection of its own (this session's may be the one waiting); None when it fails."""
        try:
            with psycopg.connect(self.url, autocommit=True, connect_timeout=5) as conn:
                row: tuple[Any, ...] | None = conn.execute(query, params).fetchone()
        except psycopg.Error:
            return None
        return row

    def _lost(self) -> bool:
        """The connection is gone (not by `close()`): the next operation connects again."""
        conn: psycopg.Connection[Any] | None = getattr(self, "conn", None)  # None: the first connect failed
        return conn is not None and conn.closed and not self._closed

    @contextmanager
    def mapped(self, what: str, *, lost: str | None = "") -> Iterator[None]:
        """Translate any psycopg exception inside into the project's error tree (another thread is refused first)."""
        self.owner.check()
        try:
            yield
        except psycopg.Error as e:
            self.fail(what, e, lost)

    def close(self) -> None:
        self.owner.release()
        self._closed = True
        if self._listener is not None:
            self._listener.close()
        self.conn.close()


def _held_by(pid: int, app: str | None, state: str | None, seconds: int | None) -> str:
    """Who holds a lock (another role's session shows little more than its pid without `pg_read_all_stats`)."""
    if state is None or seconds is None:
        return f"; held by server pid {pid}, a session of another role whose details this role may not see"
    return f"; held by server pid {pid} ({app or 'no application_name'}, {state}, transaction open {seconds} s)"


_ROWS_PER_INSERT = 1000


class PostgresTransaction(SQLTransaction):
    """A write transaction: BEGIN and the lock go with its first message, its inserts with the next one
    (statements several to a message, values bound client-side): a one-append command is two round trips."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._session = store.session
        self._owner = store.session.owner
        self._fault = store._fault
        self.started = False
        self.wrote = False
        self._pending: list[tuple[str, Sequence[Any]]] = []  # statements sent ahead of the next message
        self._inserting: tuple[str, int] | None = None  # the stream and version the pending rows follow

    def _send(self, statements: Sequence[tuple[str, Sequence[Any]]], *, lost: str = NOTHING_COMMITTED) -> list[Any]:
        """`statements` in one message after what is pending (and, first, BEGIN and the lock); each one's rows.
        One statement text (psycopg caches its parsing by the text) with every statement's values in order."""
        session, first = self._session, not self.started
        parts = ([("BEGIN", ()), (session.lock_sql, ())] if first else []) + self._pending
        skip = len(parts)
        parts += statements
        self.started, self._pending, inserting, self._inserting = True, [], self._inserting, None
        with session.mapped("write transaction failed", lost=lost):
            cursor = session.batch
            try:
                cursor.execute("; ".join(sql for sql, _ in parts), [v for _, params in parts for v in params])
            except pg_errors.UniqueViolation as e:
                if inserting is None:
                    raise
                self.failed = f"an append to {inserting[0]!r} failed part-way"
                raise id_taken(*inserting, session.scrub(str(e).splitlines()[0])) from e
            results: list[Any] = []
            for n in range(len(parts)):
                if n >= skip:
                    result = cursor.pgresult
                    ok = result is not None and result.status == ExecStatus.TUPLES_OK
                    results.append(cursor.fetchall() if ok else [])
                cursor.nextset()
        if first and self._fault is not None:  # BEGIN and the lock answered: the write lock is held
            self._fault.reached("after_begin")
        return results

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        self._owner.check()  # before `_send` changes any state
        rows: list[Any] = self._send([(sql, params)])[0]
        return rows

    def _head_and_ids(self, sql: str, params: Sequence[Any], ids: Sequence[str]) -> tuple[Row, list[Row]]:
        self._owner.check()
        statements: list[tuple[str, Sequence[Any]]] = [(sql, params)]
        if ids:  # in the same message
            statements.append((f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY(%s::text[])", (list(ids),)))
        results = self._send(statements)
        return results[0][0], results[1] if ids else []

    def _record_first(self, digest: str) -> None:
        if self._session.may_record:  # a role that may only SELECT from meta leaves it to the owner's next open
            self._pending.append((RECORD_FIRST, (digest,)))

    def _insert(self, rows: list[Row]) -> None:
        for at in range(0, len(rows), _ROWS_PER_INSERT):
            chunk = rows[at : at + _ROWS_PER_INSERT]
            values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s, %s, %s, %s, %s)"] * len(chunk))
            self._pending.append(
                (f"INSERT INTO events ({EVENT_COLUMNS}) VALUES {values}", [v for r in chunk for v in r])
            )
        self._inserting, self.wrote = (rows[0][1], rows[0][2] - 1), True

    def flush(self) -> None:
        """Send what is pending now (the fault hooks strike with the rows inserted)."""
        if self._pending:
            self._send([])

    def commit(self) -> None:
        """What is pending, NOTIFY if anything was appended, and COMMIT, in one message."""
        self.may_commit()
        if self.started or self._pending:
            notify = [(self._session.notify_sql, ())] if self.wrote else []
            self._send([*notify, ("COMMIT", ())], lost=COMMIT_UNKNOWN)
