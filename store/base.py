"""The small interface every event store implements (memory, SQLite, PostgreSQL), the reads built on it,
and the append, written once: every backend's write transaction runs it under its write lock.

Backends implement the Protocol and pass one contract suite (tests/test_store_contract.py). A backend's
write transaction supplies the primitives (`_read` the head, versions and ids; `_insert` rows); the rules
are here: one stream per append, columns of the right type, a retry of an identical append returns what
it stored, an event id reused for other content is refused, every expected version must hold, and the
rows are chained after the head read under the same lock.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager
from typing import Generic, Protocol, TypeVar

from lifecycle_fsm.errors import ConcurrencyError, DuplicateEventError, InputError, StoreError
from lifecycle_fsm.store.chain import GENESIS_HASH, ChainWalk, canonical_json, chain_rows
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
        """Append to one stream at `expected_version` (`WriteTransaction.append`)."""

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
    walk = ChainWalk(store.select_rows())
    walk.finish()
    return walk.report(count=store.count_events, head=store.head)


def snapshot_in_write(where: object) -> InputError:
    return InputError(f"{where}: read_snapshot() inside a write transaction is refused")


def write_in_read_snapshot(where: object) -> InputError:
    return InputError(f"{where}: a write inside read_snapshot() is refused (it holds one read transaction)")


def write_in_transaction(where: object) -> InputError:
    return InputError(
        f"{where}: a write through the store inside its own open transaction is refused (use the transaction's methods)"
    )


# PostgreSQL stores schema_version as an integer: every backend keeps the same range.
_MAX_SCHEMA_VERSION = 2**31


class WriteTransaction(ABC):
    """A write transaction (the `StoreTransaction` protocol): the append rules over a backend's primitives."""

    failed: str | None = None  # an append that failed part-way: this transaction must not commit

    @abstractmethod
    def _read(
        self, streams: Sequence[str], ids: Sequence[str]
    ) -> tuple[Head, list[int], dict[str, StoredEvent], str | None]:
        """Under the lock: the head, each stream's version, the stored events with these ids, and what is
        wrong with the log's history, if anything."""

    def _record_first(self, digest: str) -> None:  # noqa: B027 - a backend with nothing to record keeps this
        """Record the hash of the ledger's first event, in the transaction appending it (a durable backend)."""

    @abstractmethod
    def _insert(self, rows: list[Row]) -> None:
        """Insert `rows` (one stream's); ConcurrencyError if the database refuses one."""

    def may_commit(self) -> None:
        """Refuse to commit after an append failed part-way."""
        if self.failed is not None:
            raise StoreError(f"{self.failed}; nothing in this transaction was committed")

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
        """Append `events` to one stream at `expected_version`.

        `expect`: `(stream_id, version)` of other streams the caller read; ConcurrencyError, nothing
        written, unless each still holds. Ids all appended before with the same content are a retry:
        the stored events come back (`duplicate=True`). `fresh_ids`: the ids were just generated, so
        that look-up is skipped. `copied`: another ledger's events, keeping the times it stored.
        """
        if self.failed is not None:
            raise StoreError(f"{self.failed}; this transaction can only be rolled back")
        check_batch(stream_id, events)
        if not events and not expect:
            return AppendResult(())
        ids = [] if fresh_ids else [e.event_id for e in events]
        checks = [*expect, (stream_id, expected_version)] if events else list(expect)
        head, versions, stored, damage = self._read([s for s, _ in checks], ids)
        if damage is not None:
            raise StoreError(f"{damage}; nothing was appended")
        retried = match_retry(events, stored)
        if retried is not None:
            return AppendResult(retried, duplicate=True)
        for (checked, want), found in zip(checks, versions, strict=True):
            if found != want:
                raise conflict(checked, want, found)
        if not events:
            return AppendResult(())
        rows = chain_rows(head, stream_id, expected_version, events, stamp=not copied)
        try:
            self._insert(rows)
            if head.seq == 0:
                self._record_first(rows[0][10])
        except BaseException as e:
            self.failed = f"an append to {stream_id!r} failed part-way ({e})"
            raise
        return AppendResult(tuple(StoredEvent(*row) for row in rows))


def conflict(stream_id: str, expected: int, actual: int) -> ConcurrencyError:
    return ConcurrencyError(
        f"stream {stream_id!r} is at version {actual}, expected {expected}: "
        "another writer appended first; retry the command",
        stream_id=stream_id,
        expected_version=expected,
        actual_version=actual,
    )


def id_taken(stream_id: str, expected: int, detail: object) -> ConcurrencyError:
    """The database refused a row under the lock: an event id promised fresh was taken."""
    return ConcurrencyError(
        f"stream {stream_id!r}: version or event id already taken ({detail})",
        stream_id=stream_id,
        expected_version=expected,
        actual_version=expected,
    )


def match_retry(events: Sequence[NewEvent], stored: Mapping[str, StoredEvent]) -> tuple[StoredEvent, ...] | None:
    """The stored copies when `events` were appended before (a retry), None when none were; some ids
    taken, or the same ids with other content, is `DuplicateEventError`."""
    if not stored:
        return None
    found = [stored.get(e.event_id) for e in events]
    for new, old in zip(events, found, strict=True):
        if old is None or (old.stream_id, old.type, old.schema_version, old.payload) != (
            new.stream_id,
            new.type,
            new.schema_version,
            canonical_json(new.payload),
        ):
            taken = min(stored.values(), key=lambda e: e.seq)
            raise DuplicateEventError(
                f"event id {taken.event_id!r} is already at seq {taken.seq}; this batch differs from that append",
                event_id=taken.event_id,
                seq=taken.seq,
            )
    return tuple(old for old in found if old is not None)


def check_batch(stream_id: str, events: Sequence[NewEvent]) -> None:
    """One stream per append, and every column of the type it is stored as (a column is hashed as given
    but stored as text: an event id of `5` stored as `"5"` would break the chain for good)."""
    for e in events:
        if e.stream_id != stream_id:
            raise InputError("every event of one append must belong to its stream")
        if (wrong := _wrong_column(e)) is not None:
            raise InputError(f"event {e.event_id!r}: {wrong}")


def _encodable(text: str) -> bool:
    """Valid Unicode text, which UTF-8 can carry (a lone surrogate cannot)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


def _wrong_column(e: NewEvent) -> str | None:
    """Which column of an event is wrong, if any."""
    for name in ("stream_id", "type", "event_id", "recorded_at", "actor"):
        value = getattr(e, name)
        if not isinstance(value, str):
            return f"{name} must be a string, not {type(value).__name__}"
        if "\0" in value:
            return f"{name} holds a NUL character, which PostgreSQL text cannot store"
        if not (value.isascii() or _encodable(value)):
            return f"{name} is not valid Unicode text (it holds a lone surrogate)"
    if type(e.schema_version) is not int:
        return f"schema_version must be an int, not {type(e.schema_version).__name__}"
    if not 0 < e.schema_version < _MAX_SCHEMA_VERSION:
        return f"schema_version must be 1 to {_MAX_SCHEMA_VERSION - 1}, not {e.schema_version}"
    if not isinstance(e.payload, dict):
        return f"payload must be a JSON object (a dict), not {type(e.payload).__name__}"
    return None


_Tx = TypeVar("_Tx", bound=WriteTransaction)


class Transactions(ABC, Generic[_Tx]):
    """A store's two ways to write: a transaction, or one append in a transaction of its own."""

    @abstractmethod
    def transaction(self) -> AbstractContextManager[_Tx]:
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
        with self.transaction() as tx:
            return tx.append(stream_id, expected_version, events, fresh_ids=fresh_ids, expect=expect)
