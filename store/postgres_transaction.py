"""A write transaction on the PostgreSQL store: the lock, the guarded insert, deferred version checks.

See `store/postgres.py` for why appends are serialised by an advisory lock and how
the guarded insert keeps round trips few.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import TYPE_CHECKING, Any

import psycopg
from psycopg import errors as pg_errors

from store.base import AppendResult
from store.chain import GENESIS_HASH, chain_rows, check_batch, match_retry
from store.errors import ConcurrencyError, IntegrityError, StoreError
from store.postgres_schema import EVENT_COLUMNS
from store.records import Head, NewEvent, StoredEvent, StreamHead

if TYPE_CHECKING:
    from store.postgres import PostgresEventStore

__all__ = ["VERSION_OF", "PostgresTransaction"]

VERSION_OF = "coalesce((SELECT max(version) FROM events WHERE stream_id = %s), 0)"
_HEAD_IS = (
    "coalesce((SELECT seq FROM events ORDER BY seq DESC LIMIT 1), 0) = %s "
    "AND coalesce((SELECT hash FROM events ORDER BY seq DESC LIMIT 1), %s) = %s"
)
_ROW = "(%s::bigint, %s, %s::bigint, %s, %s, %s::integer, %s, %s, %s, %s, %s)"
_CHUNK = 1000  # rows per INSERT statement (11 parameters each; PostgreSQL allows 65535)
_UPSERT_STREAM = (
    "INSERT INTO streams (stream_id, version, status, category) VALUES (%s, %s, %s, %s) "
    "ON CONFLICT (stream_id) DO UPDATE SET version = excluded.version, "
    "status = coalesce(excluded.status, streams.status), category = coalesce(excluded.category, streams.category)"
)


def _conflict(stream_id: str, expected: int, actual: int) -> ConcurrencyError:
    return ConcurrencyError(
        f"stream {stream_id!r} is at version {actual}, expected {expected}: "
        "another writer appended first; retry the command",
        stream_id=stream_id,
        expected_version=expected,
        actual_version=actual,
    )


class PostgresTransaction:
    """A write transaction (see `StoreTransaction`); it starts, lock first, with its first statement."""

    def __init__(self, store: PostgresEventStore) -> None:
        self._store = store
        self._session = store.session
        self.started = False
        self._expected: list[tuple[str, int]] = []  # checked by the next insert, or before COMMIT
        self.head: Head | None = None  # the head under our lock, once known

    def _run(self, sql: str, params: Sequence[Any] = ()) -> psycopg.Cursor[Any]:
        """One statement inside the transaction; the first is preceded by BEGIN and the lock (one message).

        Statements are server-bound, so psycopg prepares the hot ones: planning the
        guarded INSERT costs more than a round trip on a busy server (measured).
        """
        conn = self._session.conn
        with self._session.mapped("write transaction failed"):
            if not self.started:
                self.started = True
                conn.execute(f"BEGIN; SELECT pg_advisory_xact_lock({int(self._session.lock_key)})")
            return conn.execute(sql, params)

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
        if not fresh_ids:  # a writer that just drew random ids cannot be retrying: skip the look-up
            existing = self._existing(events)
            if existing is not None:
                return AppendResult(existing, duplicate=True)
        guess = self.head or self._store.last_head
        rows = chain_rows(guess, stream_id, expected_version, events)
        if not self._insert(rows, guess, stream_id, expected_version, status, category):
            # The guess was stale, or a version moved: read both under the lock, then decide.
            self._check_expected()
            row = self._run(
                f"SELECT {VERSION_OF}, (SELECT seq FROM events ORDER BY seq DESC LIMIT 1), "
                "(SELECT hash FROM events ORDER BY seq DESC LIMIT 1)",
                (stream_id,),
            ).fetchone()
            assert row is not None
            if row[0] != expected_version:
                raise _conflict(stream_id, expected_version, int(row[0]))
            head = Head(row[1], row[2]) if row[1] is not None else Head(0, GENESIS_HASH)
            rows = chain_rows(head, stream_id, expected_version, events)
            if not self._insert(rows, head, stream_id, expected_version, status, category):  # pragma: no cover
                raise IntegrityError(f"stream {stream_id!r}: the head moved while the write lock was held")
        self.head = Head(rows[-1][0], rows[-1][10])
        return AppendResult(tuple(StoredEvent(*row) for row in rows))

    def _insert(
        self,
        rows: list[tuple[Any, ...]],
        head: Head,
        stream_id: str,
        expected_version: int,
        status: str | None,
        category: str | None,
    ) -> bool:
        """Insert `rows` if `head` and every expected version still hold; False (nothing written) when not."""
        expected, self._expected = self._expected, []
        checks = [(stream_id, expected_version), *expected]
        try:
            for start in range(0, len(rows), _CHUNK):
                chunk = rows[start : start + _CHUNK]
                values = ", ".join([_ROW] * len(chunk))
                params: list[Any] = [v for row in chunk for v in row]
                sql = f"INSERT INTO events ({EVENT_COLUMNS}) SELECT * FROM (VALUES {values}) AS v"
                if start == 0:  # the later chunks follow under the same lock
                    sql += f" WHERE {_HEAD_IS}" + f" AND {VERSION_OF} = %s" * len(checks)
                    params += [head.seq, GENESIS_HASH, head.hash, *(v for pair in checks for v in pair)]
                if self._run(sql, params).rowcount == 0:
                    self._expected = expected  # re-checked one by one by the caller
                    return False
            self._run(_UPSERT_STREAM, (stream_id, rows[-1][2], status, category))
        except StoreError as e:
            if isinstance(e.__cause__, pg_errors.UniqueViolation):
                detail = self._session.scrub(str(e.__cause__))
                raise ConcurrencyError(
                    f"stream {stream_id!r}: version or event id already taken ({detail})",
                    stream_id=stream_id,
                    expected_version=expected_version,
                    actual_version=expected_version,  # under the lock: the clash was an event id, not the version
                ) from e.__cause__
            raise
        return True

    def _existing(self, events: Sequence[NewEvent]) -> tuple[StoredEvent, ...] | None:
        """The stored copies when this exact batch was appended before (a retry), else None."""
        cur = self._run(
            f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = ANY(%s::text[])", ([e.event_id for e in events],)
        )
        stored = {row[3]: StoredEvent(*row) for row in cur.fetchall()}
        return match_retry(events, stored)

    def finish(self) -> None:
        """Before COMMIT: the expectations no insert has checked yet."""
        if self._expected:
            self._check_expected()
