"""The events of a candidate's stream (the registry of every event type at the end): each a move in the machine's table
plus its effect on the candidate. A class says its trigger (`FIXED_TRIGGER`, or `trigger_for` when the
payload decides), its effect beyond the move (`evolve`), the reason codes it leaves (`reasons`) and the
field that keeps its whole payload plus its seq (`KEPT_AS`, set by the fold).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import attrs

from lifecycle_fsm.errors import CorruptionError
from lifecycle_fsm.events import LEDGER_EVENTS, Event, HeadSealed, flag, stream_of
from lifecycle_fsm.json_types import JSON


@attrs.frozen
class CandidateEvent(Event):
    """An event of a candidate's stream."""

    FIXED_TRIGGER: ClassVar[str | None] = None  # when the payload never decides it (replay skips a call)
    DECISIVE_WHEN_KEPT: ClassVar[bool] = False  # a repeat is itself the new reason for the state (a re-plan)
    KEPT_AS: ClassVar[str | None] = None

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        """The machine trigger this event stands for."""
        assert cls.FIXED_TRIGGER is not None, f"{cls.__name__} must set FIXED_TRIGGER or override trigger_for"
        return cls.FIXED_TRIGGER

    @property
    def trigger(self) -> str:
        return type(self).trigger_for(self.to_payload())

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        """Apply this event's fields to the candidate's working dict (the move and `KEPT_AS` aside). A handler
        may keep `payload` (the fold's own) but never changes it; nested values are replaced, never mutated."""
        assert work is not None
        return work

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        """The reason codes once this event decides the candidate's state (`previous`: as `evolve` left them)."""
        return previous


def _started(candidate_id: str, candidate: JSON, **fields: Any) -> JSON:
    """A candidate's working dict as a registration or a receipt starts it: nothing decided yet."""
    return {
        "candidate_id": candidate_id,
        "kind": candidate.get("candidate_kind"),
        "candidate": dict(candidate),
        "last_check": None,
        "last_recovery": None,
        "last_handoff": None,
        "reason_codes": (),
        **fields,
    }


@attrs.frozen
class CandidateRegistered(CandidateEvent):
    """A candidate exists before its adapter does (a training run); until a `CandidateReceived` with
    `registered` completes it, it records trusted states, failures and plans but is never checked."""

    TYPE: ClassVar[str] = "CandidateRegistered"
    FIXED_TRIGGER: ClassVar[str | None] = "register"
    candidate_id: str
    kind: str
    source_policy_version: str
    provenance: JSON  # what produced it: data, code, base model, trainer, library versions

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        if stream_id != stream_of(payload["candidate_id"]):
            raise CorruptionError(
                f"seq {seq}: CandidateRegistered for {payload['candidate_id']!r} is on stream {stream_id}", seq=seq
            )
        return _started(
            payload["candidate_id"],
            {"candidate_kind": payload["kind"], "source_policy_version": payload["source_policy_version"]},
            manifest_path=None,
            revision=0,
            trusted_states={},
            manifest_sha256=None,
            pending=True,
            provenance=payload["provenance"],
        )


@attrs.frozen
class CandidateReceived(CandidateEvent):
    """A candidate manifest was received (revision 0), completed a registration, or revised after `tune`.
    `artifact_at_receipt`: the adapter on disk then (`checks.verify_artifact`), so a later failed check
    can name the files that changed since."""

    TYPE: ClassVar[str] = "CandidateReceived"
    candidate_id: str
    revision: int
    manifest_path: str
    manifest_sha256: str
    candidate: JSON  # the fields the checks read, parsed from the manifest (manifests.py)
    artifact_at_receipt: JSON | None = None
    registered: bool = False

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        revision = payload["revision"]
        if not isinstance(revision, int) or isinstance(revision, bool) or revision < 0:
            raise ValueError(f"revision must be a non-negative integer, not {revision!r}")
        if flag(payload, "registered"):
            return "complete_registration"
        return "receive" if revision == 0 else "revise"

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        if payload["registered"] and (work is None or not work["pending"]):
            raise CorruptionError(f"seq {seq}: CandidateReceived completes no registration", seq=seq)
        expected_revision = 0 if work is None or payload["registered"] else work["revision"] + 1
        if payload["revision"] != expected_revision or stream_id != stream_of(payload["candidate_id"]):
            raise CorruptionError(
                f"seq {seq}: CandidateReceived for {payload['candidate_id']!r} revision {payload['revision']} "
                f"does not follow on stream {stream_id} (expected revision {expected_revision})",
                seq=seq,
            )
        kept = {} if work is None else {k: work[k] for k in ("state", "decisive_seq", "decisive_type")}
        return kept | _started(
            payload["candidate_id"],
            payload["candidate"],
            manifest_path=payload["manifest_path"],
            revision=payload["revision"],
            trusted_states={} if work is None else work["trusted_states"],  # they survive a revision
            manifest_sha256=payload["manifest_sha256"],
            pending=False,
            provenance=None if work is None else work["provenance"],
        )

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return ()


@attrs.frozen
class ChecksRecorded(CandidateEvent):
    """Every lifecycle check ran; `reason_codes` names each failed one (empty: passed). `artifact` and
    `rollback` are `checks.verify_artifact` results."""

    TYPE: ClassVar[str] = "ChecksRecorded"
    KEPT_AS: ClassVar[str | None] = "last_check"
    passed: bool
    reason_codes: list[str]
    freshness: JSON
    artifact: JSON
    rollback: JSON
    settings: JSON
    rules: JSON  # `rules.RULES` when it was decided

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        return "pass_checks" if flag(payload, "passed") else "fail_checks"

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        assert work is not None
        # A passing re-check keeps the state, but its evidence is still the news.
        work["reason_codes"] = tuple(payload["reason_codes"])
        return work

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(payload["reason_codes"])


@attrs.frozen
class InconclusiveCheckRecorded(CandidateEvent):
    """A check (or a hand-off's re-check) could not read an artifact for a reason of the environment
    (permission, I/O, an absent root): nothing was decided. `inconclusive` names those checks."""

    TYPE: ClassVar[str] = "InconclusiveCheckRecorded"
    command: str  # check | handoff
    inconclusive: list[str]
    freshness: JSON
    artifact: JSON
    rollback: JSON
    settings: JSON
    rules: JSON

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        command = payload["command"]
        if command not in ("check", "handoff"):
            raise ValueError(f"command must be check or handoff, not {command!r}")
        return "check_inconclusive" if command == "check" else "hand_off_inconclusive"


@attrs.frozen
class TrustedStateRecorded(CandidateEvent):
    """A training stage saved a state that recovery may resume from (hashed on disk)."""

    TYPE: ClassVar[str] = "TrustedStateRecorded"
    FIXED_TRIGGER: ClassVar[str | None] = "record_trusted_state"
    kind: str
    path: str
    sha256: str

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        assert work is not None
        recorded = {"path": payload["path"], "sha256": payload["sha256"], "seq": seq}
        work["trusted_states"] = work["trusted_states"] | {payload["kind"]: recorded}  # a new dict: states share it
        return work


@attrs.frozen
class TrustedStateInvalidated(CandidateEvent):
    """A trusted state may no longer be resumed from."""

    TYPE: ClassVar[str] = "TrustedStateInvalidated"
    FIXED_TRIGGER: ClassVar[str | None] = "invalidate_trusted_state"
    kind: str
    reason: str

    @staticmethod
    def evolve(work: JSON | None, payload: JSON, seq: int, stream_id: str) -> JSON:
        assert work is not None
        work["trusted_states"] = {k: v for k, v in work["trusted_states"].items() if k != payload["kind"]}
        return work


@attrs.frozen
class StageFailed(CandidateEvent):
    """A training stage failed for this candidate."""

    TYPE: ClassVar[str] = "StageFailed"
    stage: str

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        stage = payload["stage"]
        if not isinstance(stage, str):
            raise ValueError(f"stage must be a string, not {stage!r}")
        return "fail_artifact_validation" if stage == "artifact_validation" else "fail_stage"


@attrs.frozen
class RecoveryPlanned(CandidateEvent):
    """The recovery plan for a failed stage, with the trusted states it re-hashed. `checkpoint`: for a
    sampling or reward plan, the trusted `pre_update_checkpoint` a trainer resumes its weights from."""

    TYPE: ClassVar[str] = "RecoveryPlanned"
    DECISIVE_WHEN_KEPT: ClassVar[bool] = True
    KEPT_AS: ClassVar[str | None] = "last_recovery"
    stage: str
    recovery_state: str | None
    reused_state: bool
    action: str
    blocking: bool
    trusted_states: JSON  # kind -> {path, expected, actual, available, source, error}
    checkpoint: JSON | None = None

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        return "block_recovery" if flag(payload, "blocking") else "plan_recovery"

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return (payload["action"],) if payload["blocking"] else ()


@attrs.frozen
class RecoveryCompleted(CandidateEvent):
    """The planned recovery finished; every check must run again."""

    TYPE: ClassVar[str] = "RecoveryCompleted"
    FIXED_TRIGGER: ClassVar[str | None] = "complete_recovery"
    stage: str
    action: str
    resumed_from: str | None = None  # what the trainer says it resumed from (a checkpoint, the SFT adapter)

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return ()


_HANDOFF_TRIGGERS = {"ready_for_evaluation": "hand_off_ready", "tune": "hand_off_tune", "reject": "hand_off_reject"}


@attrs.frozen
class HandoffDecided(CandidateEvent):
    """The hand-off decision, with the checks re-run at that moment as its evidence (as `ChecksRecorded`)."""

    TYPE: ClassVar[str] = "HandoffDecided"
    KEPT_AS: ClassVar[str | None] = "last_handoff"
    handoff_status: str
    upstream_decision: Any
    hard_failures: list[str]
    reason_codes: list[str]
    freshness: JSON
    artifact: JSON
    rollback: JSON
    settings: JSON
    rules: JSON  # `rules.RULES` when it was decided

    @classmethod
    def trigger_for(cls, payload: Mapping[str, Any]) -> str:
        status = payload["handoff_status"]
        if status not in _HANDOFF_TRIGGERS:
            raise ValueError(f"unknown handoff_status {status!r}")
        return _HANDOFF_TRIGGERS[status]

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(payload["reason_codes"])


@attrs.frozen
class EvidenceInvalidated(CandidateEvent):
    """A ledger setting changed under a decided candidate; it must be checked again."""

    TYPE: ClassVar[str] = "EvidenceInvalidated"
    FIXED_TRIGGER: ClassVar[str | None] = "invalidate_evidence"
    cause: str  # baseline | evaluation | window
    previous: Any
    current: Any

    @staticmethod
    def reasons(payload: Mapping[str, Any], previous: tuple[str, ...]) -> tuple[str, ...]:
        return (f"{payload['cause']}_changed",)


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
