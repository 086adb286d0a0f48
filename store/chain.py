"""Canonical encoding and the sha256 hash chain over the log.

Each event's hash is sha256 over a byte string that anyone can rebuild from the
stored columns without parsing the payload:

    prev_hash "\\n" header "\\n" payload

`header` is the canonical JSON (sorted keys, no spaces, UTF-8) of
`{"actor", "event_id", "recorded_at", "schema_version", "seq", "stream_id", "type",
"version"}` and `payload` is the payload's stored canonical JSON text. The first
event's `prev_hash` is `GENESIS_HASH` (64 zeros). Editing any column of any row
breaks that row's hash; removing or reordering rows breaks the next row's link.
"""

from __future__ import annotations

import hashlib
import math
import operator
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

import orjson

from lifecycle_fsm.store.errors import DuplicateEventError, InputError, IntegrityError
from lifecycle_fsm.store.records import ChainReport, Head, NewEvent, StoredEvent

GENESIS_HASH = "0" * 64
NOT_A_HASH = "not a hash: a column is not text"  # what `chain_hash` gives for a row no hash can match


def canonical_json(value: Any) -> str:
    """Sorted-key compact JSON; refuses non-finite floats, which orjson would write as null."""
    return canonical_json_bytes(value).decode()


def canonical_json_bytes(value: Any) -> bytes:
    """`canonical_json` as the UTF-8 bytes the chain hashes (the append path needs both)."""
    try:
        out = orjson.dumps(value, option=orjson.OPT_SORT_KEYS)
    except TypeError as e:
        raise InputError(f"payload is not JSON-serialisable: {e}") from e
    if b"null" in out:  # orjson writes NaN and infinities as null: only then look for them
        _refuse_non_finite(value)
    return out


def _refuse_non_finite(value: Any) -> None:
    """Walk containers only: scalars are skipped without being pushed (this is per event)."""
    stack = [value]
    while stack:
        item = stack.pop()
        kind = type(item)
        if kind is dict:
            children = item.values()
        elif kind is list or kind is tuple:
            children = item
        else:
            _check_float(item)
            continue
        for child in children:
            child_kind = type(child)
            if child_kind is str or child_kind is int or child_kind is bool or child is None:
                continue
            if child_kind is dict or child_kind is list or child_kind is tuple:
                stack.append(child)
            else:
                _check_float(child)


def _check_float(item: Any) -> None:
    if isinstance(item, float) and not math.isfinite(item):
        raise InputError(f"payload holds a non-finite number ({item}); JSON cannot carry it")


def event_hash(
    *,
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
    """The chain hash of one event (see the module docstring for the exact bytes)."""
    return chain_hash(prev_hash, seq, stream_id, version, event_id, type, schema_version, payload, recorded_at, actor)


def chain_hash(
    prev_hash: str,
    seq: int,
    stream_id: str,
    version: int,
    event_id: str,
    type_name: str,
    schema_version: int,
    payload: str,
    recorded_at: str,
    actor: str,
) -> str:
    """`event_hash` with positional arguments, for the append and verify hot paths.

    A stored column that is not text (a BLOB written with the sqlite3 shell: the same bytes, another
    storage class) cannot be what was hashed: the answer is `NOT_A_HASH`, which no stored hash equals,
    so every caller reports that row as edited (exit 6 naming its seq), never a TypeError.
    """
    try:
        header = orjson.dumps(
            {
                "actor": actor,
                "event_id": event_id,
                "recorded_at": recorded_at,
                "schema_version": schema_version,
                "seq": seq,
                "stream_id": stream_id,
                "type": type_name,
                "version": version,
            }
        )  # keys are written in sorted order already: no sort option needed
        return hashlib.sha256(b"\n".join((prev_hash.encode(), header, payload.encode()))).hexdigest()
    except (TypeError, AttributeError):
        return NOT_A_HASH


def rehash(event: StoredEvent, prev_hash: str) -> str:
    """Recompute a stored event's hash given the hash that should precede it."""
    return chain_hash(
        prev_hash, event.seq, event.stream_id, event.version, event.event_id, event.type,
        event.schema_version, event.payload, event.recorded_at, event.actor,
    )  # fmt: skip


def check_batch(stream_id: str, events: Sequence[NewEvent]) -> None:
    """Every backend's first check on an append: one stream per append, and every column of the
    right type. A column is hashed as the value given but stored as text (SQLite), so an event id
    of `5` would be stored as `"5"` under a hash of `5`: a sound append that breaks the chain
    for good. PostgreSQL refused it as a driver error; both refuse it here, before anything."""
    for e in events:
        if e.stream_id != stream_id:
            raise InputError("every event of one append must belong to its stream")
        try:  # one concatenation: a TypeError unless every text column is a str (the batch hot path)
            text = e.stream_id + e.type + e.event_id + e.recorded_at + e.actor
        except TypeError:
            raise InputError(f"event {e.event_id!r}: {_wrong_column(e)}") from None
        if (not text.isascii() and not _encodable(text)) or "\0" in text:
            raise InputError(f"event {e.event_id!r}: {_wrong_column(e)}")
        if (
            type(e.schema_version) is not int
            or not 0 < e.schema_version < _MAX_SCHEMA_VERSION
            or not isinstance(e.payload, dict)
        ):
            raise InputError(f"event {e.event_id!r}: {_wrong_column(e)}")


def _encodable(text: str) -> bool:
    """Valid Unicode text, which UTF-8 can carry (a lone surrogate cannot)."""
    try:
        text.encode()
    except UnicodeEncodeError:
        return False
    return True


_MAX_SCHEMA_VERSION = 2**31  # PostgreSQL stores it as an integer: every backend keeps the same range


def _wrong_column(e: NewEvent) -> str:
    """Which column of an event is wrong (said only on the way to an error)."""
    for name in ("stream_id", "type", "event_id", "recorded_at", "actor"):
        value = getattr(e, name)
        if not isinstance(value, str):
            return f"{name} must be a string, not {type(value).__name__}"
        if not _encodable(value):
            return f"{name} is not valid Unicode text (it holds a lone surrogate)"
        if "\0" in value:
            return f"{name} holds a NUL character, which PostgreSQL text cannot store"
    if type(e.schema_version) is not int:
        return f"schema_version must be an int, not {type(e.schema_version).__name__}"
    if not 0 < e.schema_version < _MAX_SCHEMA_VERSION:
        return f"schema_version must be 1 to {_MAX_SCHEMA_VERSION - 1}, not {e.schema_version}"
    return f"payload must be a JSON object (a dict), not {type(e.payload).__name__}"


def chain_rows(head: Head, stream_id: str, expected_version: int, events: Sequence[NewEvent]) -> list[tuple[Any, ...]]:
    """The rows (in `StoredEvent` field order) that append `events` after `head`.

    Every backend builds its rows here, so the chain is the same whatever stores it. The
    batch hot path: `chain_hash` inlined (the bytes of the module docstring, built the
    same way), the payload serialised once and hashed as those bytes, locals only.
    """
    rows: list[tuple[Any, ...]] = []
    seq, prev_hash = head.seq, head.hash
    version = expected_version
    dumps, sha256, to_bytes = orjson.dumps, hashlib.sha256, canonical_json_bytes
    for new in events:
        version += 1
        seq += 1
        payload = to_bytes(new.payload)
        event_id, type_name, schema_version, recorded_at, actor = (
            new.event_id, new.type, new.schema_version, new.recorded_at, new.actor
        )  # fmt: skip
        header = dumps(
            {"actor": actor, "event_id": event_id, "recorded_at": recorded_at, "schema_version": schema_version,
             "seq": seq, "stream_id": stream_id, "type": type_name, "version": version}
        )  # fmt: skip
        digest = sha256(b"%s\n%s\n%s" % (prev_hash.encode(), header, payload)).hexdigest()
        rows.append(
            (seq, stream_id, version, event_id, type_name, schema_version,
             payload.decode(), recorded_at, actor, prev_hash, digest)
        )  # fmt: skip
        prev_hash = digest
    return rows


def match_retry(events: Sequence[NewEvent], stored: Mapping[str, StoredEvent]) -> tuple[StoredEvent, ...] | None:
    """The stored copies when `events` were appended before (a retry), None when none were.

    Some ids taken, or the same ids with other content, is `DuplicateEventError`: not
    a retry, and not a conflict worth retrying either.
    """
    if not stored:
        return None
    found = [stored.get(e.event_id) for e in events]
    for new, old in zip(events, found, strict=True):
        same = old is not None and (
            old.stream_id == new.stream_id
            and old.type == new.type
            and old.schema_version == new.schema_version
            and old.payload == canonical_json(new.payload)
        )
        if not same:
            taken = min(stored.values(), key=lambda e: e.seq)
            raise DuplicateEventError(
                f"event id {taken.event_id!r} is already at seq {taken.seq}; this batch differs from that append",
                event_id=taken.event_id,
                seq=taken.seq,
            )
    return tuple(old for old in found if old is not None)


def verify_rows(
    batches: Iterable[Sequence[Sequence[Any]]], *, count: Callable[[], int], head: Callable[[], Head]
) -> ChainReport:
    """`verify_events` in one pass over whole rows (in `StoredEvent` field order), in batches.

    The hot path of `verify_chain`: no record objects, locals only, each hash through
    `chain_hash` (the one definition of the hashed bytes). `count` and `head` are asked
    for only when a break is reported (the walk itself counts the events and finds the
    head), so a sound log is read once.
    """
    prev_seq, prev_hash = 0, GENESIS_HASH
    for rows in batches:
        prev_seq, prev_hash, bad_seq, reason = _walk(rows, prev_seq, prev_hash)
        if reason is not None:
            return ChainReport(False, count(), head(), bad_seq=bad_seq, reason=reason)
    return ChainReport(True, prev_seq, Head(prev_seq, prev_hash))


def _walk(rows: Sequence[Sequence[Any]], prev_seq: int, prev_hash: str) -> tuple[int, str, int | None, str | None]:
    """Check one batch of whole rows after `(prev_seq, prev_hash)`: positions, links, hashes.

    Returns the last sound position and hash, and the first break (seq, reason) or None.
    The seq is dense from 1, so the last sound seq is also the number of sound rows.
    """
    hash_of = chain_hash
    for seq, stream_id, version, event_id, kind, schema, payload, recorded_at, actor, link, digest in rows:
        if seq != prev_seq + 1:
            return prev_seq, prev_hash, seq, f"gap in positions: seq {seq} follows seq {prev_seq}"
        if link != prev_hash:
            return prev_seq, prev_hash, seq, "prev_hash does not match the previous event's hash"
        if hash_of(link, seq, stream_id, version, event_id, kind, schema, payload, recorded_at, actor) != digest:
            return prev_seq, prev_hash, seq, "stored hash does not match the event's content"
        prev_seq, prev_hash = seq, digest
    return prev_seq, prev_hash, None, None


# A whole row's fold columns `(seq, stream_id, version, type, schema_version, payload)`, picked
# in C (`list(map(...))` per batch): no tuple built by bytecode per row.
_fold_columns = operator.itemgetter(0, 1, 2, 4, 5, 6)


def check_rows(
    batches: Iterable[Sequence[Sequence[Any]]], *, error: Callable[[int], Exception] | None = None
) -> Iterator[list[tuple[Any, ...]]]:
    """Whole rows in, fold rows `(seq, stream_id, version, type, schema_version, payload)` out,
    each row's own hash recomputed first (no chain walk: the rows may be any slice of the log).

    What reads that print state fold through: a row edited in place raises `error(seq)`
    (default `row_hash_error`, an `IntegrityError` naming the seq) before anything is
    built from it.
    """
    fail = row_hash_error if error is None else error
    hash_of = chain_hash
    fold_columns = _fold_columns
    for rows in batches:
        for seq, stream_id, version, event_id, kind, schema, payload, recorded_at, actor, link, digest in rows:
            if hash_of(link, seq, stream_id, version, event_id, kind, schema, payload, recorded_at, actor) != digest:
                raise fail(seq)
        yield list(map(fold_columns, rows))


def row_hash_error(seq: int) -> IntegrityError:
    """What a read raises for a row whose own hash does not match its columns."""
    return IntegrityError(
        f"seq {seq}: stored hash does not match the event's content (edited in place?); run `lifecycle verify`",
        seq=seq,
    )


class ChainWalk:
    """One pass over the whole log: positions, links and hashes checked, fold rows handed on.

    `verify` folds the rows this walk has just checked instead of reading the log a
    second time: `fold_batches(to=P)` yields the checked rows up to seq P (the rest of
    a batch waits for the next call), and ends early at the first break, which
    `report` then names. Nothing unchecked is ever handed on.
    """

    def __init__(self, batches: Iterable[Sequence[Sequence[Any]]]) -> None:
        self._batches = iter(batches)
        self._pending: list[tuple[Any, ...]] = []
        self._seq, self._hash = 0, GENESIS_HASH
        self._seen = 0
        self.bad_seq: int | None = None
        self.reason: str | None = None

    def fold_batches(self, to: int | None = None) -> Iterator[list[tuple[Any, ...]]]:
        """The checked rows `(seq, stream_id, version, type, schema_version, payload)` up to `to`."""
        while True:
            rows, self._pending = self._pending, []
            if not rows:
                rows = self._checked_batch()
                if not rows:
                    return
            if to is not None and rows[-1][0] > to:
                cut = max(0, to - rows[0][0] + 1)  # a checked batch is contiguous in seq
                self._pending = rows[cut:]
                if cut:
                    yield rows[:cut]
                return
            yield rows

    def finish(self) -> None:
        """Check the rest of the log without handing it on (after the fold stopped early)."""
        self._pending = []
        while self._checked_batch():
            pass

    def report(self, *, count: Callable[[], int], head: Callable[[], Head]) -> ChainReport:
        """The chain's verdict once the walk is done (`finish` first if the fold stopped early)."""
        if self.reason is not None:
            return ChainReport(False, count(), head(), bad_seq=self.bad_seq, reason=self.reason)
        return ChainReport(True, self._seen, Head(self._seq, self._hash))

    def _checked_batch(self) -> list[tuple[Any, ...]]:
        """The next batch's rows up to the first break (empty at the end or after a break)."""
        if self.reason is not None:
            return []
        rows = next(self._batches, None)
        if rows is None:
            return []
        first = self._seq + 1
        self._seq, self._hash, bad_seq, reason = _walk(rows, self._seq, self._hash)
        if reason is not None:
            self.bad_seq, self.reason = bad_seq, reason
        sound = self._seq - first + 1  # the batch's rows before any break (dense seqs from `first`)
        self._seen += sound
        return list(map(_fold_columns, rows if sound == len(rows) else rows[:sound]))


def verify_events(events: Iterable[StoredEvent], *, count: int, head: Head) -> ChainReport:
    """Walk a log in seq order: positions, links and hashes; report the first break."""
    prev = Head(0, GENESIS_HASH)
    seen = 0
    for event in events:
        seen += 1
        reason = None
        if event.seq != prev.seq + 1:
            reason = f"gap in positions: seq {event.seq} follows seq {prev.seq}"
        elif event.prev_hash != prev.hash:
            reason = "prev_hash does not match the previous event's hash"
        elif rehash(event, prev.hash) != event.hash:
            reason = "stored hash does not match the event's content"
        if reason is not None:
            return ChainReport(False, count, head, bad_seq=event.seq, reason=reason)
        prev = Head(event.seq, event.hash)
    return ChainReport(True, seen, prev)
