"""The reads and writes SQLite and PostgreSQL say the same way, written once with `%s` placeholders.

A backend supplies `_rows` (one read through its error boundary) and `_locked` (a maintenance
transaction under its write lock); its write transaction supplies `_rows` and `_head_and_ids`."""

from __future__ import annotations

import contextlib
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Sequence
from contextlib import AbstractContextManager
from typing import Any, Protocol, Self

from lifecycle_fsm.errors import IntegrityError, StoreError
from lifecycle_fsm.store.base import WriteTransaction
from lifecycle_fsm.store.chain import EVENT_COLUMNS, GENESIS, GENESIS_HASH, snapshot_digest
from lifecycle_fsm.store.records import (
    CheckpointRecord,
    EventFilter,
    Head,
    Row,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)

STREAM = f"SELECT {EVENT_COLUMNS} FROM events WHERE stream_id = %s AND version > %s ORDER BY version"
VERSION = "SELECT coalesce(max(version), 0) FROM events WHERE stream_id = %s"
# The state index (`streams`) is derived, written whole at a checkpoint and on a rebuild, never by a
# commit; its position is the last seq among the events its rows stand at (empty: 0, without the join).
_STATE_INDEX_POSITION = (
    "(CASE WHEN EXISTS (SELECT 1 FROM streams) THEN (SELECT coalesce(max(e.seq), 0) FROM streams s "
    "JOIN events e ON e.stream_id = s.stream_id AND e.version = s.version) ELSE 0 END)"
)
# Every stream at its current version: the index's rows, and those with events past its position unlabelled.
_STREAMS = (
    "SELECT stream_id, version, status, category FROM streams WHERE stream_id NOT IN "
    f"(SELECT stream_id FROM events WHERE seq > {_STATE_INDEX_POSITION}) "
    "UNION ALL SELECT stream_id, max(version), NULL, NULL FROM events "
    f"WHERE seq > {_STATE_INDEX_POSITION} GROUP BY stream_id ORDER BY stream_id"
)
CHECKPOINTS = (
    "SELECT checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, snapshot_sha256, recorded_at "
    "FROM checkpoints"
)
_SNAPSHOTS = (
    "SELECT c.checkpoint_id, c.position, c.head_hash, c.schema_version, c.fingerprint, "
    "s.stream_id, s.version, s.state, s.state_sha256 "
    "FROM checkpoint_streams s JOIN checkpoints c ON c.checkpoint_id = s.checkpoint_id"
)

# The event index: what the auditor's filter looks rows up by (type, actor, recorded_at), kept beside the
# log so a commit writes only the event row; caught up in bulk from its own highest seq (its position),
# and a read covers the rows past it from the log itself.
INDEXED = "(SELECT coalesce(max(seq), 0) FROM event_index)"
CATCH_UP = (
    "INSERT INTO event_index (seq, type, actor, recorded_at) "
    f"SELECT seq, type, actor, recorded_at FROM events WHERE seq > {INDEXED} ORDER BY seq"
)
_BEHIND = f"SELECT coalesce(max(seq), 0) - {INDEXED} FROM events"


def position_at_sql(time: str, *, indexed: bool = False) -> str:
    """`EventStore.position_at` in SQL (also `serve`'s ready_at); `time` is the SQL of the UTC text, used
    twice with `indexed` (the event index up to its position, the log past it)."""
    first_after = f"(SELECT min(seq) FROM events WHERE recorded_at > {time})"
    if indexed:
        first_after = (
            f"(SELECT min(seq) FROM (SELECT min(seq) AS seq FROM event_index WHERE recorded_at > {time} "
            f"UNION ALL SELECT min(seq) FROM events WHERE seq > {INDEXED} AND recorded_at > {time}) AS found)"
        )
    return f"coalesce({first_after} - 1, (SELECT coalesce(max(seq), 0) FROM events))"


Lookup = tuple[str, list[Any]]  # a WHERE term the event index answers, and its parameters


def event_conditions(
    query: EventFilter, seq: str = "seq", payload_types: str = ""
) -> tuple[list[str], list[Any], list[Lookup]]:
    """An `EventFilter`'s WHERE terms on the event's own columns and types, their parameters, and the terms
    the event index answers (type, actor, time); `payload_types` prefixes the payload matches' types term."""
    where = [f"{seq} > %s"]
    params: list[Any] = [query.after]
    looked_up: list[Lookup] = []
    for sql, value in (
        (f"{seq} < %s", query.before),
        ("recorded_at >= %s", query.since),
        ("recorded_at <= %s", query.until),
        ("stream_id = %s", query.stream_id),
        ("actor = %s", query.actor),
    ):
        if value is not None:
            where.append(sql)
            params.append(value)
            if sql.startswith(("recorded_at", "actor")):
                looked_up.append((sql, [value]))
    for types, prefix in ((list(query.types), ""), (sorted({m.type for m in query.payload}), payload_types)):
        if types:
            clause = f"type IN ({', '.join(['%s'] * len(types))})"
            where.append(prefix + clause)
            params += types
            looked_up.append((clause, types))
    return where, params, looked_up


# Index rows that are not their event's columns, and events up to the index's position that it lacks.
_INDEX_WRONG = (
    "SELECT count(*) FROM event_index i LEFT JOIN events e ON e.seq = i.seq "
    "WHERE e.seq IS NULL OR e.type <> i.type OR e.actor <> i.actor OR e.recorded_at <> i.recorded_at"
)
_INDEX_MISSING = f"SELECT (SELECT count(*) FROM events WHERE seq <= {INDEXED}) - (SELECT count(*) FROM event_index)"
_CATCH_UP_AFTER = 512  # a read scans fewer unindexed rows than this rather than take the write lock
# Read under the write lock with the head: whether the log is empty although the ledger knows it had events
# (its first event's hash recorded, a state index row, a checkpoint past 0), and the last checked stream's
# version in the state index (ahead of the log: events removed).
_EMPTIED = (
    "(SELECT NOT EXISTS (SELECT 1 FROM events) AND (EXISTS (SELECT 1 FROM meta WHERE key = 'first_event_hash') "
    "OR EXISTS (SELECT 1 FROM streams) OR EXISTS (SELECT 1 FROM checkpoints WHERE position > 0)))"
)
_STREAM_VERSION = "(SELECT version FROM streams WHERE stream_id = %s)"
# Tables derived from the log: made again (empty) by `replay --full` when dropped by hand.
DERIVED_TABLES = ("streams", "checkpoints", "checkpoint_streams", "event_index")
CHECKPOINTS_ORDER = "checkpoints_position"  # the index a load walks checkpoints newest first by


def derived_table_dropped(where: object, table: str, detail: str) -> StoreError | None:
    if table not in DERIVED_TABLES:
        return None
    repair = "`lifecycle replay --full` makes it again (where the ledger may be written)"
    return StoreError(f"{where}: {detail} (a table derived from the log): {repair}")


HEAD = "SELECT " + ", ".join(
    f"(SELECT {c} FROM events ORDER BY seq DESC LIMIT 1)" for c in ("seq", "hash", "recorded_at")
)
RECORD_FIRST = "INSERT INTO meta (key, value) VALUES ('first_event_hash', %s) ON CONFLICT (key) DO NOTHING"
_HISTORY = (
    "SELECT (SELECT hash FROM events WHERE seq = 1), (SELECT value FROM meta WHERE key = 'first_event_hash'), "
    "(SELECT count(*) FROM events), (SELECT count(*) FROM streams), "
    "(SELECT count(*) FROM checkpoints WHERE position > 0)"
)


class Run(Protocol):
    """A statement run inside `_locked`: its rows (none for a write); `many`: once per row of `params`."""

    def __call__(self, sql: str, params: Sequence[Any] = (), many: bool = False) -> list[Any]: ...


def write_state_index(run: Run, heads: Iterable[StreamHead]) -> None:
    run("DELETE FROM streams")
    rows = [(h.stream_id, h.version, h.status, h.category) for h in heads]
    run("INSERT INTO streams (stream_id, version, status, category) VALUES (%s, %s, %s, %s)", rows, many=True)


def history_damage(emptied: object, indexed: int | None, found: int, stream_id: str) -> str | None:
    """An emptied or shortened log, from `_EMPTIED` and `_STREAM_VERSION` (`indexed`) against the log's
    version (`found`): a new ledger is never re-started over the remains of one emptied by hand."""
    if emptied:
        return "the log is empty, but this ledger recorded events before (it was emptied outside lifecycle)"
    if indexed is not None and indexed > found:
        return (
            f"stream {stream_id!r} is at version {found} in the log but {indexed} in the state index "
            "(events were removed outside lifecycle)"
        )
    return None


class StreamReads(ABC):
    """A stream's events and version, and every stream's, through `_rows`."""

    @abstractmethod
    def _rows(self, sql: str, params: Sequence[Any] = ()) -> list[Any]:
        """The rows of one statement."""

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]:
        return [StoredEvent(*row) for row in self._rows(STREAM, (stream_id, after_version))]

    def stream_version(self, stream_id: str) -> int:
        return int(self._rows(VERSION, (stream_id,))[0][0])

    def streams(self) -> list[StreamHead]:
        return [StreamHead(*row) for row in self._rows(_STREAMS)]


class SQLTransaction(StreamReads, WriteTransaction):
    """An SQL backend's write transaction: the head, versions and history read in one SELECT."""

    @abstractmethod
    def _head_and_ids(self, sql: str, params: Sequence[Any], ids: Sequence[str]) -> tuple[Row, list[Row]]:
        """The one row of `sql`, and the stored rows with these event ids."""

    def _read(
        self, streams: Sequence[str], ids: Sequence[str]
    ) -> tuple[Head, list[int], dict[str, StoredEvent], str | None]:
        versions = "".join(f", ({VERSION})" for _ in streams)
        sql = f"{HEAD}, {_EMPTIED}, {_STREAM_VERSION}{versions}"
        row, stored = self._head_and_ids(sql, [*streams[-1:], *streams], ids)
        seq, digest, at, emptied, indexed, *found = row
        head = Head(seq, digest, at) if seq is not None else GENESIS
        found = [int(v) for v in found]
        damage = history_damage(emptied, indexed, found[-1], streams[-1])
        return head, found, {r[3]: StoredEvent(*r) for r in stored}, damage


class SQLStore(StreamReads):
    """What an SQL backend's store shares."""

    # Whether the ledger has the event index (one opened read-only before a writer upgraded it has not).
    _indexed = True

    @abstractmethod
    def _may_catch_up(self) -> bool:
        """Whether a read may take the write lock to bring the event index up to date first."""

    @abstractmethod
    def _locked(self, what: str) -> AbstractContextManager[Run]:
        """A maintenance transaction under the write lock; `what` names it in a failure."""

    @abstractmethod
    def close(self) -> None:
        """Release the connection (and, for a file, its lock)."""

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def event_by_id(self, event_id: str) -> StoredEvent | None:
        rows = self._rows(f"SELECT {EVENT_COLUMNS} FROM events WHERE event_id = %s", (event_id,))
        return StoredEvent(*rows[0]) if rows else None

    def position_at(self, recorded_at: str) -> int:
        if self._indexed:
            self._catch_up_before_read()
        sql = f"SELECT {position_at_sql('%s', indexed=self._indexed)}"
        return int(self._rows(sql, [recorded_at] * (2 if self._indexed else 1))[0][0])

    def catch_up_index(self) -> None:
        """Bring the event index up to date with the log, in one transaction under the write lock."""
        if self._indexed:
            with self._locked("cannot bring the event index up to date") as run:
                run(CATCH_UP)

    def _catch_up_before_read(self) -> None:
        """Catch the event index up before a read when far behind and this handle may write (the read is
        right either way: it scans the rows past the index)."""
        if self._may_catch_up() and int(self._rows(_BEHIND)[0][0]) >= _CATCH_UP_AFTER:
            with contextlib.suppress(StoreError):  # a role or a file this handle may only read: the read scans on
                self.catch_up_index()

    def index_problems(self) -> list[str]:
        if not self._indexed:
            return []
        wrong, missing = int(self._rows(_INDEX_WRONG)[0][0]), int(self._rows(_INDEX_MISSING)[0][0])
        problems = [f"{wrong} rows are not their event's type, actor and time"] if wrong else []
        return problems + ([f"{missing} events up to its position are missing"] if missing else [])

    def head(self) -> Head:
        rows = self._rows("SELECT seq, hash FROM events ORDER BY seq DESC LIMIT 1")
        return Head(rows[0][0], rows[0][1]) if rows else GENESIS

    def count_events(self) -> int:
        return int(self._rows("SELECT count(*) FROM events")[0][0])

    def state_index(self) -> tuple[int, list[StreamHead]]:
        rows = self._rows("SELECT stream_id, version, status, category FROM streams ORDER BY stream_id")
        return int(self._rows(f"SELECT {_STATE_INDEX_POSITION}")[0][0]), [StreamHead(*row) for row in rows]

    def history_problem(self) -> str | None:
        first, recorded, events, indexed, checkpoints = self._rows(_HISTORY)[0]
        if recorded is not None and first != recorded:
            held = "no events" if not events else f"a first event of hash {first}"
            return (
                f"the log holds {held}, but this ledger's first event was recorded as {recorded}: "
                "it was emptied or replaced outside lifecycle"
            )
        if not events and (indexed or checkpoints):
            return (
                f"the log holds no events, but the state index lists {indexed} streams and there are "
                f"{checkpoints} checkpoints: it was emptied outside lifecycle"
            )
        return None

    def rebuild_stream_index(self, derive: Callable[[], Iterable[StreamHead]]) -> None:
        """Also rebuilds the event index from the log: both are derived, and rebuilt together."""
        with self._locked("cannot rebuild the stream index") as run:
            write_state_index(run, derive())
            if self._indexed:
                run("DELETE FROM event_index")
                run(CATCH_UP)

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
        digest = snapshot_digest(snapshot)
        with self._locked("cannot store the checkpoint") as run:
            if self._indexed:  # a checkpoint is where the event index catches up, in the same transaction
                run(CATCH_UP)
            if index is not None and int(run(f"SELECT {_STATE_INDEX_POSITION}")[0][0]) <= position:
                write_state_index(run, index)  # and the state index, to the checkpoint's state
            found = run("SELECT hash FROM events WHERE seq = %s", (position,))
            if not found and position != 0:
                raise IntegrityError(f"no event at position {position} to checkpoint", seq=position)
            head_hash = found[0][0] if found else GENESIS_HASH
            record = (position, head_hash, schema_version, fingerprint, snapshot, digest, recorded_at)
            columns = "position, head_hash, schema_version, fingerprint, snapshot, snapshot_sha256, recorded_at"
            run(f"INSERT INTO checkpoints ({columns}) VALUES (%s, %s, %s, %s, %s, %s, %s)", record)
            checkpoint_id = int(run("SELECT max(checkpoint_id) FROM checkpoints")[0][0])  # ours: locked
            copies = [(checkpoint_id, s, v, text, snapshot_digest(text)) for s, v, text in streams]
            into = "checkpoint_streams (checkpoint_id, stream_id, version, state, state_sha256)"
            run(f"INSERT INTO {into} VALUES (%s, %s, %s, %s, %s)", copies, many=True)
        return CheckpointRecord(checkpoint_id, *record)

    def stream_snapshots(self, checkpoint_id: int) -> list[StreamSnapshot]:
        rows = self._rows(f"{_SNAPSHOTS} WHERE s.checkpoint_id = %s ORDER BY s.stream_id", (checkpoint_id,))
        return [StreamSnapshot(*row) for row in rows]

    def latest_stream_snapshot(self, stream_id: str) -> StreamSnapshot | None:
        sql = f"{_SNAPSHOTS} WHERE s.stream_id = %s ORDER BY c.position DESC, c.checkpoint_id DESC LIMIT 1"
        rows = self._rows(sql, (stream_id,))
        return StreamSnapshot(*rows[0]) if rows else None
