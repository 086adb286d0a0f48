"""The in-memory event store: the contract in plain Python, nothing durable.

The reference the SQL backends' filters are checked against, and a ledger for embedders' unit tests.
One lock serialises writers; a transaction's appends become visible when it commits."""

from __future__ import annotations

import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import orjson

from lifecycle_fsm.errors import IntegrityError
from lifecycle_fsm.store.base import Transactions, WriteTransaction, id_taken, snapshot_in_write, write_in_read_snapshot
from lifecycle_fsm.store.chain import GENESIS, GENESIS_HASH, fold_columns, snapshot_digest
from lifecycle_fsm.store.records import (
    ALL_EVENTS,
    CheckpointRecord,
    EventFilter,
    Head,
    PayloadMatch,
    Row,
    StoredEvent,
    StreamHead,
    StreamShare,
    StreamSnapshot,
)


class MemoryTransaction(WriteTransaction):
    """Reads see the committed log plus this transaction's own appends."""

    def __init__(self, store: MemoryEventStore) -> None:
        self._store = store
        self._pending: list[Row] = []

    def _rows_of(self, stream_id: str) -> list[Row]:
        return self._store._streams.get(stream_id, []) + [r for r in self._pending if r[1] == stream_id]

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [StoredEvent(*r) for r in self._rows_of(stream_id) if r[2] > after_version]

    def stream_version(self, stream_id: str) -> int:
        rows = self._rows_of(stream_id)
        return rows[-1][2] if rows else 0

    def streams(self) -> list[StreamHead]:
        return self._store._current(self._pending)

    def _read(
        self, streams: Sequence[str], ids: Sequence[str]
    ) -> tuple[Head, list[int], dict[str, StoredEvent], str | None]:
        log = self._pending or self._store._log
        head = Head(log[-1][0], log[-1][10], log[-1][7]) if log else GENESIS
        found = {i: StoredEvent(*row) for i in ids if (row := self._row_by_id(i)) is not None}
        return head, [self.stream_version(s) for s in streams], found, None

    def _row_by_id(self, event_id: str) -> Row | None:
        return self._store._by_id.get(event_id) or next((r for r in self._pending if r[3] == event_id), None)

    def _insert(self, rows: list[Row]) -> None:
        taken = [row[3] for row in rows if self._row_by_id(row[3]) is not None]
        if taken or len({row[3] for row in rows}) < len(rows):
            raise id_taken(rows[0][1], rows[0][2] - 1, f"UNIQUE event_id {taken[:1] or 'twice in the batch'}")
        self._pending.extend(rows)

    def commit(self) -> None:
        self.may_commit()
        store = self._store
        for row in self._pending:
            store._log.append(row)
            store._by_id[row[3]] = row
            store._streams.setdefault(row[1], []).append(row)


class MemoryEventStore(Transactions[MemoryTransaction]):
    """An `EventStore` held in this process's memory."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self._log: list[Row] = []
        self._by_id: dict[str, Row] = {}
        self._streams: dict[str, list[Row]] = {}
        self._index: dict[str, StreamHead] = {}  # the state index, as of `_indexed_at`
        self._indexed_at = 0
        self._checkpoints: list[CheckpointRecord] = []
        self._copies: list[StreamSnapshot] = []
        self._held: str | None = None  # "snapshot" or "write" while this handle's thread holds the lock

    @contextmanager
    def read_snapshot(self) -> Iterator[None]:
        """The writers' lock, held: other threads' writes wait until it ends."""
        with self._lock:
            if self._held == "snapshot":
                yield
                return
            if self._held == "write":
                raise snapshot_in_write("memory store")
            self._held = "snapshot"
            try:
                yield
            finally:
                self._held = None

    @contextmanager
    def _writing(self) -> Iterator[None]:
        with self._lock:
            if self._held == "snapshot":
                raise write_in_read_snapshot("memory store")
            self._held = "write"
            try:
                yield
            finally:
                self._held = None

    @contextmanager
    def transaction(self) -> Iterator[MemoryTransaction]:
        with self._writing():
            tx = MemoryTransaction(self)
            yield tx
            tx.commit()

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [StoredEvent(*r) for r in self._streams.get(stream_id, []) if r[2] > after_version]

    def stream_version(self, stream_id: str) -> int:
        rows = self._streams.get(stream_id)
        return rows[-1][2] if rows else 0

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        row = self._by_id.get(event_id)
        return None if row is None else StoredEvent(*row)

    def select_rows(self, query: EventFilter = ALL_EVENTS) -> Iterator[list[Row]]:
        found = list(itertools.islice((r for r in self._log if _matches(r, query)), query.limit))
        if found:
            yield found

    def select_fold_rows(
        self, *, after: int, before: int | None, streams: StreamShare | None = None
    ) -> Iterator[list[Row]]:
        for rows in self.select_rows(EventFilter(after=after, before=before)):
            yield [fold_columns(r) for r in rows if streams is None or streams.holds(r[1])]

    def position_at(self, recorded_at: str) -> int:
        return next((r[0] - 1 for r in self._log if r[7] > recorded_at), len(self._log))

    def head(self) -> Head:
        return Head(self._log[-1][0], self._log[-1][10]) if self._log else GENESIS

    def count_events(self) -> int:
        return len(self._log)

    def streams(self) -> list[StreamHead]:
        return self._current([])

    def _current(self, pending: Sequence[Row]) -> list[StreamHead]:
        """The state index's rows, and the streams with events past its position unlabelled."""
        heads = dict(self._index)
        for row in [*self._log[self._indexed_at :], *pending]:
            heads[row[1]] = StreamHead(row[1], row[2], None, None)
        return [h for _, h in sorted(heads.items())]

    def state_index(self) -> tuple[int, list[StreamHead]]:
        return self._indexed_at, [h for _, h in sorted(self._index.items())]

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        with self._writing():
            self._index = {h.stream_id: h for h in derive()}
            self._indexed_at = len(self._log)

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
        with self._writing():
            if position == 0:
                head_hash = GENESIS_HASH
            elif 0 < position <= len(self._log):
                head_hash = self._log[position - 1][10]
            else:
                raise IntegrityError(f"no event at position {position} to checkpoint", seq=position)
            at = (len(self._checkpoints) + 1, position, head_hash, schema_version, fingerprint)
            record = CheckpointRecord(*at, snapshot, snapshot_digest(snapshot), recorded_at)
            self._checkpoints.append(record)
            self._copies += [StreamSnapshot(*at, s, v, text, snapshot_digest(text)) for s, v, text in streams]
            if index is not None and self._indexed_at <= position:
                self._index, self._indexed_at = {h.stream_id: h for h in index}, position
        return record

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        return sorted((c for c in self._copies if c.checkpoint_id == checkpoint_id), key=lambda c: c.stream_id)

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        copies = [c for c in self._copies if c.stream_id == stream_id]
        return max(copies, key=lambda c: (c.position, c.checkpoint_id), default=None)

    def select_checkpoints(self, *, at_or_before: int | None = None) -> Iterator[CheckpointRecord]:
        records = [c for c in self._checkpoints if at_or_before is None or c.position <= at_or_before]
        yield from sorted(records, key=lambda c: (c.position, c.checkpoint_id), reverse=True)

    # Nothing but this class can change its lists: no guard to lose, no event index, no history to lose.

    def guard_problems(self) -> list[str]:
        return []

    def index_problems(self) -> list[str]:
        return []

    def history_problem(self) -> str | None:
        return None

    def close(self) -> None:
        pass


def _matches(row: Row, q: EventFilter) -> bool:
    """The reference meaning of `EventFilter` (the SQL backends' queries must agree)."""
    seq, stream_id, _, _, type_name, _, payload, recorded_at, actor, _, _ = row
    return (
        seq > q.after
        and (q.before is None or seq < q.before)
        and (q.since is None or recorded_at >= q.since)
        and (q.until is None or recorded_at <= q.until)
        and (not q.types or type_name in q.types)
        and (q.stream_id is None or stream_id == q.stream_id)
        and (q.actor is None or actor == q.actor)
        and (not q.payload or any(_payload_holds(type_name, payload, m) for m in q.payload))
    )


def _payload_holds(type_name: str, payload: str, m: PayloadMatch) -> bool:
    if type_name != m.type:
        return False
    value: Any = orjson.loads(payload)
    for key in m.path.removeprefix("$.").split("."):
        if not isinstance(value, dict) or key not in value:
            return False
        value = value[key]
    return value == m.value or (isinstance(value, list) and m.value in value)
