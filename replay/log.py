"""The auditor's filtered log (`lifecycle log`): one `EventFilter` the store runs as a single indexed query,
and each event as shown. `--reason CODE` matches the payloads that carry reason codes: checks and hand-offs,
blocking recovery plans (`action`), evidence invalidations (`<cause>_changed`).

What `--as-of`, `--since` and `--until` mean: a position in the log, or a time. A bare integer is a seq
(`20261130` is a seq, not a date). A time is ISO 8601 (naive: UTC), brought to the stored form (UTC,
microseconds, `Z`) and compared as text; it stands for the log up to the event before the first one
recorded after it (`EventStore.position_at`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from lifecycle_fsm.candidate_events import CANDIDATE_EVENTS, EVENT_TYPES
from lifecycle_fsm.errors import InputError, IntegrityError, NotFoundError
from lifecycle_fsm.events import CANDIDATE_PREFIX, NAMED_STREAMS, stream_of, text_or_error
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import MAX_INT64
from lifecycle_fsm.rules import BLOCKING_ACTIONS, FRESHNESS_CHECKS
from lifecycle_fsm.state import reading_stored
from lifecycle_fsm.store.base import EventStore, hash_at, select_events
from lifecycle_fsm.store.chain import GENESIS_HASH
from lifecycle_fsm.store.records import EventFilter, PayloadMatch, StoredEvent
from lifecycle_fsm.upcasting import decoded_payload, dense_versions

AsOf = int | str  # a seq, or a UTC time in the stored form

_CHECK_CODES = (*FRESHNESS_CHECKS, "artifact", "rollback", "path_escapes_root", "upstream_reject", "upstream_state")
_CAUSES = ("baseline", "evaluation", "window")  # of an invalidation: its reason code is `<cause>_changed`


def _reason_matches(code: str) -> tuple[PayloadMatch, ...]:
    cause = code.removesuffix("_changed")
    if code in _CHECK_CODES:
        return tuple(PayloadMatch(t, "$.reason_codes", code) for t in ("ChecksRecorded", "HandoffDecided"))
    if code in BLOCKING_ACTIONS:
        return (PayloadMatch("RecoveryPlanned", "$.action", code),)
    if code.endswith("_changed") and cause in _CAUSES:
        return (PayloadMatch("EvidenceInvalidated", "$.cause", cause),)
    known = (*_CHECK_CODES, *sorted(BLOCKING_ACTIONS), *(f"{c}_changed" for c in _CAUSES))
    raise InputError(f"unknown reason code {code!r} (one of {', '.join(known)})")


def log_filter(
    *,
    after: int = 0,
    before: int | None = None,
    since: str | None = None,
    until: str | None = None,
    types: tuple[str, ...] = (),
    stream: str | None = None,
    actor: str | None = None,
    reason: str | None = None,
    limit: int | None = None,
) -> EventFilter:
    """The store query for `log`'s options; an unknown type or reason code is refused, not an empty answer."""
    unknown = [t for t in types if t not in EVENT_TYPES]
    if unknown:
        raise InputError(f"unknown event type {unknown[0]!r} (one of {', '.join(sorted(EVENT_TYPES))})")
    stream_id = None
    if stream is not None:
        stream_id = stream if stream in NAMED_STREAMS or stream.startswith(CANDIDATE_PREFIX) else stream_of(stream)
        text_or_error("stream", stream_id)  # bytes that are not UTF-8 reach no driver (its encode error)
    if actor is not None:
        text_or_error("actor", actor)
    return EventFilter(
        after=after,
        before=before,
        since=since,
        until=until,
        types=types,
        stream_id=stream_id,
        actor=actor,
        payload=() if reason is None else _reason_matches(reason),
        limit=limit,
    )


@contextmanager
def known_stream(store: EventStore, query: EventFilter, given: str | None) -> Iterator[None]:
    """Read `query` inside this: a `--stream` with no event at all (in any range) is NotFoundError (exit 4),
    never an empty answer that reads as "nothing happened to it", judged in the snapshot the query then
    reads. `ledger` and `seals` are always known and, like a log without `--stream`, hold no snapshot."""
    if query.stream_id is None or query.stream_id in NAMED_STREAMS:
        yield
        return
    with store.read_snapshot():
        if store.stream_version(query.stream_id) == 0:
            raise NotFoundError(
                f"unknown stream: {given!r} (no candidate has that id; the ledger's own streams are "
                f"{' and '.join(repr(s) for s in NAMED_STREAMS)})"
            )
        yield


def event_reasons(event: StoredEvent, payload: JSON) -> list[str]:
    """The reason codes an event carries (what `--reason` matches), by its class's own rule."""
    cls = CANDIDATE_EVENTS.get(event.type)
    if cls is None:
        return []
    with reading_stored(event.seq, event.type):  # reason_codes of the wrong type: that row's corruption
        return list(cls.reasons(payload, ()))


def event_json(event: StoredEvent, payload: JSON, *, stream: bool = True) -> JSON:
    """One event as `log --json` shows it; without its stream (`stream=False`) as `history --json` does."""
    return {
        "seq": event.seq,
        **({"stream_id": event.stream_id} if stream else {}),
        "version": event.version,
        "type": event.type,
        "recorded_at": event.recorded_at,
        "actor": event.actor,
        "event_id": event.event_id,
        "payload": payload,
    }


def read_log(store: EventStore, query: EventFilter) -> Iterator[tuple[StoredEvent, JSON]]:
    """The selected events with their decoded payloads, each row's hash checked first (fail closed). A slice
    of the log (no filter but positions and a limit) is also checked as a chain, from the row at `after` to
    `before` (or the head): a deleted row is an `IntegrityError` naming the seq, not a silent hole."""
    filtered = query.since or query.until or query.types or query.actor or query.payload
    if filtered:
        rows: Iterable[StoredEvent] = select_events(store, query)
    elif query.stream_id is not None:  # one stream's slice: its versions go on one by one
        rows = dense_versions(select_events(store, query), after_version=0 if query.after == 0 else None)
    else:
        rows = _chained(store, query)
    for event in rows:
        yield event, decoded_payload(event)


def _chained(store: EventStore, query: EventFilter) -> Iterator[StoredEvent]:
    """A slice of the whole log, each row checked to follow the one before it."""
    # (seq, hash) the next row must follow. No row at `after` (past the head, or itself the missing
    # one): the first row is not judged against it, every later one is.
    follows: tuple[int, str | None] = (query.after, GENESIS_HASH if query.after == 0 else hash_at(store, query.after))
    shown = 0
    for event in select_events(store, query):
        if follows[1] is not None and (event.seq != follows[0] + 1 or event.prev_hash != follows[1]):
            raise _hole(follows[0], event.seq)
        follows = (event.seq, event.hash)
        shown += 1
        yield event
    end = None if query.before is None else min(query.before - 1, store.head().seq)  # where the slice must reach
    if end is not None and follows[0] < end and (query.limit is None or shown < query.limit):
        raise _hole(follows[0], None)


def _hole(after: int, found: int | None) -> IntegrityError:
    """The row after seq `after` is missing or was replaced (`found`: the next row read, if any)."""
    then = "" if found is None else f" (the next row read is seq {found})"
    return IntegrityError(
        f"the log does not go on from seq {after}: seq {after + 1} is missing or was replaced{then}; "
        "run `lifecycle verify`",
        seq=after + 1,
    )


def parse_time(text: str) -> str:
    """An ISO 8601 time as the stored UTC text; InputError if it is not one."""
    try:
        moment = dt.datetime.fromisoformat(text.strip())
    except ValueError:
        raise InputError(f"not an ISO 8601 time: {text!r} (e.g. 2026-11-30T12:00:00Z)") from None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=dt.UTC)
    try:
        utc = moment.astimezone(dt.UTC)
    except OverflowError:  # e.g. 0001-01-01T00:00:00+01:00: before year 1 in UTC
        raise InputError(f"{text!r} is outside the years 1 to 9999 once in UTC") from None
    return utc.isoformat(timespec="microseconds").replace("+00:00", "Z")


def parse_seq(text: str, option: str = "--as-of") -> int:
    """A seq given as `option`'s value: ASCII digits, 0 to int64 max (InputError otherwise)."""
    stripped = text.strip()
    digits = stripped.removeprefix("-")
    if not (digits.isascii() and digits.isdigit()):  # str.isdigit alone takes "²", which int() refuses
        raise InputError(f"{option} {text}: not a seq (a whole number from 0)")
    significant = digits.lstrip("0") or "0"  # int() refuses 4300+ digits; a seq has at most 19
    if stripped.startswith("-") and significant != "0":
        raise InputError(f"{option} {text}: a seq is a whole number from 0 (0: before the first event)")
    if len(significant) > 19 or int(significant) > MAX_INT64:
        raise InputError(f"{option} {text}: no seq is that large")
    return int(significant)


def parse_as_of(text: str) -> AsOf:
    """A seq (plain ASCII digits) or a time (anything else); a signed number is refused as a seq."""
    stripped = text.strip()
    if stripped.isascii() and stripped.isdigit():
        return parse_seq(text)
    if stripped[:1] in ("-", "+") and stripped[1:].isascii() and stripped[1:].isdigit():
        raise InputError(
            f"--as-of {stripped}: a seq is a whole number from 0, written in plain digits "
            "(or give an ISO 8601 time, e.g. 2026-11-30T12:00:00Z)"
        )
    return parse_time(stripped)


def position_of(store: EventStore, as_of: AsOf | None, *, option: str = "--as-of") -> int:
    """The log position an as-of stands for (the head when None). A seq past the head is refused (a typo
    must not read as "nothing happened since"); a time after the last event is the head."""
    head = store.head().seq
    if as_of is None:
        return head
    if isinstance(as_of, int):
        if as_of > head:
            raise InputError(f"{option} {as_of} is past the head of the log (seq {head})")
        return as_of
    return store.position_at(as_of)


def not_yet(candidate_id: str, as_of: AsOf, position: int) -> NotFoundError:
    """A candidate with no event in the log as of `as_of` (a seq or a time), which stands for `position`."""
    when = f"seq {as_of}" if isinstance(as_of, int) else f"{as_of} (the log up to seq {position})"
    return NotFoundError(
        f"unknown candidate: {candidate_id!r} as of {when}: none of its events yet", candidate_id=candidate_id
    )
