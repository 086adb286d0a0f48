"""The in-memory event store: the contract in plain Python, nothing durable.

It exists to prove the `EventStore` interface is enough (the same contract tests run
against it and SQLite, so a PostgreSQL backend is "implement and pass"), and for
embedders who want a ledger in a unit test. One lock serialises writers, as SQLite's
write lock does; a transaction's appends become visible only when it commits.
"""

from __future__ import annotations

import hashlib
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from lifecycle_fsm.store.base import AppendResult
from lifecycle_fsm.store.chain import GENESIS_HASH, chain_rows, check_batch, match_retry, verify_events
from lifecycle_fsm.store.errors import ConcurrencyError, InputError, IntegrityError, write_in_read_snapshot
from lifecycle_fsm.store.records import (
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    PayloadMatch,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)

__all__ = ["MemoryEventStore", "MemoryTransaction"]


class MemoryTransaction:
    """Reads see the committed log plus this transaction's own appends."""

    def __init__(self, store: MemoryEventStore) -> None:
        self._store = store
        self._pending: list[StoredEvent] = []
        self._index: dict[str, StreamHead] = {}

    def _events_of(self, stream_id: str) -> list[StoredEvent]:
        return self._store._streams.get(stream_id, []) + [e for e in self._pending if e.stream_id == stream_id]

    def stream_version(self, stream_id: str) -> int:
        events = self._events_of(stream_id)
        return events[-1].version if events else 0

    def expect_version(self, stream_id: str, expected_version: int) -> None:
        actual = self.stream_version(stream_id)
        if actual != expected_version:
            raise ConcurrencyError(
                f"stream {stream_id!r} is at version {actual}, expected {expected_version}: "
                "another writer appended first; retry the command",
                stream_id=stream_id,
                expected_version=expected_version,
                actual_version=actual,
            )

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [e for e in self._events_of(stream_id) if e.version > after_version]

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        merged = {**self._store._index, **self._index}
        wanted = None if statuses is None else set(statuses)
        return [h for _, h in sorted(merged.items()) if wanted is None or h.status in wanted]

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
        by_id = self._store._by_id
        pending_ids = {e.event_id: e for e in self._pending}
        stored = {e.event_id: found for e in events if (found := by_id.get(e.event_id) or pending_ids.get(e.event_id))}
        existing = None if fresh_ids and not stored else match_retry(events, stored)
        if existing is not None:
            return AppendResult(existing, duplicate=True)
        self.expect_version(stream_id, expected_version)
        head = self._pending[-1] if self._pending else None
        start = Head(head.seq, head.hash) if head else self._store.head()
        new = [StoredEvent(*row) for row in chain_rows(start, stream_id, expected_version, events)]
        self._pending.extend(new)
        old = self._index.get(stream_id) or self._store._index.get(stream_id)
        self._index[stream_id] = StreamHead(
            stream_id,
            new[-1].version,
            status if status is not None else (old.status if old else None),
            category if category is not None else (old.category if old else None),
        )
        return AppendResult(tuple(new))

    def commit(self) -> None:
        store = self._store
        for event in self._pending:
            store._log.append(event)
            store._by_id[event.event_id] = event
            store._streams.setdefault(event.stream_id, []).append(event)
        store._index.update(self._index)


class MemoryEventStore:
    """An `EventStore` held in this process's memory (see the module docstring)."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._log: list[StoredEvent] = []
        self._by_id: dict[str, StoredEvent] = {}
        self._streams: dict[str, list[StoredEvent]] = {}
        self._index: dict[str, StreamHead] = {}
        self._checkpoints: list[CheckpointRecord] = []
        self._stream_copies: list[tuple[int, str, int, str, str]] = []
        self._reading = False  # a thread holds the lock in `read_snapshot()`
        self._writing = False  # … or in `transaction()`

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """The writers' lock, held: other threads' writes wait until it ends."""
        with self._lock:
            if self._reading:
                yield
                return
            if self._writing:
                raise InputError("memory store: read_snapshot() inside a write transaction is refused")
            self._reading = True
            try:
                yield
            finally:
                self._reading = False

    def _writable(self) -> None:
        """Under the lock: only the thread holding a snapshot can get here while it is open."""
        if self._reading:
            raise write_in_read_snapshot("memory store")

    @contextmanager
    def transaction(self) -> Iterator[MemoryTransaction]:
        with self._lock:
            self._writable()
            tx = MemoryTransaction(self)
            self._writing = True
            try:
                yield tx
                tx.commit()
            finally:
                self._writing = False

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        status: str | None = None,
        category: str | None = None,
        fresh_ids: bool = False,
        expect: Sequence[tuple[str, int]] = (),
    ) -> AppendResult:
        with self.transaction() as tx:
            done = tx.append(stream_id, expected_version, events, status=status, category=category, fresh_ids=fresh_ids)
            if not done.duplicate:  # a retry returns its events whatever moved since (as SQLite and PostgreSQL)
                for other, version in expect:
                    tx.expect_version(other, version)
            return done

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [e for e in self._streams.get(stream_id, []) if e.version > after_version]

    def stream_version(self, stream_id: str) -> int:
        events = self._streams.get(stream_id)
        return events[-1].version if events else 0

    def select_events(self, *, after: int = 0, to: int | None = None) -> Iterator[StoredEvent]:
        upper = len(self._log) if to is None else min(to, len(self._log))
        yield from self._log[after:upper]

    def select_fold_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        batch = [
            (e.seq, e.stream_id, e.version, e.type, e.schema_version, e.payload)
            for e in self.select_events(after=after, to=to)
        ]
        if batch:
            yield batch

    def select_row_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        batch = [
            (e.seq, e.stream_id, e.version, e.event_id, e.type, e.schema_version, e.payload, e.recorded_at, e.actor,
             e.prev_hash, e.hash)
            for e in self.select_events(after=after, to=to)
        ]  # fmt: skip
        if batch:
            yield batch

    def select_matching(self, query: EventFilter) -> Iterator[StoredEvent]:
        found = (e for e in self._log[query.after :] if _matches(e, query))
        yield from itertools.islice(found, query.limit)

    def position_at(self, recorded_at: str) -> int:
        return max((e.seq for e in self._log if e.recorded_at <= recorded_at), default=0)

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        return self._by_id.get(event_id)

    def event_at(self, seq: int) -> StoredEvent | None:
        return self._log[seq - 1] if 1 <= seq <= len(self._log) else None

    def head(self) -> Head:
        return Head(self._log[-1].seq, self._log[-1].hash) if self._log else Head(0, GENESIS_HASH)

    def hash_at(self, seq: int) -> str | None:
        if seq == 0:
            return GENESIS_HASH
        event = self.event_at(seq)
        return None if event is None else event.hash

    def count_events(self) -> int:
        return len(self._log)

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        wanted = None if statuses is None else set(statuses)
        return [h for _, h in sorted(self._index.items()) if wanted is None or h.status in wanted]

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        with self._lock:
            self._writable()
            self._index = {h.stream_id: h for h in derive()}

    def append_checkpoint(
        self,
        *,
        position: int,
        schema_version: int,
        fingerprint: str,
        snapshot: str,
        recorded_at: str,
        streams: Sequence[tuple[str, int, str]] = (),
    ) -> CheckpointRecord:
        with self._lock:
            self._writable()
            head_hash = self.hash_at(position)
            if head_hash is None:
                raise IntegrityError(f"no event at position {position} to checkpoint", seq=position)
            digest = hashlib.sha256(snapshot.encode()).hexdigest()
            record = CheckpointRecord(
                len(self._checkpoints) + 1, position, head_hash, schema_version, fingerprint, snapshot, digest,
                recorded_at,
            )  # fmt: skip
            self._checkpoints.append(record)
            for stream_id, version, text in streams:
                sha = hashlib.sha256(text.encode()).hexdigest()
                self._stream_copies.append((record.checkpoint_id, stream_id, version, text, sha))
        return record

    def _snapshot(self, copy: tuple[int, str, int, str, str]) -> StreamSnapshot:
        cp = self._checkpoints[copy[0] - 1]
        return StreamSnapshot(cp.checkpoint_id, cp.position, cp.head_hash, cp.schema_version, cp.fingerprint, *copy[1:])

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        return sorted(
            (self._snapshot(c) for c in self._stream_copies if c[0] == checkpoint_id), key=lambda s: s.stream_id
        )

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        copies = [self._snapshot(c) for c in self._stream_copies if c[1] == stream_id]
        return max(copies, key=lambda s: (s.position, s.checkpoint_id), default=None)

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        records = [c for c in self._checkpoints if at_or_before is None or c.position <= at_or_before]
        yield from sorted(records, key=lambda c: (c.position, c.checkpoint_id), reverse=True)

    def guard_problems(self) -> list[str]:
        """Nothing but this class can change its list: no guard to lose."""
        return []

    def verify_chain(self) -> ChainReport:
        return verify_events(list(self._log), count=len(self._log), head=self.head())

    def close(self) -> None:
        """Nothing to release."""


def _matches(e: StoredEvent, q: EventFilter) -> bool:
    """The reference semantics of `EventFilter` (SQLite's query must agree)."""
    return (
        e.seq > q.after
        and (q.before is None or e.seq < q.before)
        and (q.since is None or e.recorded_at >= q.since)
        and (q.until is None or e.recorded_at <= q.until)
        and (not q.types or e.type in q.types)
        and (q.stream_id is None or e.stream_id == q.stream_id)
        and (q.actor is None or e.actor == q.actor)
        and (not q.payload or any(_payload_holds(e, m) for m in q.payload))
    )


def _payload_holds(e: StoredEvent, m: PayloadMatch) -> bool:
    if e.type != m.type:
        return False
    value: Any = orjson.loads(e.payload)
    for key in m.path.removeprefix("$.").split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return value == m.value or (isinstance(value, list) and m.value in value)
