"""The opaque records a store keeps: events to append, stored events, checkpoints.

The store never looks inside a payload; it canonicalises it, chains it and hands it
back. Domain meaning (types, schema versions, upcasting) belongs to `lifecycle_fsm`.

The records are plain slotted classes (`Record`), not attrs classes: they are not
domain objects, and a read that imports attrs and builds its ~10 classes paid ~0.3x
the interpreter's own start-up for it (issue #13; `lifecycle status ID` imports no
attrs). They keep attrs' frozen semantics: positional and keyword construction,
equality (same class, same values) and hashing by value, a refused assignment
(`AttributeError`), `repr`, `__match_args__`, pickling, weak references and subclassing;
`replace()` / `astuple()` stand in for `attrs.evolve` / `attrs.astuple`.
"""

from __future__ import annotations

from typing import Any, Self

__all__ = [
    "ChainReport",
    "CheckpointRecord",
    "EventFilter",
    "Head",
    "NewEvent",
    "PayloadMatch",
    "Record",
    "StoredEvent",
    "StreamHead",
    "StreamSnapshot",
]

_set = object.__setattr__  # how a frozen record's `__init__` writes its slots (attrs does the same)


class Record:
    """A frozen value: `__slots__` names its fields, in order; each subclass writes its own `__init__`.

    Each subclass spells out its `__init__` signature (type checkers check every call against
    it) and sets its fields with `_fill`; `StoredEvent` and `NewEvent`, built once per event
    read or appended, set theirs one by one.
    """

    __slots__: tuple[str, ...] = ("__weakref__",)
    __match_args__: tuple[str, ...] = ()
    _fields: tuple[str, ...] = ()  # every field, bases' first: a subclass may add none (`__slots__ = ()`)

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        own = tuple(name for name in cls.__dict__.get("__slots__", ()) if name != "__weakref__")
        cls._fields = (*cls._fields, *own)
        cls.__match_args__ = cls._fields  # type: ignore[misc]  # the fields, in order

    def _fill(self, *values: Any) -> None:
        """Set every field, in `_fields` order (a subclass's `__init__` takes them in that order)."""
        for name, value in zip(self._fields, values, strict=True):
            _set(self, name, value)

    def astuple(self) -> tuple[Any, ...]:
        """The field values, in order (what `attrs.astuple` gave)."""
        return tuple(getattr(self, name) for name in self._fields)

    def replace(self, **changes: Any) -> Self:
        """A copy with `changes` (what `attrs.evolve` did for these records)."""
        return type(self)(**{name: getattr(self, name) for name in self._fields} | changes)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot set {name!r}")

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f"{type(self).__name__} is frozen: cannot delete {name!r}")

    def __eq__(self, other: object) -> bool:
        if other.__class__ is not self.__class__:
            return NotImplemented
        return self.astuple() == other.astuple()

    def __hash__(self) -> int:
        return hash((self.__class__.__qualname__, *self.astuple()))

    def __repr__(self) -> str:
        fields = ", ".join(f"{name}={getattr(self, name)!r}" for name in self._fields)
        return f"{self.__class__.__qualname__}({fields})"

    def __reduce__(self) -> tuple[type[Record], tuple[Any, ...]]:
        return self.__class__, self.astuple()


class NewEvent(Record):
    """An event a writer wants appended; the store assigns seq, version and hash."""

    __slots__ = ("stream_id", "type", "schema_version", "payload", "event_id", "recorded_at", "actor")
    stream_id: str
    type: str
    schema_version: int
    payload: dict[str, Any]
    event_id: str
    recorded_at: str
    actor: str

    def __init__(
        self,
        stream_id: str,
        type: str,
        schema_version: int,
        payload: dict[str, Any],
        event_id: str,
        recorded_at: str,
        actor: str,
    ) -> None:
        _set(self, "stream_id", stream_id)
        _set(self, "type", type)
        _set(self, "schema_version", schema_version)
        _set(self, "payload", payload)
        _set(self, "event_id", event_id)
        _set(self, "recorded_at", recorded_at)
        _set(self, "actor", actor)


class StoredEvent(Record):
    """One row of the log, exactly as stored; `payload` is the canonical JSON text."""

    __slots__ = (
        "seq",
        "stream_id",
        "version",
        "event_id",
        "type",
        "schema_version",
        "payload",
        "recorded_at",
        "actor",
        "prev_hash",
        "hash",
    )
    seq: int
    stream_id: str
    version: int
    event_id: str
    type: str
    schema_version: int
    payload: str
    recorded_at: str
    actor: str
    prev_hash: str
    hash: str

    def __init__(
        self,
        seq: int,
        stream_id: str,
        version: int,
        event_id: str,
        type: str,
        schema_version: int,
        payload: str,
        recorded_at: str,
        actor: str,
        prev_hash: str,
        hash: str,
    ) -> None:
        _set(self, "seq", seq)
        _set(self, "stream_id", stream_id)
        _set(self, "version", version)
        _set(self, "event_id", event_id)
        _set(self, "type", type)
        _set(self, "schema_version", schema_version)
        _set(self, "payload", payload)
        _set(self, "recorded_at", recorded_at)
        _set(self, "actor", actor)
        _set(self, "prev_hash", prev_hash)
        _set(self, "hash", hash)


class Head(Record):
    """The last position of the log and its hash (seq 0 and the genesis hash when empty)."""

    __slots__ = ("seq", "hash")
    seq: int
    hash: str

    def __init__(self, seq: int, hash: str) -> None:
        self._fill(seq, hash)


class StreamHead(Record):
    """A stream's current version and the opaque labels its writer attached to it."""

    __slots__ = ("stream_id", "version", "status", "category")
    stream_id: str
    version: int
    status: str | None
    category: str | None

    def __init__(self, stream_id: str, version: int, status: str | None, category: str | None) -> None:
        self._fill(stream_id, version, status, category)


class CheckpointRecord(Record):
    """A snapshot of folded state at a global position, with what it was built from."""

    __slots__ = (
        "checkpoint_id",
        "position",
        "head_hash",
        "schema_version",
        "fingerprint",
        "snapshot",
        "snapshot_sha256",
        "recorded_at",
    )
    checkpoint_id: int
    position: int
    head_hash: str
    schema_version: int
    fingerprint: str
    snapshot: str
    snapshot_sha256: str
    recorded_at: str

    def __init__(
        self,
        checkpoint_id: int,
        position: int,
        head_hash: str,
        schema_version: int,
        fingerprint: str,
        snapshot: str,
        snapshot_sha256: str,
        recorded_at: str,
    ) -> None:
        self._fill(
            checkpoint_id, position, head_hash, schema_version, fingerprint, snapshot, snapshot_sha256, recorded_at
        )


class StreamSnapshot(Record):
    """One stream's folded state inside a checkpoint: a shortcut for reading one stream."""

    __slots__ = (
        "checkpoint_id",
        "position",
        "head_hash",
        "schema_version",
        "fingerprint",
        "stream_id",
        "version",
        "state",
        "state_sha256",
    )
    checkpoint_id: int
    position: int
    head_hash: str
    schema_version: int
    fingerprint: str
    stream_id: str
    version: int
    state: str
    state_sha256: str

    def __init__(
        self,
        checkpoint_id: int,
        position: int,
        head_hash: str,
        schema_version: int,
        fingerprint: str,
        stream_id: str,
        version: int,
        state: str,
        state_sha256: str,
    ) -> None:
        self._fill(
            checkpoint_id, position, head_hash, schema_version, fingerprint, stream_id, version, state, state_sha256
        )


class ChainReport(Record):
    """The result of re-hashing the whole chain; `bad_seq` is the first broken position."""

    __slots__ = ("ok", "events", "head", "bad_seq", "reason")
    ok: bool
    events: int
    head: Head
    bad_seq: int | None
    reason: str | None

    def __init__(
        self, ok: bool, events: int, head: Head, bad_seq: int | None = None, reason: str | None = None
    ) -> None:
        self._fill(ok, events, head, bad_seq, reason)


class PayloadMatch(Record):
    """An event of `type` whose payload holds `value` at `path`, or an array at `path` holding it.

    `path` names object keys only (`$.reason_codes`, `$.artifact.error`); the store
    compares JSON strings and never looks further into what they mean.
    """

    __slots__ = ("type", "path", "value")
    type: str
    path: str
    value: str

    def __init__(self, type: str, path: str, value: str) -> None:
        self._fill(type, path, value)


class EventFilter(Record):
    """Which events `EventStore.select_matching` returns: every given condition holds.

    Positions are exclusive (`after < seq < before`), times inclusive
    (`since <= recorded_at <= until`, compared as the stored UTC text, so pass them in
    the stored form `YYYY-MM-DDTHH:MM:SS.ffffffZ`). Empty `types` and `payload` mean any;
    `payload` matches when any one of its `PayloadMatch`es does. `limit` keeps the first
    N in seq order.
    """

    __slots__ = ("after", "before", "since", "until", "types", "stream_id", "actor", "payload", "limit")
    after: int
    before: int | None
    since: str | None
    until: str | None
    types: tuple[str, ...]
    stream_id: str | None
    actor: str | None
    payload: tuple[PayloadMatch, ...]
    limit: int | None

    def __init__(
        self,
        after: int = 0,
        before: int | None = None,
        since: str | None = None,
        until: str | None = None,
        types: tuple[str, ...] = (),
        stream_id: str | None = None,
        actor: str | None = None,
        payload: tuple[PayloadMatch, ...] = (),
        limit: int | None = None,
    ) -> None:
        self._fill(after, before, since, until, types, stream_id, actor, payload, limit)
