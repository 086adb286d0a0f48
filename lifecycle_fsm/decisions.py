"""What each command decides: pure functions from folded state and gathered evidence to events (no store,
disk or clock). A `Decision` with no events is a no-op (an identical re-receipt, a setting already so)."""

from __future__ import annotations

from collections.abc import Mapping

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
from lifecycle_fsm.checks import CheckEvidence, TrustedStateCheck
from lifecycle_fsm.errors import ConflictError, IllegalCommandError, InputError
from lifecycle_fsm.events import BaselineActivated, EvaluationActivated, LedgerEvent, LedgerInitialized, WindowAdvanced
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.machine import State, command_allowed
from lifecycle_fsm.manifests import CandidateManifest
from lifecycle_fsm.rules import BLOCKING_ACTIONS, ONLINE_KINDS, RULES, choose_recovery_action
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.chain import canonical_json

DEFAULT_MAX_WINDOW_AGE = 2
DEFAULT_ACTIVE_WINDOW = 1


@attrs.frozen
class Invalidation:
    """A settings change's fan-out: one event for every decided candidate of `kinds` (None: all)."""

    event: EvidenceInvalidated
    kinds: tuple[str, ...] | None = None


@attrs.frozen
class Decision:
    """The events a command appends to its own stream, and any fan-out to others."""

    events: tuple[CandidateEvent, ...] | tuple[LedgerEvent, ...] = ()
    invalidation: Invalidation | None = None


NOTHING = Decision()


def register(
    current: CandidateState | None, candidate_id: str, kind: str, source_policy_version: str, provenance: JSON
) -> Decision:
    """A candidate that exists before its adapter; the same registration again is a no-op."""
    if current is None:
        return Decision((CandidateRegistered(candidate_id, kind, source_policy_version, provenance),))
    registered = (current.kind, current.candidate.get("source_policy_version"), current.provenance)
    if registered == (kind, source_policy_version, provenance):
        return NOTHING
    raise ConflictError(f"candidate {candidate_id!r} already exists (state {current.state}) with another identity")


def _completes(current: CandidateState, manifest: CandidateManifest) -> Decision:
    """The finished adapter's manifest completes a registered candidate whose identity it repeats."""
    if current.state != State.RECEIVED:
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is in state {current.state}: its adapter can be received "
            "once it is back in received (complete its recovery first)",
            state=current.state,
            trigger="complete_registration",
        )
    registered = {"candidate_kind": current.kind, **current.candidate}
    for field in ("candidate_kind", "source_policy_version"):
        if manifest.fields.get(field) != registered.get(field):
            raise InputError(
                f"manifest {manifest.path} does not complete candidate {current.candidate_id!r}: its {field} is "
                f"{manifest.fields.get(field)!r}, the registration says {registered.get(field)!r}"
            )
    return Decision(
        (CandidateReceived(current.candidate_id, 0, manifest.path, manifest.sha256, manifest.fields, None, True),)
    )


def _differs(current: CandidateState, manifest: CandidateManifest) -> str:
    """What a manifest received again says otherwise: its fields first (such as the adapter's path resolved
    under another root), else its bytes."""
    recorded = current.candidate or {}
    changed = sorted(k for k in recorded.keys() | manifest.fields.keys() if recorded.get(k) != manifest.fields.get(k))
    if not changed:
        return "the same fields, in a file of other bytes"
    first = changed[0]
    more = f" (and {', '.join(changed[1:])})" if changed[1:] else ""
    return f"{first} was {recorded.get(first)!r}, is {manifest.fields.get(first)!r}{more}"


def receive(current: CandidateState | None, candidate_id: str, manifest: CandidateManifest) -> Decision:
    """A new candidate, a registered one completed, a revision of a `tune` one, or nothing for a re-receipt."""
    if current is not None and current.pending:
        return _completes(current, manifest)
    if current is not None:
        same_fields = canonical_json(current.candidate) == canonical_json(manifest.fields)
        if current.manifest_sha256 == manifest.sha256 and same_fields:
            return NOTHING  # the same file at the same place: a retry after a lost acknowledgement
        if not command_allowed(current.state, ("revise",)):
            raise IllegalCommandError(
                f"candidate {candidate_id!r} already exists in state {current.state} with a different manifest "
                f"({_differs(current, manifest)}); only a candidate in tune can be revised",
                state=current.state,
                trigger="revise",
            )
    revision = 0 if current is None else current.revision + 1
    return Decision((CandidateReceived(candidate_id, revision, manifest.path, manifest.sha256, manifest.fields, None),))


def check(evidence: CheckEvidence) -> Decision:
    """Record every check's evidence: it passes or names what failed. An artifact the environment kept from
    being read decides nothing (inconclusive), unless another check already failed for good."""
    reasons = evidence.reason_codes
    return _inconclusive("check", evidence, reasons) or Decision(
        (ChecksRecorded(not reasons, reasons, **evidence.payload(), rules=RULES),)
    )


def hand_off(current: CandidateState, evidence: CheckEvidence) -> Decision:
    """The hand-off decision over checks re-run at this moment, under today's rules."""
    decision, reasons = evidence.decide(current.candidate.get("decision"))
    return _inconclusive("handoff", evidence, reasons) or Decision(
        (HandoffDecided(**decision, reason_codes=reasons, **evidence.payload(), rules=RULES),)
    )


def _inconclusive(command: str, evidence: CheckEvidence, reasons: list[str]) -> Decision | None:
    """An inconclusive record when only the unreadable checks fail; None when another fails: the verdict stands."""
    unreadable = evidence.inconclusive
    if not unreadable or set(reasons) - set(unreadable) - {"path_escapes_root"}:
        return None
    return Decision((InconclusiveCheckRecorded(command, list(unreadable), **evidence.payload(), rules=RULES),))


def record_trusted_state(kind: str, path: str, sha256: str, settings: LedgerSettings) -> Decision:
    """A `verified_baseline` is an SFT baseline's adapter this ledger activated (its bytes, by sha256):
    recorded from anything else, a rollback would restore what was never verified."""
    if kind == "verified_baseline" and sha256 not in settings.baselines:
        raise InputError(
            f"{path} is not the adapter of a baseline this ledger activated (sha256 {sha256}): "
            "a verified_baseline is an activated SFT baseline's adapter"
        )
    return Decision((TrustedStateRecorded(kind, path, sha256),))


def invalidate_trusted_state(current: CandidateState, kind: str, reason: str) -> Decision:
    if kind not in current.trusted_states:
        raise ConflictError(f"candidate {current.candidate_id!r} has no trusted {kind} recorded")
    return Decision((TrustedStateInvalidated(kind, reason),))


def require_adapter(current: CandidateState, command: str) -> None:
    """A registered candidate is judged only once its adapter was received: refused, never rejected."""
    if current.pending:
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is registered but its adapter was not received yet: "
            f"`{command}` needs it (receive the finished adapter's manifest first)",
            state=current.state,
            trigger=command,
        )


def fail_stage(
    current: CandidateState,
    stage: str,
    trusted_states: Mapping[str, TrustedStateCheck],
    checkpoint: TrustedStateCheck | None = None,
) -> Decision:
    """The recovery plan from the trusted states the log proves intact (re-hashed by the caller)."""
    if current.state == State.READY and stage != "artifact_validation":
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is ready: after hand-off only stage artifact_validation can fail "
            f"(an export or merge), not {stage}",
            state=current.state,
            trigger="fail_stage",
        )
    available = {kind: check.available for kind, check in trusted_states.items()}
    plan = choose_recovery_action({"stage": stage, "available": available})
    blocking = plan["action"] in BLOCKING_ACTIONS
    seen = {kind: check.to_json() for kind, check in trusted_states.items()}
    resume = None if checkpoint is None else checkpoint.to_json()
    planned = RecoveryPlanned(**plan, blocking=blocking, trusted_states=seen, checkpoint=resume)
    return Decision((StageFailed(stage), planned))


def complete_recovery(current: CandidateState, resumed_from: str | None = None) -> Decision:
    plan = current.last_recovery or {}
    return Decision((RecoveryCompleted(str(plan.get("stage")), str(plan.get("action")), resumed_from),))


def _with_defaults(settings: LedgerSettings, decision: Decision) -> Decision:
    """A settings change on a ledger nobody initialised fixes the default settings first."""
    if settings.initialized or not decision.events or isinstance(decision.events[0], LedgerInitialized):
        return decision
    defaults = LedgerInitialized(DEFAULT_MAX_WINDOW_AGE, DEFAULT_ACTIVE_WINDOW)
    return attrs.evolve(decision, events=(defaults, *decision.events))


def init(
    settings: LedgerSettings,
    max_window_age: int,
    active_window: int,
    ledger_id: str | None = None,
    *,
    initialized_with: tuple[int, int] | None = None,
) -> Decision:
    """Fix the freshness settings; the same values again (today's, or those its `LedgerInitialized` fixed,
    `initialized_with`: the window may have advanced since) is a no-op, others a conflict. `ledger_id` is
    chosen by the caller, so decisions stay pure."""
    if not settings.initialized:
        return Decision((LedgerInitialized(max_window_age, active_window, ledger_id),))
    if (max_window_age, active_window) in ((settings.max_window_age, settings.active_window), initialized_with):
        return NOTHING
    since = "" if initialized_with is None else f"; initialized with {initialized_with[0]}, {initialized_with[1]}"
    raise ConflictError(
        f"ledger already initialized (max window age {settings.max_window_age}, active window "
        f"{settings.active_window}{since}); use `window N` to advance the window"
    )


def activate_baseline(settings: LedgerSettings, event: BaselineActivated) -> Decision:
    """Make a baseline active (nothing if it already is); decided candidates lose their evidence."""
    old = settings.baseline
    if old is not None and (old["policy_version"], old["adapter_path"]) == (event.policy_version, event.adapter_path):
        return NOTHING
    previous = settings.active_policy_version
    changed = previous != event.policy_version
    invalidation = Invalidation(EvidenceInvalidated("baseline", previous, event.policy_version)) if changed else None
    return _with_defaults(settings, Decision((attrs.evolve(event, previous_policy_version=previous),), invalidation))


def advance_window(settings: LedgerSettings, active_window: int) -> Decision:
    """Move the window forward (never back); online candidates' evidence ages."""
    current = settings.active_window if settings.initialized else DEFAULT_ACTIVE_WINDOW
    assert current is not None
    if active_window == current:
        return NOTHING
    if active_window < current:
        raise ConflictError(f"the window only advances: it is {current}, not going back to {active_window}")
    invalidation = Invalidation(EvidenceInvalidated("window", current, active_window), kinds=ONLINE_KINDS)
    return _with_defaults(settings, Decision((WindowAdvanced(active_window, current),), invalidation))


def activate_evaluation(settings: LedgerSettings, evaluation_version: str) -> Decision:
    """Require a new evaluation version; every decided candidate must be checked again."""
    previous = settings.evaluation_version
    if previous == evaluation_version:
        return NOTHING
    invalidation = Invalidation(EvidenceInvalidated("evaluation", previous, evaluation_version))
    return _with_defaults(settings, Decision((EvaluationActivated(evaluation_version, previous),), invalidation))
