"""What `--as-of`, `--since` and `--until` mean: a position in the log, or a time.

A bare integer is a seq (`20261130` is a seq, not a date). A time is ISO 8601 (naive: UTC), brought to
the stored form (UTC, microseconds, `Z`) and compared as text; it stands for the log up to the event
before the first one recorded after it (`EventStore.position_at`).
"""

from __future__ import annotations

import datetime as dt

from lifecycle_fsm.errors import InputError, NotFoundError
from lifecycle_fsm.limits import MAX_INT64
from lifecycle_fsm.store.base import EventStore

__all__ = ["AsOf", "not_yet", "parse_as_of", "parse_seq", "parse_time", "position_of"]

AsOf = int | str  # a seq, or a UTC time in the stored form


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
