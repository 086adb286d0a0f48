"""Domain events: small frozen records, in the past tense, carrying their evidence.

The ledger's and the seals' events live here, a candidate's in `candidate_events.py` (which says what
each class carries), the shared base in `event_base.py`; import them all from here. An event at an
older `SCHEMA_VERSION` is upcast on read (`upcasting.py`); handlers read payloads strictly.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from lifecycle_fsm.candidate_events import (
    CandidateEvent,
    CandidateReceived,
    CandidateRegistered,
    ChecksRecorded,
    EvidenceInvalidated,
    HandoffDecided,
    InconclusiveCheckRecorded,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
)
from lifecycle_fsm.event_base import (
    CANDIDATE_PREFIX,
    LEDGER_STREAM,
    NAMED_STREAMS,
    SEALS_STREAM,
    Event,
    candidate_id_of,
    stream_of,
)
from lifecycle_fsm.json_types import JSON

__all__ = [
    "CANDIDATE_EVENTS",
    "CANDIDATE_PREFIX",
    "EVENT_TYPES",
    "LEDGER_EVENTS",
    "LEDGER_STREAM",
    "NAMED_STREAMS",
    "BaselineActivated",
    "CandidateEvent",
    "CandidateReceived",
    "CandidateRegistered",
    "InconclusiveCheckRecorded",
    "ChecksRecorded",
    "EvaluationActivated",
    "Event",
    "EvidenceInvalidated",
    "HandoffDecided",
    "HeadSealed",
    "LedgerEvent",
    "LedgerInitialized",
    "RecoveryCompleted",
    "RecoveryPlanned",
    "SEALS_STREAM",
    "StageFailed",
    "TrustedStateInvalidated",
    "TrustedStateRecorded",
    "WindowAdvanced",
    "candidate_id_of",
    "stream_of",
]


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
CANDIDATE_EVENTS: dict[str, type[CandidateEvent]] = {
    cls.TYPE: cls
    for cls in (
        CandidateRegistered,
        CandidateReceived,
        ChecksRecorded,
        InconclusiveCheckRecorded,
        TrustedStateRecorded,
        TrustedStateInvalidated,
        StageFailed,
        RecoveryPlanned,
        RecoveryCompleted,
        HandoffDecided,
        EvidenceInvalidated,
    )
}
EVENT_TYPES: dict[str, type[Event]] = {**LEDGER_EVENTS, **CANDIDATE_EVENTS, HeadSealed.TYPE: HeadSealed}
