"""The opaque records a store keeps: events to append, stored events, checkpoints.

The store never looks inside a payload; domain meaning belongs to `lifecycle_fsm`."""

from __future__ import annotations

from typing import Any

import attrs

# One stored event as the reads hand it on, in `StoredEvent` field order: the fold and the chain
# walk read millions of these, and a tuple costs a fraction of a record object.
Row = tuple[Any, ...]


@attrs.frozen
class NewEvent:
    """An event a writer wants appended; the store assigns seq, version and hash."""

    stream_id: str
    type: str
    schema_version: int
    payload: dict[str, Any]
    event_id: str
    recorded_at: str
    actor: str


@attrs.frozen
class StoredEvent:
    """One row of the log, exactly as stored; `payload` is the canonical JSON text."""

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


@attrs.frozen
class AppendResult:
    """What an append wrote; `duplicate` when it was a retry of an identical append."""

    events: tuple[StoredEvent, ...]
    duplicate: bool = False


@attrs.frozen
class Head:
    """The last position of the log and its hash (seq 0 and the genesis hash when empty).

    `recorded_at` (the last event's time, read to stamp an append after it) takes no part in equality."""

    seq: int
    hash: str
    recorded_at: str = attrs.field(default="", eq=False)


@attrs.frozen
class StreamHead:
    """A stream's current version and the opaque labels its writer attached to it."""

    stream_id: str
    version: int
    status: str | None
    category: str | None


@attrs.frozen
class CheckpointRecord:
    """A snapshot of folded state at a global position, with what it was built from."""

    checkpoint_id: int
    position: int
    head_hash: str
    schema_version: int
    fingerprint: str
    snapshot: str
    snapshot_sha256: str
    recorded_at: str


@attrs.frozen
class StreamSnapshot:
    """One stream's folded state inside a checkpoint: a shortcut for reading one stream."""

    checkpoint_id: int
    position: int
    head_hash: str
    schema_version: int
    fingerprint: str
    stream_id: str
    version: int
    state: str
    state_sha256: str


@attrs.frozen
class ChainReport:
    """The result of re-hashing the whole chain; `bad_seq` is the first broken position."""

    ok: bool
    events: int
    head: Head
    bad_seq: int | None = None
    reason: str | None = None


@attrs.frozen
class PayloadMatch:
    """An event of `type` whose payload holds `value` at `path` (object keys only, `$.a.b`), or an array
    there holding it; the store compares JSON strings only."""

    type: str
    path: str
    value: str


@attrs.frozen
class EventFilter:
    """Which events `EventStore.select_rows` returns: every given condition holds.

    Positions are exclusive (`after < seq < before`), times inclusive and compared as the stored UTC
    text (`YYYY-MM-DDTHH:MM:SS.ffffffZ`). Empty `types` and `payload` mean any; `payload` matches when
    any one of its `PayloadMatch`es does. `limit` keeps the first N in seq order."""

    after: int = 0
    before: int | None = None
    since: str | None = None
    until: str | None = None
    types: tuple[str, ...] = ()
    stream_id: str | None = None
    actor: str | None = None
    payload: tuple[PayloadMatch, ...] = ()
    limit: int | None = None

    def positions_only(self) -> bool:
        """Whether only positions (and a limit) are asked: a plain slice of the log."""
        return (self.since, self.until, self.stream_id, self.actor) == (None, None, None, None) and not (
            self.types or self.payload
        )


ALL_EVENTS = EventFilter()


@attrs.frozen
class StreamShare:
    """The streams a fold read keeps (one of `verify`'s workers): those in `names`, or with `others`,
    every stream but those."""

    names: frozenset[str]
    others: bool = False

    def holds(self, stream_id: str) -> bool:
        return (stream_id in self.names) != self.others
