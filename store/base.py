"""The small interface every event store implements (memory, SQLite, PostgreSQL), and the reads built on it.

Backends implement the Protocol (no base class to inherit) and pass one contract suite
(tests/test_store_contract.py)."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager
from typing import Protocol

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.store.chain import GENESIS_HASH, verify_rows
from lifecycle_fsm.store.records import (
    ALL_EVENTS,
    AppendResult,
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    Row,
    StoredEvent,
    StreamHead,
    StreamShare,
    StreamSnapshot,
)

__all__ = [
    "EventStore",
    "StoreTransaction",
    "event_at",
    "hash_at",
    "select_events",
    "snapshot_in_write",
    "verify_chain",
    "write_in_read_snapshot",
    "write_in_transaction",
]


class StoreTransaction(Protocol):
    """Reads and appends under the store's write lock; all or nothing on exit."""

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        fresh_ids: bool = False,
        expect: Sequence[tuple[str, int]] = (),
        copied: bool = False,
    ) -> AppendResult:
        """Append to one stream at `expected_version` (`store.writes.WriteTransaction.append`)."""

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        """The events of one stream after `after_version`, oldest first, this transaction's own included."""

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version (0 when it has no events)."""

    def streams(self) -> list[StreamHead]:
        """Every stream at its current version, this transaction's appends included."""


class EventStore(Protocol):
    """An append-only, hash-chained event log with checkpoints."""

    # --- what a command needs

    def transaction(self) -> AbstractContextManager[StoreTransaction]:
        """Take the write lock, yield a transaction, commit on success, roll back on error."""

    def append(
        self,
        stream_id: str,
        expected_version: int,
        events: Sequence[NewEvent],
        *,
        fresh_ids: bool = False,
        expect: Sequence[tuple[str, int]] = (),
    ) -> AppendResult:
        """One append in its own transaction (`StoreTransaction.append`)."""

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        """The events of one stream after `after_version`, oldest first."""

    def stream_version(self, stream_id: str) -> int:
        """The stream's current version (0 when it has no events)."""

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        """The event with this id, if any (a retried command's idempotency look-up)."""

    def streams(self) -> list[StreamHead]:
        """Every stream at its current version, in stream id order, with the state index's labels (none
        for a stream with events past the index's position)."""

    def state_index(self) -> tuple[int, list[StreamHead]]:
        """The state index as stored: the position it reflects and its rows (what `verify` compares)."""

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        """Replace the state index with `derive()`, called under the write lock: it then reflects the head."""

    # --- what replay and auditors need

    def select_rows(self, query: EventFilter = ALL_EVENTS) -> Iterator[list[Row]]:
        """The events `query` selects, in seq order, as batches of whole rows, in constant memory; every
        condition is pushed into the backend's query."""

    def select_fold_rows(
        self, *, after: int, before: int | None, streams: StreamShare | None = None
    ) -> Iterator[list[Row]]:
        """The rows `after < seq < before` as only their fold columns (`chain.fold_columns`), for a fold
        that does not re-hash them; with `streams`, only those streams' rows."""

    def position_at(self, recorded_at: str) -> int:
        """As of a UTC time: the seq before the first event recorded after it, else the head."""

    def read_snapshot(self) -> AbstractContextManager[None]:
        """Every read inside sees the ledger as of its first read; a write through this handle inside is
        refused (`InputError`). A nested one is the outer one."""

    # --- what checkpoints need

    def append_checkpoint(
        self,
        *,
        position: int,
        schema_version: int,
        fingerprint: str,
        snapshot: str,
        recorded_at: str,
        streams: Sequence[tuple[str, int, str]] = (),
        index: Sequence[StreamHead] | None = None,
    ) -> CheckpointRecord:
        """Store a snapshot taken at `position` with `(stream_id, version, state)` copies of each stream's
        state; with `index`, the state index is brought to it unless it already reflects more."""

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        """Checkpoints at or before a position (default: all), newest first, read lazily."""

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        """Every stream copy a checkpoint holds."""

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        """The newest checkpoint's copy of one stream's state, if any."""

    # --- what verify needs

    def head(self) -> Head:
        """The last position and its hash."""

    def count_events(self) -> int:
        """How many rows the log holds."""

    def guard_problems(self) -> list[str]:
        """What is missing or altered of the database's own append-only guards: empty when all hold."""

    def index_problems(self) -> list[str]:
        """Where the event index disagrees with the log: empty when it agrees, or when there is none."""

    def history_problem(self) -> str | None:
        """The log emptied or replaced outside the store; None when it is the ledger's own."""

    def close(self) -> None:
        """Release the connection."""


def select_events(store: EventStore, query: EventFilter = ALL_EVENTS) -> Iterator[StoredEvent]:
    """`store.select_rows(query)` as records."""
    for rows in store.select_rows(query):
        for row in rows:
            yield StoredEvent(*row)


def event_at(store: EventStore, seq: int) -> StoredEvent | None:
    """The event at this global position, if any."""
    return next(select_events(store, EventFilter(after=seq - 1, before=seq + 1)), None)


def hash_at(store: EventStore, seq: int) -> str | None:
    """The stored hash at a position (the genesis hash at 0), None past the head."""
    if seq == 0:
        return GENESIS_HASH
    event = event_at(store, seq)
    return None if event is None else event.hash


def verify_chain(store: EventStore) -> ChainReport:
    """Re-hash the whole log in one pass; report the first broken position."""
    return verify_rows(store.select_rows(), count=store.count_events, head=store.head)


def snapshot_in_write(where: object) -> InputError:
    return InputError(f"{where}: read_snapshot() inside a write transaction is refused")


def write_in_read_snapshot(where: object) -> InputError:
    return InputError(f"{where}: a write inside read_snapshot() is refused (it holds one read transaction)")


def write_in_transaction(where: object) -> InputError:
    return InputError(
        f"{where}: a write through the store inside its own open transaction is refused (use the transaction's methods)"
    )
