"""A write transaction on the PostgreSQL store: the lock, the guarded insert, deferred version checks.

See `store/postgres.py` for why appends are serialised by an advisory lock and how
the guarded insert keeps round trips few.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors
from psycopg.pq import ExecStatus

from lifecycle_fsm.store.base import AppendResult
from lifecycle_fsm.store.chain import GENESIS_HASH, chain_rows, check_batch, match_retry
from lifecycle_fsm.store.errors import ConcurrencyError, IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.postgres_append import chained_insert_sql, check_server_chain
from lifecycle_fsm.store.postgres_pipeline import EVENT_ROW, NOTHING_COMMITTED, decode_rows
from lifecycle_fsm.store.postgres_schema import EVENT_COLUMNS
from lifecycle_fsm.store.records import Head, NewEvent, StoredEvent, StreamHead
from lifecycle_fsm.store.threads import one_thread

if TYPE_CHECKING:
    from lifecycle_fsm.store.postgres import PostgresEventStore

__all__ = ["VERSION_OF", "PostgresTransaction"]

VERSION_OF = "coalesce((SELECT max(version) FROM events WHERE stream_id = %s), 0)"
_HEAD_IS = (
    "coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0) = %s "
    "AND coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), %s) = %s"
)
_ROW = "(%s::bigint, %s, %s::bigint, %s, %s, %s::integer, %s, %s, %s, %s, %s)"
_BY_IDS = f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY(%s::text[])"
_RETURNED = (int, bytes.decode, bytes.decode)  # the chained insert's seq, prev_hash, hash
_CHUNK = 1000  # rows per INSERT statement (11 parameters each; PostgreSQL allows 65535)
_UPSERT_STREAM_IF_INSERTED = (
    "INSERT INTO streams (stream_id, version, status, category) SELECT %s, %s::bigint, %s, %s "
    "WHERE EXISTS (SELECT FROM ins) "
    "ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, "
    "status = coalesce(excluded.status, streams.status), category = coalesce(excluded.category, streams.category)"
)


def _insert_sql(
    chunk: list[tuple[Any, ...]],
    guard: tuple[Head, list[tuple[str, int]], list[str] | None] | None,
    upsert: tuple[str, int, str | None, str | None] | None,
) -> tuple[str, list[Any]]:
    """One INSERT of `chunk`: only if `guard` holds (head, stream versions, ids not taken), and with
    `upsert` the stream index in the same statement (a data-modifying CTE: its row count is 1 or 0)."""
    params: list[Any] = [v for row in chunk for v in row]
    sql = f"INSERT INTO events ({EVENT_COLUMNS}) SELECT * FROM (VALUES {', '.join([_ROW] * len(chunk))}) AS v"
    if guard is not None:
        head, checks, ids = guard
        sql += f" WHERE {_HEAD_IS}" + f" AND {VERSION_OF} = %s" * len(checks)
        params += [head.seq, GENESIS_HASH, head.hash, *(v for pair in checks for v in pair)]
        if ids is not None:
            sql += " AND NOT EXISTS (SELECT FROM events WHERE event_id = ANY(%s::text[]))"
            params.append(ids)
    if upsert is not None:
        sql = f"WITH ins AS ({sql} RETURNING 1) {_UPSERT_STREAM_IF_INSERTED}"
        params += list(upsert)
    return sql, params


class _Result:
    """One statement's result, kept: the multi-statement cursor moves on to the next."""

    __slots__ = ("rowcount", "rows")

    def __init__(self, cur: psycopg.Cursor[Any]) -> None:
        self.rowcount = cur.rowcount
        result = cur.pgresult  # its status, not `cur.description`: that builds column objects (~20 µs)
        self.rows = cur.fetchall() if result is not None and result.status == ExecStatus.TUPLES_OK else []

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.rows[0] if self.rows else None

    def fetchall(self) -> list[tuple[Any, ...]]:
        return self.rows


def _conflict(stream_id: str, expected: int, actual: int) -> ConcurrencyError:
    return ConcurrencyError(
        f"stream {stream_id!r} is at version {actual}, expected {expected}: "
        "another writer appended first; retry the command",
        stream_id=stream_id,
        expected_version=expected,
        actual_version=actual,
    )


@one_thread  # before its state changes: a refused call leaves the owner's transaction whole
class PostgresTransaction:
    """A write transaction (see `StoreTransaction`); it starts, lock first, with its first statement."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store
        self._session = store.session
        self._owner = store.session.owner
        self.started = False
        self._expected: list[tuple[str, int]] = []  # checked by the next insert, or before COMMIT
        self.head: Head | None = None  # the head under our lock, once known

    def _send(self, statements: Sequence[tuple[str, Sequence[Any] | None]]) -> list[_Result]:
        """Statements in one round trip; a cursor positioned at each one's result.

        The transaction's first send is preceded by BEGIN and the lock, in the same trip
        (COMMIT is `store.transaction()`'s, after the block). They go as one simple-query
        message with the values bound client-side (`PgSession.inline`), as `EXECUTE` of a
        server-side prepared statement once a shape repeats: psycopg's own pipeline object
        measured 4x slower here than this (the one-append path drives libpq's pipeline mode
        itself: `store.postgres_pipeline`). (Leaving BEGIN and COMMIT out of a one-message
        transaction, an implicit one, measured no faster.) An error skips the rest and
        leaves the transaction to roll back.
        """
        conn = self._session.conn
        parts: list[tuple[str, Sequence[Any] | None]] = list(statements)
        skip = 0
        starting = not self.started
        if starting:
            for sql, params in statements:  # outside any transaction: a PREPARE is never rolled back
                self._session.prepare_if_repeated(sql, params)
            self.started = True
            parts = [("BEGIN", None), (self._session.lock_sql, None), *parts]
            skip = 2
        with self._session.mapped("write transaction failed", lost=NOTHING_COMMITTED):
            inline = self._session.inline
            cur = conn.execute("; ".join(sql if params is None else inline(sql, params) for sql, params in parts))
            cursors = []
            for n in range(len(parts)):
                if n >= skip and n < skip + len(statements):
                    cursors.append(_Result(cur))
                cur.nextset()
        if starting and self._store._fault is not None:  # BEGIN and the lock answered: the write lock is held
            self._store._fault.reached("after_begin")
        return cursors

    def _run(self, sql: str, params: Sequence[Any] = ()) -> _Result:
        """One statement inside the transaction (after BEGIN and the lock, in the same round trip)."""
        return self._send([(sql, params)])[0]

    def stream_version(self, stream_id: str) -> int:
        row = self._run(f"SELECT {VERSION_OF}", (stream_id,)).fetchone()
        return int(row[0]) if row else 0

    def expect_version(self, stream_id: str, expected_version: int) -> None:
        # Checked by the next append's insert in the same round trip, or before COMMIT:
        # either way the ConcurrencyError leaves the `with` block and nothing commits.
        self._expected.append((stream_id, expected_version))

    def _check_expected(self) -> None:
        pending, self._expected = self._expected, []
        for stream_id, expected in pending:
            actual = self.stream_version(stream_id)
            if actual != expected:
                raise _conflict(stream_id, expected, actual)

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        cur = self._run(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = %s AND version > %s ORDER BY version",
            (stream_id, after_version),
        )
        return [StoredEvent(*row) for row in cur.fetchall()]

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        if statuses is None:
            cur = self._run("SELECT stream_id, version, status, category FROM streams ORDER BY stream_id")
        else:
            cur = self._run(
                "SELECT stream_id, version, status, category FROM streams WHERE status = ANY(%s::text[]) "
                "ORDER BY stream_id",
                (list(statuses),),
            )
        return [StreamHead(*row) for row in cur.fetchall()]

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        status: str | None = None,
        category: str | None = None,
        fresh_ids: bool = False,
    ) -> AppendResult:
        if not events:
            return AppendResult(())
        check_batch(stream_id, events)
        guess = self.head or self._store.last_head
        rows = chain_rows(guess, stream_id, expected_version, events)
        done = self._attempt(rows, guess, (stream_id, expected_version, status, category), events, fresh_ids=fresh_ids)
        if done is None:
            # The guess was stale, or a version moved: read both under the lock, then decide.
            self._check_expected()
            head = self._locked_head(stream_id, expected_version)
            rows = chain_rows(head, stream_id, expected_version, events)
            done = self._attempt(rows, head, (stream_id, expected_version, status, category), events, fresh_ids=True)
            if done is None:  # pragma: no cover - the lock is held: nothing can move
                raise IntegrityError(f"stream {stream_id!r}: the head moved while the write lock was held")
        return done

    def append_and_commit(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        status: str | None = None,
        category: str | None = None,
        fresh_ids: bool = False,
    ) -> AppendResult | None:
        """A whole one-append transaction in one round trip (the lock, the retry look-up, the insert
        chained by the server that also notifies followers; see `store.postgres_append`), pipelined
        (`store.postgres_pipeline`): the lock is held only while the server runs them and commits.

        None when a stream's version moved: nothing was written, the transaction is over;
        `append` then says which stream and where it is.
        """
        check_batch(stream_id, events)
        expected, self._expected = self._expected, []
        ids = None if fresh_ids else [e.event_id for e in events]
        guess = self._store.last_head  # right unless another writer appended since: then the server chains
        rows = chain_rows(guess, stream_id, expected_version, events)
        checks = [(stream_id, expected_version), *expected]
        session = self._session
        insert = chained_insert_sql(rows, guess, checks, ids, (status, category), session.channel)
        statements: list[tuple[str, Sequence[Any]]] = [(session.lock_sql, ())]
        if ids is not None:
            statements.append((_BY_IDS, (ids,)))
        statements.append(insert)
        try:
            results = session.pipeline.run(statements)
        except StoreError as e:
            raise self._taken(e, stream_id, expected_version) from e.__cause__
        if ids is not None:
            found = decode_rows(results[1], EVENT_ROW)
            existing = match_retry(events, {row[3]: StoredEvent(*row) for row in found})
            if existing is not None:
                return AppendResult(existing, duplicate=True)
        returned = decode_rows(results[-1], _RETURNED)
        if not returned:
            self._expected = expected
            return None
        stored = check_server_chain(returned, rows)
        self.head = Head(stored[-1].seq, stored[-1].hash)
        return AppendResult(stored)

    def _locked_head(self, stream_id: str, expected_version: int) -> Head:
        """The head under the lock; ConcurrencyError when the stream is not at `expected_version`."""
        row = self._run(
            f"SELECT {VERSION_OF}, (SELECT seq FROM events ORDER BY seq DESC LIMIT 1), "
            "(SELECT hash FROM events ORDER BY seq DESC LIMIT 1)",
            (stream_id,),
        ).fetchone()
        assert row is not None
        if row[0] != expected_version:
            raise _conflict(stream_id, expected_version, int(row[0]))
        return Head(row[1], row[2]) if row[1] is not None else Head(0, GENESIS_HASH)

    def _attempt(
        self,
        rows: list[tuple[Any, ...]],
        head: Head,
        stream: tuple[str, int, str | None, str | None],
        events: Sequence[NewEvent],
        *,
        fresh_ids: bool,
    ) -> AppendResult | None:
        """Insert `rows` if `head`, every expected version and (unless `fresh_ids`) the event ids still hold.

        One round trip: the retry look-up by event id, the guarded insert and the
        stream index (one statement). None, nothing written, when a guard failed.
        """
        stream_id, expected_version, status, category = stream
        expected, self._expected = self._expected, []
        checks = [(stream_id, expected_version), *expected]
        ids = None if fresh_ids else [e.event_id for e in events]
        lookup: list[tuple[str, Sequence[Any] | None]] = [] if ids is None else [(_BY_IDS, (ids,))]
        chunks = [rows[i : i + _CHUNK] for i in range(0, len(rows), _CHUNK)]
        upsert = (stream_id, rows[-1][2], status, category)
        first = _insert_sql(chunks[0], (head, checks, ids), upsert if len(chunks) == 1 else None)
        try:
            cursors = self._send([*lookup, first])
            if ids is not None:
                stored = {row[3]: StoredEvent(*row) for row in cursors[0].fetchall()}
                existing = match_retry(events, stored)
                if existing is not None:
                    return AppendResult(existing, duplicate=True)
            if cursors[-1].rowcount == 0:
                self._expected = expected  # re-checked one by one by the caller
                return None
            for n, chunk in enumerate(chunks[1:], start=2):  # the later chunks follow under the same lock
                self._send([_insert_sql(chunk, None, upsert if n == len(chunks) else None)])
        except StoreError as e:
            raise self._taken(e, stream_id, expected_version) from e.__cause__
        self.head = Head(rows[-1][0], rows[-1][10])
        return AppendResult(tuple(StoredEvent(*row) for row in rows))

    def _taken(self, e: StoreError, stream_id: str, expected_version: int) -> LifecycleError:
        """A unique violation under the lock as a ConcurrencyError (the clash was an event id); else `e`."""
        if not isinstance(e.__cause__, pg_errors.UniqueViolation):
            return e
        return ConcurrencyError(
            f"stream {stream_id!r}: version or event id already taken ({self._session.scrub(str(e.__cause__))})",
            stream_id=stream_id,
            expected_version=expected_version,
            actual_version=expected_version,  # under the lock: the clash was an event id, not the version
        )

    def finish(self) -> None:
        """Before COMMIT: the expectations no insert has checked yet."""
        if self._expected:
            self._check_expected()
