"""The SQLite store's write transaction and the row readers it shares with the store.

`SQLiteEventStore.transaction()` hands one out under `BEGIN IMMEDIATE`: the stream
versions it reads, the expectations it checks and the chain head it extends cannot
move under it (store/sqlite.py says why the store is built this way).
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Iterable, Sequence
from typing import Any

from store.base import AppendResult
from store.chain import GENESIS_HASH, chain_rows, check_batch, match_retry
from store.errors import ConcurrencyError
from store.records import Head, NewEvent, StoredEvent, StreamHead
from store.sqlite_schema import EVENT_COLUMNS

__all__ = ["SQLiteTransaction", "read_stream_rows", "row_to_event", "select_stream_heads"]


def row_to_event(row: Sequence[Any]) -> StoredEvent:
    return StoredEvent(*row)


class SQLiteTransaction:
    """A write transaction on the SQLite store (see `StoreTransaction`)."""

    def __init__(self, conn: sqlite3.Connection) -> None:
        self._conn = conn
        self._head: Head | None = None  # read with the first append's version check
        # `expect_version` calls not yet checked: folded into the first append's head read
        # (one statement fewer per command), or checked on their own before the commit.
        self._expected: list[tuple[str, int]] = []

    def stream_version(self, stream_id: str) -> int:
        row = self._conn.execute(
            "SELECT version FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1", (stream_id,)
        ).fetchone()
        return int(row[0]) if row else 0

    def _version_and_head(self, stream_id: str) -> tuple[int, Head]:
        """The stream's version and the log's head; one statement for a command's first append,
        which also reads the versions `expect_version` asked about (checked first, in order)."""
        if self._head is not None:
            self.check_expected()
            return self.stream_version(stream_id), self._head
        expected, self._expected = self._expected, []
        probe = "(SELECT version FROM events WHERE stream_id = ? ORDER BY version DESC LIMIT 1)"
        row = self._conn.execute(
            f"SELECT {probe}, (SELECT seq FROM events ORDER BY seq DESC LIMIT 1), "
            f"(SELECT hash FROM events ORDER BY seq DESC LIMIT 1){f', {probe}' * len(expected)}",
            (stream_id, *(sid for sid, _ in expected)),
        ).fetchone()
        for (sid, want), actual in zip(expected, row[3:], strict=True):
            self._raise_unless(sid, want, actual or 0)
        version, seq, digest = row[:3]
        self._head = Head(seq, digest) if seq is not None else Head(0, GENESIS_HASH)
        return (version or 0), self._head

    def expect_version(self, stream_id: str, expected_version: int) -> None:
        self._expected.append((stream_id, expected_version))

    def check_expected(self) -> None:
        """Check the `expect_version` calls no append has checked yet (before a commit)."""
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
        return read_stream_rows(self._conn, stream_id, after_version)

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
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
        if not events:
            return AppendResult(())
        check_batch(stream_id, events)
        # A writer that just generated random ids (uuid4) cannot be retrying: skip the
        # look-up. UNIQUE(event_id) still guards the table.
        existing = None if fresh_ids else self._existing(events)
        if existing is not None:
            self._expected = []  # a retry returns what it stored, whatever moved since (as on PostgreSQL)
            return AppendResult(existing, duplicate=True)
        actual, head = self._version_and_head(stream_id)
        self._raise_unless(stream_id, expected_version, actual)
        rows = chain_rows(head, stream_id, expected_version, events)
        try:
            self._conn.executemany(f"INSERT INTO events ({EVENT_COLUMNS}) VALUES (?,?,?,?,?,?,?,?,?,?,?)", rows)
        except sqlite3.IntegrityError as e:
            raise ConcurrencyError(
                f"stream {stream_id!r}: version or event id already taken ({e})",
                stream_id=stream_id,
                expected_version=expected_version,
                actual_version=actual,  # read under the lock: the clash was an event id, not the version
            ) from e
        self._conn.execute(
            "INSERT INTO streams (stream_id, version, status, category) VALUES (?,?,?,?) "
            "ON CONFLICT(stream_id) DO UPDATE SET version = excluded.version, "
            "status = coalesce(excluded.status, streams.status), "
            "category = coalesce(excluded.category, streams.category)",
            (stream_id, rows[-1][2], status, category),
        )
        self._head = Head(rows[-1][0], rows[-1][10])
        return AppendResult(tuple(StoredEvent(*row) for row in rows))

    def _existing(self, events: Sequence[NewEvent]) -> tuple[StoredEvent, ...] | None:
        """The stored copies when this exact batch was appended before (a retry), else None.

        Every id is looked up (one query per 500 ids): one taken id in an otherwise new
        batch is a `DuplicateEventError`, not a conflict worth retrying.
        """
        ids = [e.event_id for e in events]
        stored: dict[str, StoredEvent] = {}
        for i in range(0, len(ids), 500):
            chunk = ids[i : i + 500]
            rows = self._conn.execute(_select_by_ids(len(chunk)), chunk).fetchall()
            stored.update((row[3], row_to_event(row)) for row in rows)
        return match_retry(events, stored)


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
