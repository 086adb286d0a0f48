"""Domain events: small frozen records, in the past tense, carrying their evidence.

Here: the base every event shares, the stream names, strict payload reads, and the ledger's and the
seals' events; a candidate's events, and the registry of every type, live in `candidate_events.py`. An
event at an older `SCHEMA_VERSION` is upcast on read (`upcasting.py`); handlers read payloads strictly.
"""

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


@attrs.frozen
class LedgerEvent(Event):
    """An event of the ledger's own stream; `settle` says which settings it changes."""

    @classmethod
    def settle(cls, settings: Any, payload: Mapping[str, Any]) -> JSON:
        """The `LedgerSettings` fields this event sets, given the settings before it (every concrete class says)."""
        raise TypeError(f"{cls.__name__} does not say which settings it changes")  # pragma: no cover


@attrs.frozen
class LedgerInitialized(LedgerEvent):
    """The ledger's freshness settings were fixed; v2 adds `ledger_id` (random at `init`, what a seal
    signs so it cannot be replayed onto another ledger; `seals` reads it from the first event)."""

    TYPE: ClassVar[str] = "LedgerInitialized"
    SCHEMA_VERSION: ClassVar[int] = 2
    max_window_age: int
    active_window: int
    ledger_id: str | None = None  # None: derived from this event's hash (`seals.ledger_id_of`)

    @classmethod
    def settle(cls, settings: Any, payload: Mapping[str, Any]) -> JSON:
        return {
            "initialized": True,
            "max_window_age": payload["max_window_age"],
            "active_window": payload["active_window"],
        }


@attrs.frozen
class BaselineActivated(LedgerEvent):
    """An SFT baseline became the active policy; its adapter sha256 is the policy version."""

    TYPE: ClassVar[str] = "BaselineActivated"
    policy_version: str
    previous_policy_version: str | None
    manifest_path: str
    manifest_sha256: str
    adapter_path: str
    adapter_sha256: str
    adapter_actual_sha256: str | None
    adapter_error: str | None
    adapter_tree: JSON | None = None  # the adapter folder's per-file listing at activation (None: a file)

    @classmethod
    def settle(cls, settings: Any, payload: Mapping[str, Any]) -> JSON:
        if not isinstance(payload["policy_version"], str):
            raise ValueError("policy_version must be a string")
        baseline = dict(payload)
        return {"baseline": baseline, "baselines": settings.baselines | {baseline["policy_version"]: baseline}}


@attrs.frozen
class WindowAdvanced(LedgerEvent):
    """The active rollout window moved on; online evidence ages by the difference."""

    TYPE: ClassVar[str] = "WindowAdvanced"
    active_window: int
    previous_window: int

    @classmethod
    def settle(cls, settings: Any, payload: Mapping[str, Any]) -> JSON:
        return {"active_window": payload["active_window"]}


@attrs.frozen
class EvaluationActivated(LedgerEvent):
    """A new evaluation version became the one candidates must name."""

    TYPE: ClassVar[str] = "EvaluationActivated"
    evaluation_version: str
    previous_evaluation_version: str | None

    @classmethod
    def settle(cls, settings: Any, payload: Mapping[str, Any]) -> JSON:
        return {"evaluation_version": payload["evaluation_version"]}


@attrs.frozen
class HeadSealed(Event):
    """A key holder signed the head before this event (Ed25519 over the canonical JSON of
    `{ledger_id, seq, hash}`), in its own `seals` stream so a seal never makes a decision re-decide."""

    TYPE: ClassVar[str] = "HeadSealed"
    ledger_id: str
    seq: int
    hash: str
    key_id: str
    signature: str  # base64 (standard alphabet)


LEDGER_EVENTS: dict[str, type[LedgerEvent]] = {
    cls.TYPE: cls for cls in (LedgerInitialized, BaselineActivated, WindowAdvanced, EvaluationActivated)
}
