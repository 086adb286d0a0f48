"""Domain events: small frozen records, in the past tense, carrying their evidence.

Each class has a `TYPE` tag (the stored `type` column), a `SCHEMA_VERSION`, and
`trigger_for(payload)`: the machine trigger the event stands for, read from the
payload so replay can validate a move without building the object. Payloads are
plain JSON values; the store encodes them canonically for the hash chain.

Old schema versions are upcast on read by named functions registered in
`UPCASTERS`; an unknown type or a version we have no path for is an error.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, ClassVar

import attrs

from lifecycle_fsm.errors import CorruptionError

__all__ = [
    "EVENT_TYPES",
    "LEDGER_STREAM",
    "UPCASTERS",
    "BaselineActivated",
    "CandidateReceived",
    "ChecksRecorded",
    "EvaluationActivated",
    "Event",
    "EvidenceInvalidated",
    "HandoffDecided",
    "LedgerInitialized",
    "RecoveryCompleted",
    "RecoveryPlanned",
    "StageFailed",
    "TrustedStateInvalidated",
    "TrustedStateRecorded",
    "WindowAdvanced",
    "candidate_id_of",
    "event_from_payload",
    "stream_of",
    "upcast",
]

LEDGER_STREAM = "ledger"
_CANDIDATE_PREFIX = "candidate:"

JSON = dict[str, Any]


def _flag(payload: Mapping[str, Any], key: str) -> bool:
    """A boolean field read strictly: a stored "false" string is corruption, not truthy."""
    value = payload[key]
    if not isinstance(value, bool):
        raise ValueError(f"{key} must be true or false, not {value!r}")
    return value


def stream_of(candidate_id: str) -> str:
    """The stream that holds one candidate's events."""
    return _CANDIDATE_PREFIX + candidate_id


def candidate_id_of(stream_id: str) -> str | None:
    """The candidate a stream belongs to, or None for the ledger's own stream."""
    if stream_id.startswith(_CANDIDATE_PREFIX):
        return stream_id[len(_CANDIDATE_PREFIX) :]
    return None


@attrs.frozen
class Event:
    """Base of every domain event."""

    TYPE: ClassVar[str] = ""
    SCHEMA_VERSION: ClassVar[int] = 1
    # Set when the trigger never depends on the payload (lets replay skip a call).
    FIXED_TRIGGER: ClassVar[str | None] = None

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str | None:
        """The machine trigger this event stands for (None for ledger-setting events)."""
        return cls.FIXED_TRIGGER

    def to_payload(self) -> JSON:
        return attrs.asdict(self, recurse=False)

    @property
    def trigger(self) -> str | None:
        return type(self).trigger_for(self.to_payload())


# --- the ledger's own stream: settings every decision reads -----------------------


@attrs.frozen
class LedgerInitialized(Event):
    """The ledger's freshness settings were fixed (seed defaults: max age 2, window 1)."""

    TYPE: ClassVar[str] = "LedgerInitialized"
    max_window_age: int
    active_window: int


@attrs.frozen
class BaselineActivated(Event):
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


@attrs.frozen
class WindowAdvanced(Event):
    """The active rollout window moved on; online evidence ages by the difference."""

    TYPE: ClassVar[str] = "WindowAdvanced"
    active_window: int
    previous_window: int


@attrs.frozen
class EvaluationActivated(Event):
    """A new evaluation version became the one candidates must name."""

    TYPE: ClassVar[str] = "EvaluationActivated"
    evaluation_version: str
    previous_evaluation_version: str | None


# --- one stream per candidate -------------------------------------------------------


@attrs.frozen
class CandidateReceived(Event):
    """A candidate manifest was received (revision 0) or revised after `tune`."""

    TYPE: ClassVar[str] = "CandidateReceived"
    candidate_id: str
    revision: int
    manifest_path: str
    manifest_sha256: str
    candidate: JSON  # the fields the checks read, parsed from the manifest (manifests.py)

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        revision = payload["revision"]
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise ValueError(f"revision must be a non-negative integer, not {revision!r}")
        return "receive" if revision == 0 else "revise"


@attrs.frozen
class ChecksRecorded(Event):
    """Every lifecycle check ran; `reason_codes` names each failed one (empty: passed)."""

    TYPE: ClassVar[str] = "ChecksRecorded"
    passed: bool
    reason_codes: list[str]
    freshness: JSON
    artifact: JSON
    rollback: JSON
    settings: JSON

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        return "pass_checks" if _flag(payload, "passed") else "fail_checks"


@attrs.frozen
class TrustedStateRecorded(Event):
    """A training stage saved a state that recovery may resume from (hashed on disk)."""

    TYPE: ClassVar[str] = "TrustedStateRecorded"
    FIXED_TRIGGER: ClassVar[str | None] = "record_trusted_state"
    kind: str
    path: str
    sha256: str


@attrs.frozen
class TrustedStateInvalidated(Event):
    """A trusted state may no longer be resumed from."""

    TYPE: ClassVar[str] = "TrustedStateInvalidated"
    FIXED_TRIGGER: ClassVar[str | None] = "invalidate_trusted_state"
    kind: str
    reason: str


@attrs.frozen
class StageFailed(Event):
    """A training stage failed for this candidate."""

    TYPE: ClassVar[str] = "StageFailed"
    FIXED_TRIGGER: ClassVar[str | None] = "fail_stage"
    stage: str


@attrs.frozen
class RecoveryPlanned(Event):
    """The recovery plan for a failed stage, with the trusted states it re-hashed."""

    TYPE: ClassVar[str] = "RecoveryPlanned"
    stage: str
    recovery_state: str | None
    reused_state: bool
    action: str
    blocking: bool
    trusted_states: JSON  # kind -> {path, expected, actual, available, source, error}

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        return "block_recovery" if _flag(payload, "blocking") else "plan_recovery"


@attrs.frozen
class RecoveryCompleted(Event):
    """The planned recovery finished; every check must run again."""

    TYPE: ClassVar[str] = "RecoveryCompleted"
    FIXED_TRIGGER: ClassVar[str | None] = "complete_recovery"
    stage: str
    action: str


@attrs.frozen
class HandoffDecided(Event):
    """The hand-off decision, with the checks re-run at that moment as its evidence."""

    TYPE: ClassVar[str] = "HandoffDecided"
    handoff_status: str
    upstream_decision: Any
    hard_failures: list[str]
    reason_codes: list[str]
    freshness: JSON
    artifact: JSON
    rollback: JSON
    settings: JSON

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        status = payload["handoff_status"]
        triggers = {"ready_for_evaluation": "hand_off_ready", "tune": "hand_off_tune", "reject": "hand_off_reject"}
        if status not in triggers:
            raise ValueError(f"unknown handoff_status {status!r}")
        return triggers[status]


@attrs.frozen
class EvidenceInvalidated(Event):
    """A ledger setting changed under a decided candidate; it must be checked again."""

    TYPE: ClassVar[str] = "EvidenceInvalidated"
    FIXED_TRIGGER: ClassVar[str | None] = "invalidate_evidence"
    cause: str  # baseline | evaluation | window
    previous: Any
    current: Any


EVENT_TYPES: dict[str, type[Event]] = {
    cls.TYPE: cls
    for cls in (
        LedgerInitialized,
        BaselineActivated,
        WindowAdvanced,
        EvaluationActivated,
        CandidateReceived,
        ChecksRecorded,
        TrustedStateRecorded,
        TrustedStateInvalidated,
        StageFailed,
        RecoveryPlanned,
        RecoveryCompleted,
        HandoffDecided,
        EvidenceInvalidated,
    )
}

Upcaster = Callable[[JSON], JSON]
# (type, from_version) -> function returning the payload at from_version + 1.
# Name them `upcast_<type>_v1_v2`; none are needed while every type is at v1.
UPCASTERS: dict[tuple[str, int], Upcaster] = {}


def upcast(type_name: str, schema_version: int, payload: JSON, *, seq: int | None = None) -> JSON:
    """Bring a stored payload up to the current schema version, or fail loudly."""
    cls = EVENT_TYPES.get(type_name)
    if cls is None:
        raise CorruptionError(f"unknown event type {type_name!r}", seq=seq, found=type_name)
    if not isinstance(schema_version, int) or isinstance(schema_version, bool):
        raise CorruptionError(f"{type_name} schema version {schema_version!r} is not an integer", seq=seq)
    version = schema_version
    while version < cls.SCHEMA_VERSION:
        step = UPCASTERS.get((type_name, version))
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


def event_from_payload(type_name: str, schema_version: int, payload: JSON, *, seq: int | None = None) -> Event:
    """Rebuild a typed event from a stored payload (upcast first); strict about fields."""
    current = upcast(type_name, schema_version, payload, seq=seq)
    try:
        return EVENT_TYPES[type_name](**current)
    except TypeError as e:
        raise CorruptionError(f"{type_name} payload does not match its schema: {e}", seq=seq) from e
