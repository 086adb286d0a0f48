"""Reading stored events written by older code: named upcasters, strict versions.

A stored payload at an older `schema_version` is brought forward one version at a
time by functions registered in `UPCASTERS` under `(type, from_version)` and named
`upcast_<type>_v<N>_v<N+1>`. An unknown type, a version with no path forward or a
version newer than this code is a `CorruptionError`, never a guess.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

import orjson

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import EVENT_TYPES, Event
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.store.chain import event_hash, row_hash_error
from lifecycle_fsm.store.records import StoredEvent

__all__ = [
    "CURRENT_VERSIONS",
    "ROW_UPCASTERS",
    "UPCASTERS",
    "Upcaster",
    "check_row",
    "edited_row_error",
    "decoded_event",
    "decoded_payload",
    "dense_versions",
    "event_from_payload",
    "upcast",
    "derived_ledger_id",
    "upcast_ledger_initialized_v1_v2",
]

Upcaster = Callable[[JSON], JSON]


def derived_ledger_id(first_event_hash: str) -> str:
    """The ledger id of a ledger made before ids existed: fixed by its first event's hash.

    Deterministic, so every read (and every machine) derives the same id; domain-tagged,
    so it is not the hash itself.
    """
    return hashlib.sha256(b"lifecycle-fsm/ledger-id/v1\n" + first_event_hash.encode()).hexdigest()[:32]


def upcast_ledger_initialized_v1_v2(payload: JSON, event_hash: str | None = None) -> JSON:
    """v2 carries `ledger_id`; a v1 ledger's id is derived from this event's stored hash.

    The first upcaster that needs the stored row, not only the payload: callers that
    decode a whole `StoredEvent` pass its hash. The fold (which never reads the id)
    passes none and gets None.
    """
    return {**payload, "ledger_id": None if event_hash is None else derived_ledger_id(event_hash)}


# (type, from_version) -> function returning the payload at from_version + 1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}
# Upcasters that also read the stored event's hash (the row, not only its payload).
ROW_UPCASTERS: dict[tuple[str, int], Callable[[JSON, str | None], JSON]] = {
    ("LedgerInitialized", 1): upcast_ledger_initialized_v1_v2,
}
CURRENT_VERSIONS: dict[str, int] = {name: cls.SCHEMA_VERSION for name, cls in EVENT_TYPES.items()}


def upcast(
    type_name: str, schema_version: int, payload: JSON, *, seq: int | None = None, event_hash: str | None = None
) -> JSON:
    """Bring a stored payload up to the current schema version, or fail loudly."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise CorruptionError(f"unknown event type {type_name!r}", seq=seq, found=type_name)
    if not isinstance(schema_version, int) or isinstance(schema_version, bool):
        raise CorruptionError(f"{type_name} schema version {schema_version!r} is not an integer", seq=seq)
    version = schema_version
    while version < cls.SCHEMA_VERSION:
        step = UPCASTERS.get((type_name, version))
        row_step = ROW_UPCASTERS.get((type_name, version))
        if row_step is not None:
            payload = row_step(payload, event_hash)
            version += 1
            continue
        if step is None:
            raise CorruptionError(
                f"no upcaster for {type_name} schema version {version}", seq=seq, found=schema_version
            )
        payload = step(payload)
        version += 1
    if version != cls.SCHEMA_VERSION:
        raise CorruptionError(
            f"{type_name} schema version {schema_version} is newer than this code knows ({cls.SCHEMA_VERSION})",
            seq=seq,
            found=schema_version,
        )
    return payload


def decoded_payload(event: StoredEvent) -> JSON:
    """A stored payload, parsed and upcast to the current schema version."""
    return upcast(event.type, event.schema_version, _parsed(event), seq=event.seq, event_hash=event.hash)


def decoded_event(event: StoredEvent) -> Event:
    """A stored event as its domain event (parsed, upcast once, fields checked)."""
    return event_from_payload(event.type, event.schema_version, _parsed(event), seq=event.seq, event_hash=event.hash)


def check_row(event: StoredEvent) -> None:
    """Fail closed on a row edited in place: its own hash must match its columns (no chain walk).

    Every read that decodes a stored event passes here, so `status`, `explain`,
    `history` and `log` never show a state built from a row they could not trust. A row
    re-hashed by hand keeps its own hash but breaks the next row's link: `verify` (the
    whole chain) and a sealed or pinned head catch that.
    """
    e = event
    if (
        event_hash(
            e.prev_hash,
            e.seq,
            e.stream_id,
            e.version,
            e.event_id,
            e.type,
            e.schema_version,
            e.payload,
            e.recorded_at,
            e.actor,
        )
        != e.hash
    ):
        raise edited_row_error(e.seq)


def dense_versions(events: Iterable[StoredEvent], *, after_version: int | None = 0) -> Iterator[StoredEvent]:
    """One stream's events, passed on as they come, while its versions go on one by one.

    A stream's versions are dense from 1, so a row deleted from it, or moved to another stream by
    editing its `stream_id` (the row is then simply not read: no hash of it is ever checked), leaves
    a hole that a stream read would otherwise print around. `after_version` is the version the first
    row must follow (0: the stream from its start; None: a slice whose start is not known).
    """
    previous = after_version
    for e in events:
        if previous is not None and e.version != previous + 1:
            raise CorruptionError(
                f"seq {e.seq}: {e.stream_id} version {e.version} follows version {previous}: version "
                f"{previous + 1} is missing or was moved to another stream; run `lifecycle verify`",
                seq=e.seq,
            )
        previous = e.version
        yield e


def edited_row_error(seq: int) -> CorruptionError:
    """What a read raises for a row whose own hash does not match its columns (exit 6)."""
    return CorruptionError(str(row_hash_error(seq)), seq=seq)


def _parsed(event: StoredEvent) -> JSON:
    check_row(event)
    try:
        payload = orjson.loads(event.payload)
    except orjson.JSONDecodeError as e:
        raise CorruptionError(f"seq {event.seq}: {event.type} payload is not JSON ({e})", seq=event.seq) from e
    if not isinstance(payload, dict):
        raise CorruptionError(f"seq {event.seq}: {event.type} payload is not an object", seq=event.seq)
    return payload


def event_from_payload(
    type_name: str, schema_version: int, payload: JSON, *, seq: int | None = None, event_hash: str | None = None
) -> Event:
    """Rebuild a typed event from a stored payload (upcast first); strict about fields."""
    current = upcast(type_name, schema_version, payload, seq=seq, event_hash=event_hash)
    try:
        return EVENT_TYPES[type_name](**current)
    except TypeError as e:
        where = "" if seq is None else f"seq {seq}: "
        raise CorruptionError(f"{where}{type_name} payload does not match its schema: {e}", seq=seq) from e
