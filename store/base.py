"""The small interface every event store implements (memory, SQLite, PostgreSQL).

These are Protocols: a backend implements the methods (no base class to inherit)
and passes the one contract suite that runs against every backend
(tests/test_store_contract.py).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol

from lifecycle_fsm.store.records import (
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    Record,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)


class AppendResult(Record):
    """What an append wrote; `duplicate` when it was a retry of an identical append."""

    __slots__ = ("events", "duplicate")  # noqa: RUF023 - the fields, in order
    events: tuple[StoredEvent, ...]
    duplicate: bool

    def __init__(self, events: tuple[StoredEvent, ...], duplicate: bool = False) -> None:
        self._fill(events, duplicate)


class StoreTransaction(Protocol):
    """Reads and appends under the store's write lock; all or nothing on exit."""

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version (0 when it has no events)."""
        ...

    def expect_version(self, stream_id: str, expected_version: int) -> None:
        """Raise ConcurrencyError unless the stream is exactly at `expected_version`."""
        ...

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        """The events of one stream after `after_version`, oldest first."""
        ...

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        """The stream index (a rebuildable cache), filtered by status label."""
        ...

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
        """Append events to one stream at `expected_version`; label the stream in the index.

        An append whose event ids were all appended before with the same content is a
        retry: it returns the stored events (`duplicate=True`). `fresh_ids=True` says
        the ids were just generated at random, so that look-up can be skipped.
        """
        ...


class EventStore(Protocol):
    """An append-only, hash-chained event log with checkpoints."""

    def transaction(self) -> AbstractContextManager[StoreTransaction]:
        """Take the write lock, yield a transaction, commit on success, roll back on error."""
        ...

    def read_snapshot(self) -> AbstractContextManager[None]:
        """Inside, every read of this handle sees the ledger as of one moment (its first read),
        whatever other writers commit meanwhile: one read transaction.

        For reads that put several queries side by side (`verify`'s fold against the state
        index, a report, an attestation's state and head): without it a commit between two
        of them makes a sound ledger look inconsistent. Reads only: a write through this
        handle inside one is refused (`InputError`). A nested one is the outer one.
        """
        ...

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
        """Append to one stream in its own transaction (see `StoreTransaction.append`).

        `expect`: `(stream_id, version)` of other streams the caller's decision read;
        ConcurrencyError, nothing written, unless each is still at that version (as
        `StoreTransaction.expect_version`, checked in the same transaction).
        """
        ...

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        """The events of one stream after `after_version`, oldest first."""
        ...

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version (0 when it has no events)."""
        ...

    def select_events(self, *, after: int = 0, to: int | None = None) -> Iterator[StoredEvent]:
        """Events with `after < seq <= to`, in order, streamed in constant memory."""
        ...

    def select_fold_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """Batches of `(seq, stream_id, version, type, schema_version, payload)` tuples, in order."""
        ...

    def select_row_batches(self, *, after: int = 0, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """Batches of whole rows (`StoredEvent` field order, hash columns too), in order.

        For the reads that check every row's hash on the way to a fold (`chain.check_rows`,
        `chain.ChainWalk`) without a record object per row.
        """
        ...

    def select_matching(self, query: EventFilter) -> Iterator[StoredEvent]:
        """The events `query` selects, in seq order, streamed (the auditor's `log`).

        Every condition is pushed into the backend's query, served by indexes on
        `type`, `actor`, `recorded_at` and `stream_id`; payload matches are checked
        there too, on the rows the other conditions leave.
        """
        ...

    def position_at(self, recorded_at: str) -> int:
        """The last seq whose `recorded_at` is at or before this UTC text (0 if none).

        As-of a time: the log up to there holds every event recorded by then.
        """
        ...

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        """The event with this id, if any."""
        ...

    def event_at(self, seq: int) -> StoredEvent | None:
        """The event at this global position, if any."""
        ...

    def head(self) -> Head:
        """The last position and its hash."""
        ...

    def hash_at(self, seq: int) -> str | None:
        """The stored hash at a position (the genesis hash at 0), None past the head."""
        ...

    def count_events(self) -> int:
        """How many events the log holds."""
        ...

    def streams(self, *, statuses: Iterable[str] | None = None) -> list[StreamHead]:
        """The stream index, filtered by status label."""
        ...

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        """Replace the stream index with `derive()`, called under the write lock.

        The caller folds the log inside the lock, so no append can land between the
        fold and the new index (a stale label would hide a candidate from invalidation).
        """
        ...

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
        """Store a snapshot taken at `position` (its head hash is read from the log).

        `streams` are `(stream_id, version, state)` copies of each stream's own folded
        state, so one stream can be read from the checkpoint without the others.
        """
        ...

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        """Every stream copy a checkpoint holds."""
        ...

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        """The newest checkpoint's copy of one stream's state, if any."""
        ...

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        """Checkpoints at or before a position (default: all), newest first, read lazily."""
        ...

    def guard_problems(self) -> list[str]:
        """What is missing or altered of the database's own append-only guards (the triggers
        refusing UPDATE, DELETE, REPLACE or TRUNCATE on `events`): empty when all are in place.
        `verify` reports any as a failure; a file writer can drop them (README, threat model)."""
        ...

    def verify_chain(self) -> ChainReport:
        """Re-hash the whole log; report the first broken position."""
        ...

    def close(self) -> None:
        """Release the connection."""
        ...
