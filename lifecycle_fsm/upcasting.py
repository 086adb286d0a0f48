"""Reading stored events: each row's own hash checked, its payload parsed strictly and brought forward one
schema version at a time by the upcasters registered under `(type, from_version)` (named
`upcast_<type>_v<N>_v<N+1>`). An unknown type or version is a `CorruptionError`, never a guess.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable, Iterator

import orjson

from lifecycle_fsm.candidate_events import EVENT_TYPES
from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import Event
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.store.chain import event_hash, row_hash_error
from lifecycle_fsm.store.records import StoredEvent

Upcaster = Callable[[JSON], JSON]


def derived_ledger_id(first_event_hash: str) -> str:
    """The ledger id of a ledger made before ids existed: derived (domain-tagged) from its first event's hash,
    so every read on every machine derives the same id."""
    return hashlib.sha256(b"lifecycle-fsm/ledger-id/v1\n" + first_event_hash.encode()).hexdigest()[:32]


def upcast_ledger_initialized_v1_v2(payload: JSON, event_hash: str | None = None) -> JSON:
    """v2 carries `ledger_id`, derived from this event's stored hash (None when the caller has no row: the fold)."""
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
    if schema_version > cls.SCHEMA_VERSION:
        raise CorruptionError(
            f"{type_name} schema version {schema_version} is newer than this code knows ({cls.SCHEMA_VERSION})",
            seq=seq,
            found=schema_version,
        )
    for version in range(schema_version, cls.SCHEMA_VERSION):
        if (row_step := ROW_UPCASTERS.get((type_name, version))) is not None:
            payload = row_step(payload, event_hash)
        elif (step := UPCASTERS.get((type_name, version))) is not None:
            payload = step(payload)
        else:
            raise CorruptionError(
                f"no upcaster for {type_name} schema version {version}", seq=seq, found=schema_version
            )
    return payload


def parsed_payload(seq: int, type_name: str, schema_version: int, text: str, *, event_hash: str | None = None) -> JSON:
    """A stored payload as a dict at this code's schema version, or the error naming its row."""
    try:
        payload: JSON = orjson.loads(text)
    except (orjson.JSONDecodeError, TypeError) as e:
        raise CorruptionError(f"seq {seq}: {type_name} payload is not JSON ({e})", seq=seq) from e
    if type(payload) is not dict:
        raise CorruptionError(f"seq {seq}: {type_name} payload is not an object", seq=seq)
    if CURRENT_VERSIONS.get(type_name) != schema_version:
        payload = upcast(type_name, schema_version, payload, seq=seq, event_hash=event_hash)
    return payload


def decoded_payload(event: StoredEvent) -> JSON:
    """A stored payload, its row checked, parsed and upcast to the current schema version."""
    check_row(event)
    return parsed_payload(event.seq, event.type, event.schema_version, event.payload, event_hash=event.hash)


def decoded_event(event: StoredEvent) -> Event:
    """A stored event as its domain event (its row checked, parsed, upcast once, fields checked)."""
    payload = decoded_payload(event)  # first: a row edited in place is refused before its type is looked up
    return event_from_payload(event.type, CURRENT_VERSIONS[event.type], payload, seq=event.seq)


def check_row(event: StoredEvent) -> None:
    """Fail closed on a row edited in place: its own hash must match its columns (no chain walk).

    Every read that decodes a stored event passes here. A row re-hashed by hand keeps its own hash but
    breaks the next row's link: `verify` (the whole chain) and a sealed or pinned head catch that.
    """
    e = event
    columns = (e.seq, e.stream_id, e.version, e.event_id, e.type, e.schema_version, e.payload, e.recorded_at, e.actor)
    if event_hash(e.prev_hash, *columns) != e.hash:
        raise edited_row_error(e.seq)


def dense_versions(events: Iterable[StoredEvent], *, after_version: int | None = 0) -> Iterator[StoredEvent]:
    """One stream's events, passed on as they come, while its versions go on one by one.

    A row deleted from a stream, or moved to another by editing its `stream_id` (then never read, so no
    hash of it is checked), leaves a hole a stream read would otherwise print around. `after_version`:
    the version the first row must follow (0: from the stream's start; None: not known).
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
