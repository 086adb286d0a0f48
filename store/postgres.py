"""The PostgreSQL event store: the same append-only, hash-chained log for many machines.

- Appends are serialised by a transaction-level advisory lock (one key per ledger schema; a role
  with only SELECT and INSERT may take it) taken before the head is read, so `seq` is dense and in
  commit order: a reader polling `seq > last` never skips an event that commits late.
- Read committed: every statement after the lock sees the newest committed head.
- One event is one statement, `lifecycle_append()`, chained by the server and re-hashed here; a
  check that fails there writes nothing, and the transaction's path says why. Batches and
  transactions (`postgres_session.PostgresTransaction`) chain their rows in Python, as every backend does.
- Every appending commit notifies the ledger's channel; `wait_for_new` blocks on it, polling stays the truth.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import attrs
import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus, TransactionStatus

from lifecycle_fsm.errors import IntegrityError, StoreError
from lifecycle_fsm.store.base import (
    Transactions,
    check_batch,
    id_taken,
    snapshot_in_write,
    write_in_read_snapshot,
    write_in_transaction,
)
from lifecycle_fsm.store.chain import EVENT_COLUMNS, FOLD_COLUMNS, canonical_json, event_hash
from lifecycle_fsm.store.postgres_schema import (
    APPEND_ONE,
    GUARD_ROWS,
    KEY_ROWS,
    append_one,
    ensure_append_function,
    ensure_derived_tables,
    ensure_schema,
    filter_sql,
    guard_problems,
)
from lifecycle_fsm.store.postgres_session import COMMIT_UNKNOWN, NOTHING_COMMITTED, PgSession, PostgresTransaction
from lifecycle_fsm.store.records import (
    ALL_EVENTS,
    AppendResult,
    CheckpointRecord,
    EventFilter,
    NewEvent,
    Row,
    StoredEvent,
    StreamHead,
    StreamShare,
)
from lifecycle_fsm.store.sql import CHECKPOINTS, Run, SQLStore
from lifecycle_fsm.store.threads import fault_from_env, one_thread

_NO_UPPER = 1 << 62
_PAGE = 2000


@one_thread
class PostgresEventStore(SQLStore, Transactions[PostgresTransaction]):
    """An `EventStore` in a PostgreSQL schema."""

    def __init__(
        self,
        url: str,
        *,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        idle_timeout: float = 60.0,
        create: bool = True,
    ) -> None:
        self._fault = fault_from_env()
        self.session = PgSession(url, synchronous=synchronous, busy_timeout=busy_timeout, idle_timeout=idle_timeout)
        try:
            self._indexed = ensure_schema(self.session, create=create)
            self._appends = ensure_append_function(self.session, create=create)
        except BaseException:
            self.session.close()
            raise
        self.where = self.session.where
        self._owner = self.session.owner
        self._reading = False  # inside `read_snapshot()`
        # The one-statement append starts after this handle's first append: that one takes the transaction's
        # path, which refuses a log emptied outside lifecycle (the server function does not look).
        self._log_seen = False

    def _refuse_nested_write(self) -> None:
        if self._reading:
            raise write_in_read_snapshot(self.where)
        if self.session.held:
            raise write_in_transaction(self.where)

    def _may_catch_up(self) -> bool:
        return not (self._reading or self.session.held)

    def _rollback(self) -> None:
        if self._owner.forked:  # a forked child left inside the parent's transaction: nothing is sent
            return
        conn = self.session.conn
        if conn.closed or conn.pgconn.transaction_status == TransactionStatus.IDLE:
            return
        with contextlib.suppress(psycopg.Error):  # the connection is gone: the server rolled back already
            conn.execute("ROLLBACK")

    @contextmanager
    def _held(self, what: str) -> Iterator[None]:
        """The session made usable (never reconnected inside), then held by one block of this store; entered
        by the owner only (another thread must not end its transaction)."""
        self._owner.check()
        self._refuse_nested_write()
        with self.session.mapped(what):
            self.session.ready()
        self.session.held = True
        try:
            yield
        except BaseException:
            self._rollback()
            raise
        finally:
            self.session.held = False

    @contextmanager
    def transaction(self) -> Iterator[PostgresTransaction]:
        if not self._appends:
            raise StoreError(
                f"{self.where}: this ledger's schema is older than this release; open it once as a role that may "
                "change its schema (its owner) to upgrade it, then append"
            )
        with self._held("cannot start a write transaction"):
            tx = PostgresTransaction(self)
            yield tx
            if self._fault is not None:
                tx.flush()
                self._fault.reached("before_commit")
            tx.commit()
        if self._fault is not None:
            self._fault.reached("after_commit")

    @contextmanager
    def _locked(self, what: str) -> Iterator[Run]:
        with self._held(what):
            conn = self.session.conn

            def run(sql: str, params: Sequence[Any] = (), many: bool = False) -> list[Any]:
                if many:
                    with conn.cursor() as cur:
                        cur.executemany(sql, params)
                    return []
                cur = conn.execute(sql, params)
                return cur.fetchall() if cur.pgresult and cur.pgresult.status == ExecStatus.TUPLES_OK else []

            with self.session.mapped(what, lost=NOTHING_COMMITTED):
                conn.execute(f"BEGIN; {self.session.lock_sql}")
                yield run
            with self.session.mapped(what, lost=COMMIT_UNKNOWN):
                conn.execute("COMMIT")

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """One REPEATABLE READ, READ ONLY transaction (`idle_timeout` ends a caller's long pause in it)."""
        self._owner.check()
        if self._reading:
            yield
            return
        if self.session.held:
            raise snapshot_in_write(self.where)
        with self._held("cannot start a read snapshot"):
            with self.session.mapped("cannot start a read snapshot"):
                self.session.conn.execute("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY")
            self._reading = True
            try:
                yield
            finally:
                self._reading = False
                self._rollback()

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        fresh_ids: bool = False,
        expect: Sequence[tuple[str, int]] = (),
    ) -> AppendResult:
        """One event goes in one statement; when a check fails there, nothing was written and the
        transaction's path says why (or returns the retried event). A fault plan takes that path too."""
        if len(events) == 1 and self._fault is None and self._log_seen:
            done = self._append_one(stream_id, expected_version, events[0], fresh_ids, expect)
            if done is not None:
                return done
        result = super().append(stream_id, expected_version, events, fresh_ids=fresh_ids, expect=expect)
        self._log_seen = self._log_seen or bool(result.events)
        return result

    def _append_one(
        self,
        stream_id: str,
        expected_version: int,
        event: NewEvent,
        fresh_ids: bool,
        expect: Sequence[tuple[str, int]],
    ) -> AppendResult | None:
        check_batch(stream_id, [event])
        payload, version = canonical_json(event.payload), expected_version + 1
        session = self.session
        params = append_one(event, payload, version, [(stream_id, expected_version), *expect], session, not fresh_ids)
        self._refuse_nested_write()
        try:  # one statement, its own transaction: nothing is left open if it fails
            if session.conn.pgconn.transaction_status:  # not idle: an interrupted call left it so
                session.recover()
            row = session.cursor.execute(APPEND_ONE, params).fetchone()
        except pg_errors.UniqueViolation as e:
            raise id_taken(stream_id, expected_version, session.scrub(str(e).splitlines()[0])) from e
        except psycopg.Error as e:
            session.fail("write transaction failed", e, COMMIT_UNKNOWN)
        if row is None or row[0] is None:
            return None
        seq, prev_hash, digest, at = row
        columns = (seq, stream_id, version, event.event_id, event.type, event.schema_version, payload)
        stored = StoredEvent(*columns, at, event.actor, prev_hash, digest)
        mine = event_hash(prev_hash, *columns, at, event.actor)
        if digest != mine:
            raise IntegrityError(
                f"the server chained seq {seq} to hash {digest}, which this client does not compute: the ledger's "
                "chain does not verify from there (report this, with the server's encoding)",
                seq=seq,
            )
        return AppendResult((stored,))

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        """A derived table dropped by hand is first made again, empty: `replay --full` is its repair."""
        with self._held("cannot rebuild the stream index"):
            self._indexed = ensure_derived_tables(self.session, create=True, lost=NOTHING_COMMITTED)
        super().rebuild_stream_index(derive)

    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[tuple[Any, ...]]:
        session = self.session
        with session.mapped("read failed"):
            if not session.held:
                session.ready()
            return session.conn.execute(sql, params).fetchall()

    def select_rows(self, query: EventFilter = ALL_EVENTS) -> Iterator[list[Row]]:
        """Pages of rows, each its own statement: a slice of the log by ranges of seqs (with stale
        statistics the planner sorted every row for `LIMIT`), a filtered read by keyset (sparse matches)."""
        left = query.limit
        pages = self._ranges(query) if query.positions_only() else self._keyset(query)
        for page in pages:
            rows = page if left is None else page[:left]
            if rows:
                yield rows
            if left is not None:
                left -= len(rows)
                if left <= 0:
                    return

    def select_fold_rows(
        self, *, after: int, before: int | None, streams: StreamShare | None = None
    ) -> Iterator[list[Row]]:
        pages = self._ranges(EventFilter(after=after, before=before), FOLD_COLUMNS, streams)
        return (rows for rows in pages if rows)

    def _ranges(
        self, query: EventFilter, columns: str = EVENT_COLUMNS, streams: StreamShare | None = None
    ) -> Iterator[list[Row]]:
        """Ranges of `_PAGE` seqs; after a short range (a gap, the head, or with `streams` an empty one) the
        next stored seq, if any, goes on."""
        upper = _NO_UPPER if query.before is None else query.before - 1
        last = query.after
        share = "" if streams is None else f" AND {'NOT ' if streams.others else ''}stream_id = ANY(%s::text[])"
        shared = [] if streams is None else [sorted(streams.names)]
        while last < upper:
            end = min(last + _PAGE, upper)
            sql = f"SELECT {columns} FROM events WHERE seq > %s AND seq <= %s{share} ORDER BY seq"
            rows = self._rows(sql, (last, end, *shared))
            yield rows
            if streams is None:  # from the last row read: rows committed while the caller held this page are next
                short, seen = len(rows) < end - last, rows[-1][0] if rows else last
            else:  # the share's rows only: an empty page skips to the next stored seq
                short, seen = not rows, end
            if short:
                found = self._rows("SELECT min(seq) FROM events WHERE seq > %s AND seq <= %s", (seen, upper))[0][0]
                if found is None:
                    return
                end = int(found) - 1
            last = end

    def _keyset(self, query: EventFilter) -> Iterator[list[Row]]:
        if self._indexed:
            self._catch_up_before_read()
        last = query.after
        while True:
            sql, params = filter_sql(attrs.evolve(query, after=last), indexed=self._indexed)
            rows = self._rows(f"{sql} LIMIT {_PAGE}", params)
            yield rows
            if len(rows) < _PAGE:
                return
            last = rows[-1][0]

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        # Two at a time, newest first: a load stops at the first trusted one.
        key: tuple[int, int] = (_NO_UPPER if at_or_before is None else at_or_before, _NO_UPPER)
        where = "position <= %s AND (position, checkpoint_id) < (%s, %s)"
        sql = f"{CHECKPOINTS} WHERE {where} ORDER BY position DESC, checkpoint_id DESC LIMIT 2"
        while True:
            rows = self._rows(sql, (key[0], *key))
            for row in rows:
                yield CheckpointRecord(*row)
            if len(rows) < 2:
                return
            key = (rows[-1][1], rows[-1][0])

    def guard_problems(self) -> list[str]:
        return guard_problems(self._rows(GUARD_ROWS), self._rows(KEY_ROWS))

    def wait_for_new(
        self, after: int, timeout: float, *, given_up: Callable[[], bool] | None = None, look: float | None = None
    ) -> bool:
        """Block until an event past `after` is committed (True) or `timeout` seconds pass (False);
        `given_up`, asked every `look` seconds, ends it early. The head is read after LISTEN and after
        each notification, so a lost one costs only the wait."""
        deadline = time.monotonic() + max(0.0, timeout)
        listener = self.session.listener()
        with self.session.mapped("cannot wait for new events"):
            while True:
                row = listener.execute("SELECT coalesce(max(seq), 0) FROM events").fetchone()
                if row is not None and row[0] > after:
                    return True
                while not any(True for _ in listener.notifies(timeout=self._wake_in(deadline, look), stop_after=1)):
                    if time.monotonic() >= deadline or (given_up is not None and given_up()):
                        return False

    @staticmethod
    def _wake_in(deadline: float, look: float | None) -> float:
        left = max(0.0, deadline - time.monotonic())
        return left if look is None else min(left, look)

    def close(self) -> None:
        self.session.close()
