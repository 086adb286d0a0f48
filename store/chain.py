"""Canonical encoding and the sha256 hash chain over the log.

An event's hash is sha256 of `prev_hash "\\n" header "\\n" payload`: `header` is the canonical JSON
(sorted keys, compact, UTF-8) of the columns `actor, event_id, recorded_at, schema_version, seq,
stream_id, type, version`, `payload` the stored canonical JSON text; the first `prev_hash` is
`GENESIS_HASH`. Editing a row breaks its hash; removing or reordering rows breaks the next link.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import math
import operator
import re
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

import orjson

from lifecycle_fsm.errors import InputError, IntegrityError
from lifecycle_fsm.store.records import ChainReport, Head, NewEvent, Row

GENESIS_HASH = "0" * 64
GENESIS = Head(0, GENESIS_HASH)  # the head of an empty log
_NOT_A_HASH = "not a hash: a column is not text"  # what `event_hash` gives for a row no hash can match
# The form the ledger stores times in (UTC, microseconds): the one in which text order is time order.
STORED_TIME = "[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}[.][0-9]{6}Z"
_STORED_TIME = re.compile(STORED_TIME)


# How far ahead of a writer's clock the head's time may be and still be taken on (lock waits, clock skew).
STAMP_LEAD = dt.timedelta(minutes=5)
# How a walk says a row's time is not in the ledger's form (every hash may still hold).
TIME_FORM_BREAK = "is not a UTC time in the ledger's form"


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON; refuses non-finite floats, which orjson would write as null."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as e:
        raise InputError(f"payload is not JSON-serialisable: {e}") from e
    if b"null" in out:  # orjson writes NaN and infinities as null: only then look for them
        _refuse_non_finite(value)
    return out.decode()


def _refuse_non_finite(value: Any) -> None:
    """Walk the containers iteratively; scalars are judged where they stand (this runs per event)."""
    stack: list[Any] = [[value]]
    while stack:
        item = stack.pop()
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is str or kind is int or kind is bool or child is None:
                continue
            if kind is dict or kind is list or kind is tuple:
                stack.append(child)
            elif isinstance(child, float) and not math.isfinite(child):
                raise InputError(f"payload holds a non-finite number ({child}); JSON cannot carry it")


def _header(
    actor: str, event_id: str, recorded_at: str, schema_version: int, seq: int, stream_id: str, type: str, version: int
) -> bytes:
    return orjson.dumps(
        {
            "actor": actor,
            "event_id": event_id,
            "recorded_at": recorded_at,
            "schema_version": schema_version,
            "seq": seq,
            "stream_id": stream_id,
            "type": type,
            "version": version,
        }
    )  # written in sorted key order already


def event_hash(
    prev_hash: str,
    seq: int,
    stream_id: str,
    version: int,
    event_id: str,
    type: str,
    schema_version: int,
    payload: str,
    recorded_at: str,
    actor: str,
) -> str:
    """The chain hash of one event (module docstring); `_NOT_A_HASH` for a column that is not text (a
    BLOB written by hand cannot be what was hashed: the row reads as edited)."""
    try:
        header = _header(actor, event_id, recorded_at, schema_version, seq, stream_id, type, version)
        return hashlib.sha256(b"\n".join((prev_hash.encode(), header, payload.encode()))).hexdigest()
    except (TypeError, AttributeError):
        return _NOT_A_HASH


def snapshot_digest(text: str) -> str:
    """The sha256 a checkpoint's snapshot (or a stream's copy of its state) is stored with."""
    return hashlib.sha256(text.encode()).hexdigest()


def stamped(given: str, head: str) -> str:
    """The time an event is stored with after one stored at `head`: the head's when later by at most
    `STAMP_LEAD`, both in the ledger's form; else the given time (`postgres_schema.STAMPED` in SQL)."""
    if type(head) is not str or type(given) is not str or head <= given:  # the common case; a BLOB is no time
        return given
    if _STORED_TIME.fullmatch(head) and _STORED_TIME.fullmatch(given) and head <= stamp_limit(given):
        return head
    return given


def stamp_limit(given: str) -> str:
    """The latest head time an event stamped at `given` takes on ("" when `given` is no real moment)."""
    try:
        moment = dt.datetime.fromisoformat(given.removesuffix("Z"))
    except (ValueError, AttributeError):
        return ""
    try:
        return (moment + STAMP_LEAD).strftime("%Y-%m-%dT%H:%M:%S.%fZ")
    except OverflowError:  # within STAMP_LEAD of the end of year 9999
        return "9999-12-31T23:59:59.999999Z"


def header_parts(
    actor: str, event_id: str, recorded_at: str, schema_version: int, stream_id: str, type: str, version: int
) -> tuple[str, str, str, str]:
    """`event_hash`'s header cut around the time and seq PostgreSQL's append fills in under its lock: the
    text before the time's JSON value, that value, the text up to the seq's value, and the rest. (No
    string value can hold `,"seq":0,` or `,"schema_version":`: its quotes would be escaped.)"""
    header = _header(actor, event_id, recorded_at, schema_version, 0, stream_id, type, version).decode()
    head, after = header.split(',"seq":0,', 1)
    middle = head.rindex(',"schema_version":')
    time = orjson.dumps(recorded_at).decode()
    return head[: middle - len(time)], time, head[middle:] + ',"seq":', "," + after


def chain_rows(
    head: Head, stream_id: str, expected_version: int, events: Sequence[NewEvent], *, stamp: bool = True
) -> list[Row]:
    """The rows that append `events` after `head` (every backend's); `stamp=False` keeps each time as given."""
    rows: list[Row] = []
    seq, prev_hash, version, at = head.seq, head.hash, expected_version, head.recorded_at
    for e in events:
        seq += 1
        version += 1
        at = stamped(e.recorded_at, at) if stamp else e.recorded_at
        payload = canonical_json(e.payload)
        row = (seq, stream_id, version, e.event_id, e.type, e.schema_version, payload, at, e.actor)
        digest = event_hash(prev_hash, *row)
        rows.append((*row, prev_hash, digest))
        prev_hash = digest
    return rows


def row_hash_error(seq: int) -> IntegrityError:
    return IntegrityError(
        f"seq {seq}: stored hash does not match the event's content (edited in place?); run `lifecycle verify`",
        seq=seq,
    )


# The events table's columns, in the order every read of a whole row selects them.
EVENT_COLUMNS = "seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor, prev_hash, hash"
# The columns a fold reads, and a getter that picks them out of a whole row.
FOLD_COLUMNS = "seq, stream_id, version, type, schema_version, payload"
fold_columns = operator.itemgetter(*(EVENT_COLUMNS.split(", ").index(c) for c in FOLD_COLUMNS.split(", ")))


class ChainWalk:
    """The one walk over rows in seq order: each row's own hash, and from a known start its position and
    link; it hands on the sound rows and keeps the first break (`bad_seq`, `reason`).

    `start=None`: a slice with no known predecessor (own hashes only). `hashes=False`: positions and
    links only (workers check the hashes). `times=True`: a time not in the ledger's form is a break.
    """

    def __init__(
        self,
        batches: Iterable[Sequence[Row]],
        *,
        start: Head | None = GENESIS,
        hashes: bool = True,
        times: bool = False,
    ) -> None:
        self._batches = iter(batches)
        self._links = start is not None
        self._hashes = hashes
        self._times = times
        self._seq, self._hash = (start.seq, start.hash) if start is not None else (0, GENESIS_HASH)
        self._pending: list[Row] = []
        self.seen = 0
        self.bad_seq: int | None = None
        self.reason: str | None = None

    def rows(self, to: int | None = None) -> Iterator[list[Row]]:
        """The sound rows in batches, up to seq `to` (the rest waits for the next call)."""
        while True:
            rows, self._pending = self._pending, []
            if not rows and not (rows := self._next_batch()):
                return
            if to is not None and rows[-1][0] > to:
                cut = sum(1 for row in rows if row[0] <= to)
                self._pending = rows[cut:]
                if cut:
                    yield rows[:cut]
                return
            yield rows

    def fold_batches(self, to: int | None = None) -> Iterator[list[Row]]:
        """`rows`, as the fold's columns."""
        for rows in self.rows(to):
            yield list(map(fold_columns, rows))

    def finish(self) -> None:
        """Walk the rest without handing it on (after a reader stopped early)."""
        self._pending = []
        while self._next_batch():
            pass

    def report(self, *, count: Callable[[], int], head: Callable[[], Head]) -> ChainReport:
        """The verdict once the walk is done; `count` and `head` are asked only to describe a break."""
        if self.reason is not None:
            return ChainReport(False, count(), head(), bad_seq=self.bad_seq, reason=self.reason)
        return ChainReport(True, self.seen, Head(self._seq, self._hash))

    def _next_batch(self) -> list[Row]:
        """The next batch's rows before the first break (empty at the end, or once broken)."""
        if self.reason is not None:
            return []
        rows = next(self._batches, None)
        if not rows:
            return []
        links, hashes, times, last, prev = self._links, self._hashes, self._times, self._seq, self._hash
        for n, row in enumerate(rows):
            seq, link, digest = row[0], row[9], row[10]
            if links and seq != last + 1:
                reason = f"gap in positions: seq {seq} follows seq {last}"
            elif links and link != prev:
                reason = "prev_hash does not match the previous event's hash"
            elif hashes and event_hash(link, *row[:9]) != digest:
                reason = "stored hash does not match the event's content"
            elif times and not _STORED_TIME.fullmatch(row[7]):
                reason = f"recorded_at {row[7]!r} {TIME_FORM_BREAK}"
            else:
                last, prev = seq, digest
                continue
            self.bad_seq, self.reason = seq, reason
            rows = rows[:n]
            break
        self._seq, self._hash = last, prev
        self.seen += len(rows)
        return list(rows)


def check_rows(
    batches: Iterable[Sequence[Row]], *, error: Callable[[int], Exception] = row_hash_error
) -> Iterator[list[Row]]:
    """Fold columns of rows whose own hash holds (any slice); `error(seq)` at the first that does not."""
    walk = ChainWalk(batches, start=None)
    yield from walk.fold_batches()
    if walk.bad_seq is not None:
        raise error(walk.bad_seq)
