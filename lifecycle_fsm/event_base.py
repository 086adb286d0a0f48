"""What every domain event shares: the base class, the stream names, strict payload reads (kept apart
so `events.py` and `candidate_events.py` need not import each other)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from lifecycle_fsm.errors import InputError
from lifecycle_fsm.json_types import JSON

LEDGER_STREAM = "ledger"
SEALS_STREAM = "seals"
NAMED_STREAMS = (LEDGER_STREAM, SEALS_STREAM)  # addressed by their own name, never a candidate id
CANDIDATE_PREFIX = "candidate:"


def flag(payload: Mapping[str, Any], key: str) -> bool:
    """A boolean field read strictly."""
    value = payload[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def stream_of(candidate_id: str) -> str:
    """The stream that holds one candidate's events (InputError for an id that is not text a store can hold)."""
    if not isinstance(candidate_id, str):
        raise InputError(f"a candidate id is a string, not {type(candidate_id).__name__} ({candidate_id!r})")
    if not candidate_id.isascii() or "\x00" in candidate_id:
        text_or_error("candidate id", candidate_id)
    return CANDIDATE_PREFIX + candidate_id


def text_or_error(what: str, value: str) -> str:
    """`value`, or InputError for a lone surrogate (not UTF-8) or a NUL (PostgreSQL text cannot hold one)."""
    try:
        value.encode()
    except UnicodeEncodeError:
        raise InputError(f"{what} {value!r} is not valid Unicode text (it holds a lone surrogate)") from None
    if "\x00" in value:
        raise InputError(f"{what} {value!r} holds a NUL character, which no {what} can")
    return value


def candidate_id_of(stream_id: str) -> str | None:
    """The candidate a stream belongs to, or None for any other stream."""
    return stream_id.removeprefix(CANDIDATE_PREFIX) if stream_id.startswith(CANDIDATE_PREFIX) else None


@attrs.frozen
class Event:
    """Base of every domain event."""

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1

    def to_payload(self) -> JSON:
        """The fields as a shallow dict: what the store canonicalises and chains."""
        return attrs.asdict(self, recurse=False)
