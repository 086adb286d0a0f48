"""The SQLite store's write transaction and the row readers it shares with the store.

`SQLiteEventStore.transaction()` hands one out under `BEGIN IMMEDIATE`: the stream
versions it reads, the expectations it checks and the chain head it extends cannot
move under it (store/sqlite.py says why the store is built this way).
"""

from __future__ import annotations

import functools
import sqlite3
from _thread import get_ident as _thread  # `threading.get_ident`, without importing `threading`
from collections.abc import Iterable, Sequence
from itertools import chain as concat
from itertools import starmap
from typing import Any

from lifecycle_fsm.store.base import AppendResult
from lifecycle_fsm.store.chain import GENESIS_HASH, chain_rows, check_batch, match_retry
from lifecycle_fsm.store.errors import ConcurrencyError, StoreError
from lifecycle_fsm.store.records import Head, NewEvent, StoredEvent, StreamHead
from lifecycle_fsm.store.sqlite_schema import EVENT_COLUMNS
from lifecycle_fsm.store.threads import ThreadOwner

__all__ = ["SQLiteTransaction", "read_stream_rows", "row_to_event", "select_stream_heads"]


def row_to_event(row: Sequence[Any]) -> StoredEvent:
    return StoredEvent(*row)


class SQLiteTransaction:
    """A write transaction on the SQLite store (see `StoreTransaction`)."""

    def __init__(self, conn: sqlite3.Connection, owner: ThreadOwner) -> None:
        self._conn = conn
        self._owner = owner
        self._head: Head | None = None  # read with the first append's version check
        # `expect_version` calls not yet checked: folded into the next append's version read
        # (one statement fewer per command), or checked on their own before the commit.
        self._expected: list[tuple[str, int]] = []
        # An append that failed after some of its rows were inserted: the transaction must not
        # commit them, even when the caller catches the error (PostgreSQL aborts it likewise).
        self._failed: str | None = None

    # Each public method checks its thread first (`store/threads.py`): several change the
    # transaction's state before `sqlite3` would refuse the thread. Not `one_thread`'s wrapper
    # (+1.7% of a command's instructions, `benchmarks/instructions.py`); the methods every
    # command calls compare the thread id inline (a method call is ~1.4k instructions).

    def stream_version(self, stream_id: str) -> int:
        self._owner.check()
        row = self._conn.execute(
            "SELECT version FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1", (stream_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def expect_version(self, stream_id: str, expected_version: int) -> None:
        if _thread() != self._owner.ident:
            self._owner.check()
        self._expected.append((stream_id, expected_version))

    def check_expected(self) -> None:
        """Check the `expect_version` calls no append has checked yet (before a commit)."""
        if _thread() != self._owner.ident:
            self._owner.check()
        if self._failed is not None:
            raise StoreError(f"{self._failed}; nothing in this transaction was committed")
        expected, self._expected = self._expected, []
        for stream_id, want in expected:
            self._raise_unless(stream_id, want, self.stream_version(stream_id))

    def _raise_unless(self, stream_id: str, expected_version: int, actual: int) -> None:
        if actual != expected_version:
            raise ConcurrencyError(
                f"stream {stream_id!r} is at version {actual}, expected {expected_version}: "
                "another writer appended first; retry the command",
                stream_id=stream_id,
                expected_version=expected_version,
                actual_version=actual,
            )

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        self._owner.check()
        return read_stream_rows(self._conn, stream_id, after_version)

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        self._owner.check()
        return select_stream_heads(self._conn, statuses)

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
        if _thread() != self._owner.ident:
            self._owner.check()
        if not events:
            return AppendResult(())
        check_batch(stream_id, events)
        if self._failed is not None:
            raise StoreError(f"{self._failed}; this transaction can only be rolled back")
        # A writer that just generated random ids (uuid4) cannot be retrying: no look-up. Else
        # only the first id is looked up (with the versions, in one statement): a retry stores
        # every id again, and any later id already taken makes the insert fail (below).
        first_id = None if fresh_ids else events[0].event_id
        expected, self._expected = self._expected, []
        actual, taken, others = self._read_versions(stream_id, first_id, expected)
        if taken is not None:  # a retry returns what it stored, whatever moved since (as on PostgreSQL)
            return AppendResult(self._retried(events), duplicate=True)
        try:
            for (other, want), found in zip(expected, others, strict=True):
                self._raise_unless(other, want, found or 0)
            self._raise_unless(stream_id, expected_version, actual)
        except ConcurrencyError:
            if not fresh_ids:
                self._refuse_taken_ids(events, None)  # an id already used is the error to report
            raise
        head = self._head
        assert head is not None
        rows = chain_rows(head, stream_id, expected_version, events)
        try:
            self._insert(rows)
        except sqlite3.IntegrityError as e:
            self._failed = f"an append to {stream_id!r} failed part-way ({e})"
            if not fresh_ids:
                self._refuse_taken_ids(events, head.seq)
            raise ConcurrencyError(
                f"stream {stream_id!r}: version or event id already taken ({e})",
                stream_id=stream_id,
                expected_version=expected_version,
                actual_version=actual,  # read under the lock: the clash was an event id, not the version
            ) from e
        last = rows[-1]
        self._conn.execute(_UPSERT_STREAM, (stream_id, last[2], status, category))
        self._head = Head(last[0], last[10])
        return AppendResult(tuple(starmap(StoredEvent, rows)))

    def _insert(self, rows: list[tuple[Any, ...]]) -> None:
        """The rows in multi-row INSERTs of 64, 32, … 1 rows (a few statement shapes for the cache):
        ~7% fewer instructions an event than one execution per row (`executemany`)."""
        execute, at, left = self._conn.execute, 0, len(rows)
        while left:
            size = 64 if left >= 64 else 1 << (left.bit_length() - 1)
            execute(_insert_sql(size), list(concat.from_iterable(rows[at : at + size])))
            at += size
            left -= size

    def _read_versions(
        self, stream_id: str, first_id: str | None, expected: list[tuple[str, int]]
    ) -> tuple[int, int | None, tuple[Any, ...]]:
        """The stream's version, the seq holding `first_id` (None: not stored) and the versions
        of the `expected` streams, in one statement; the log's head too on the first append."""
        with_head = self._head is None
        params: tuple[Any, ...] = (stream_id,) if first_id is None else (stream_id, first_id)
        row = self._conn.execute(
            _versions_sql(with_head, first_id is not None, len(expected)), params + tuple(sid for sid, _ in expected)
        ).fetchone()
        at = 1
        if with_head:
            seq, digest = row[1], row[2]
            self._head = Head(seq, digest) if seq is not None else Head(0, GENESIS_HASH)
            at = 3
        taken = None
        if first_id is not None:
            taken = row[at]
            at += 1
        return (row[0] or 0), taken, row[at:]

    def _retried(self, events: Sequence[NewEvent]) -> tuple[StoredEvent, ...]:
        """The stored copies of a retried batch (its first id is stored); DuplicateEventError
        unless every id was stored with the same content."""
        retried = match_retry(events, self._stored(events, None))
        assert retried is not None  # the first id is stored
        return retried

    def _refuse_taken_ids(self, events: Sequence[NewEvent], before: int | None) -> None:
        """DuplicateEventError when an id of a batch whose first id is new was already taken
        (stored at or before seq `before`: not one of this failed append's own rows)."""
        stored = self._stored(events, before)
        if stored:
            match_retry(events, stored)  # the first id is not among them: this raises

    def _stored(self, events: Sequence[NewEvent], before: int | None) -> dict[str, StoredEvent]:
        """The stored events with the batch's ids (one query per 500 ids), by id."""
        ids = [e.event_id for e in events]
        stored: dict[str, StoredEvent] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            sql, params = _select_by_ids(len(chunk)), list[Any](chunk)
            if before is not None:
                sql, params = sql + " AND seq <= ?", [*chunk, before]
            rows = self._conn.execute(sql, params).fetchall()
            stored.update((row[3], row_to_event(row)) for row in rows)
        return stored


_UPSERT_STREAM = (
    "INSERT INTO streams (stream_id, version, status, category) VALUES (?,?,?,?) "
    "ON CONFLICT(stream_id) DO UPDATE SET version = excluded.version, "
    "status = coalesce(excluded.status, streams.status), "
    "category = coalesce(excluded.category, streams.category)"
)


@functools.lru_cache(maxsize=64)
def _versions_sql(with_head: bool, with_id: bool, expected: int) -> str:
    """`_read_versions`' statement (built once per shape: the text is also the statement cache's key)."""
    version = "(SELECT version FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1)"
    columns = [version]
    if with_head:
        columns += ["(SELECT seq FROM events ORDER BY seq DESC LIMIT 1)",
                    "(SELECT hash FROM events ORDER BY seq DESC LIMIT 1)"]  # fmt: skip
    if with_id:
        columns.append("(SELECT seq FROM events WHERE event_id = ?)")
    return "SELECT " + ", ".join(columns + [version] * expected)


@functools.lru_cache(maxsize=8)
def _insert_sql(rows: int) -> str:
    """An INSERT of `rows` events (built once per size: the text is also the statement cache's key)."""
    return f"INSERT INTO events ({EVENT_COLUMNS}) VALUES " + ",".join(["(?,?,?,?,?,?,?,?,?,?,?)"] * rows)


@functools.lru_cache(maxsize=64)
def _select_by_ids(n: int) -> str:
    """The look-up of `n` event ids (built once per size: the text is also the statement cache's key)."""
    return f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id IN ({','.join('?' * n)})"


def read_stream_rows(conn: sqlite3.Connection, stream_id: str, after_version: int) -> list[StoredEvent]:
    rows = conn.execute(
        f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = ? AND version > ? ORDER BY version",
        (stream_id, after_version),
    ).fetchall()
    return [row_to_event(r) for r in rows]


def select_stream_heads(conn: sqlite3.Connection, statuses: Iterable[str] | None) -> list[StreamHead]:
    sql = "SELECT stream_id, version, status, category FROM streams"
    params: list[str] = []
    if statuses is not None:
        params = list(statuses)
        sql += f" WHERE status IN ({','.join('?' * len(params))})"
    rows = conn.execute(sql + " ORDER BY stream_id", params).fetchall()
    return [StreamHead(*r) for r in rows]
