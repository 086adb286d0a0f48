"""The store's records are plain slotted classes with the value semantics attrs gave them.

Equality and hashing by value (same class only), refused assignment, positional and keyword
construction with defaults, `repr`, `__match_args__`, pickling and `replace`: what code
and embedders relied on when they were `@attrs.frozen` classes.
"""

from __future__ import annotations

import copy
import inspect
import pickle
import weakref

import pytest

from lifecycle_fsm.store.base import AppendResult
from lifecycle_fsm.store.records import (
    ChainReport,
    CheckpointRecord,
    EventFilter,
    Head,
    NewEvent,
    PayloadMatch,
    Record,
    StoredEvent,
    StreamHead,
    StreamSnapshot,
)


def stored(seq: int = 1, **changes: object) -> StoredEvent:
    fields = dict(seq=seq, stream_id="candidate:a", version=1, event_id="e1", type="T", schema_version=1,
                  payload="{}", recorded_at="2026-01-01T00:00:00.000000Z", actor="me", prev_hash="0" * 64,
                  hash="f" * 64)  # fmt: skip
    return StoredEvent(**(fields | changes))  # type: ignore[arg-type]


SAMPLES: list[Record] = [
    NewEvent("candidate:a", "T", 1, {"k": 1}, "e1", "2026-01-01T00:00:00.000000Z", "me"),
    stored(),
    Head(3, "a" * 64),
    StreamHead("candidate:a", 2, "received", "grpo"),
    CheckpointRecord(1, 10, "a" * 64, 1, "fp", "{}", "b" * 64, "2026-01-01T00:00:00.000000Z"),
    StreamSnapshot(1, 10, "a" * 64, 1, "fp", "candidate:a", 2, "{}", "b" * 64),
    ChainReport(True, 3, Head(3, "a" * 64)),
    PayloadMatch("ChecksRecorded", "$.reason_codes", "artifact"),
    EventFilter(after=2, types=("T",)),
    AppendResult((stored(),)),
]


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_a_record_is_a_frozen_value(record: Record) -> None:
    """Equal to a copy of itself, not to another class with the same values; no assignment, no new attribute."""
    twin = type(record)(*record.astuple())
    assert twin == record
    assert (twin != record) is False
    assert record != tuple(record.astuple())
    assert record.__eq__(object()) is NotImplemented
    name = type(record)._fields[0]
    with pytest.raises(AttributeError, match="frozen"):
        setattr(record, name, None)
    with pytest.raises(AttributeError, match="frozen"):
        delattr(record, name)
    with pytest.raises(AttributeError):
        record.not_a_field = 1  # type: ignore[attr-defined]
    assert not hasattr(record, "__dict__")
    assert pickle.loads(pickle.dumps(record)) == record
    assert copy.copy(record) == record
    assert type(record).__match_args__ == type(record)._fields
    assert repr(record).startswith(f"{type(record).__name__}({name}=")


@pytest.mark.parametrize("record", SAMPLES, ids=lambda r: type(r).__name__)
def test_init_takes_the_fields_in_slots_order(record: Record) -> None:
    """`__init__`'s parameters are `__slots__`, in order (what `_fill` and positional construction rely on)."""
    assert tuple(inspect.signature(type(record)).parameters) == type(record)._fields
    assert type(record)(*record.astuple()).astuple() == record.astuple()


def test_records_hash_by_value_like_attrs_did() -> None:
    assert Head(1, "x") != AppendResult(1, "x")  # type: ignore[arg-type]  # same values, another class
    assert hash(Head(1, "x")) == hash(Head(1, "x"))
    assert len({Head(1, "x"), Head(1, "x"), Head(2, "x")}) == 2
    assert {stored(): 1}[stored()] == 1
    with pytest.raises(TypeError):  # a dict payload is unhashable, as it was
        hash(SAMPLES[0])


def test_construction_by_keyword_with_defaults_and_replace() -> None:
    assert EventFilter() == EventFilter(0, None, None, None, (), None, None, (), None)
    assert ChainReport(ok=False, events=2, head=Head(2, "h"), bad_seq=2).reason is None
    assert AppendResult(()).duplicate is False
    assert repr(Head(1, "x")) == "Head(seq=1, hash='x')"
    with pytest.raises(TypeError):
        Head(1)  # type: ignore[call-arg]
    moved = stored().replace(seq=9, actor="you")
    assert (moved.seq, moved.actor, moved.hash) == (9, "you", "f" * 64)
    assert stored().replace() == stored()
    with pytest.raises(TypeError):
        stored().replace(no_such_field=1)


def test_match_by_position() -> None:
    match Head(4, "h"):
        case Head(seq, digest):
            assert (seq, digest) == (4, "h")
        case _:  # pragma: no cover
            pytest.fail("no match")


def test_a_subclass_keeps_its_bases_fields_and_records_take_weak_references() -> None:
    """A subclass that adds no field (`__slots__ = ()`) is built, compared, shown and pickled with its base's
    fields; every record can be weakly referenced (attrs' slotted classes could)."""
    head = _MyHead(4, "h")
    assert head.astuple() == (4, "h") and type(head).__match_args__ == ("seq", "hash")
    assert head == _MyHead(4, "h") and head != _MyHead(5, "h") and head != Head(4, "h")
    assert repr(head) == "_MyHead(seq=4, hash='h')"
    assert pickle.loads(pickle.dumps(head)) == head
    assert weakref.ref(head)() is head


class _MyHead(Head):
    __slots__ = ()
