"""The candidate commands of the `Ledger`: receive, register, check, trusted states, failures, hand-off.

Each validates its input, gathers its evidence (hashing, before any lock) and lets a pure function in
`decisions.py` choose the events; `command_path.py` folds, appends and re-decides on a lost race.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import attrs

from lifecycle_fsm import checks, decisions
from lifecycle_fsm.artifacts import DigestCache, hash_directory
from lifecycle_fsm.candidate_events import (
    CandidateReceived,
    CandidateRegistered,
    ChecksRecorded,
    HandoffDecided,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
)
from lifecycle_fsm.command_path import Command, CommandPath, Decide
from lifecycle_fsm.decisions import Decision
from lifecycle_fsm.errors import DuplicateEventError, InputError
from lifecycle_fsm.events import stream_of, text_or_error
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import check_candidate_id, check_version_text
from lifecycle_fsm.manifests import (
    check_kind,
    default_id,
    load_candidate_manifest,
    path_argument,
    require_baseline,
    require_choice,
)
from lifecycle_fsm.results import CandidateResult, RecoveryResult, retried_unread
from lifecycle_fsm.rules import (
    STAGES,
    TRUSTED_STATE_KINDS,
    RecoveryPlan,
    invalidated_kinds,
    plan_from_payload,
)
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.streams import StreamReader
from lifecycle_fsm.upcasting import decoded_payload

# What `check` and `hand_off` decide from the evidence they gather.
Judge = Callable[[CandidateState, checks.CheckEvidence], Decision]


class CandidateCommands:
    """Every command on one candidate's stream (a base of `Ledger`, which provides the attributes)."""

    store: EventStore
    artifact_root: str | None
    _reader: StreamReader
    _path: CommandPath
    _digests: DigestCache

    def _plan(self, stream_id: str, payload: JSON, seq: int) -> RecoveryPlan:
        """A stored plan, typed; a state invalidated before it is told from one never recorded (the
        stream is read only when the plan saw a state unrecorded)."""
        plan = plan_from_payload(payload, seq=seq)
        if all(reason != "not_recorded" for _, reason in plan.skipped):
            return plan
        history = (
            (e.seq, e.type, decoded_payload(e))
            for e in self.store.read_stream(stream_id)
            if e.type in ("TrustedStateRecorded", "TrustedStateInvalidated")
        )
        return plan_from_payload(payload, seq=seq, invalidated=invalidated_kinds(history, before=seq))

    def _on_candidate(self, candidate_id: str, decide: Decide, **how: Any) -> CandidateResult:
        result = self._path.run(Command(stream_of(candidate_id), decide, **how))
        assert isinstance(result, CandidateResult)
        return result

    def receive(
        self, manifest_path: str | os.PathLike[str], *, candidate_id: str | None = None, event_id: str | None = None
    ) -> CandidateResult:
        """Receive a candidate manifest; identical re-receipt is a no-op, `tune` may be revised."""
        manifest_path = path_argument("manifest path", manifest_path)
        try:
            manifest = load_candidate_manifest(manifest_path, self.artifact_root)
        except InputError:
            retried = retried_unread(self._path, event_id, CandidateReceived.TYPE, manifest_path, candidate_id)
            if retried is None:
                raise
            assert isinstance(retried, CandidateResult)
            return retried
        cid = candidate_id if candidate_id is not None else default_id(manifest.fields, manifest_path)
        check_candidate_id(cid)  # printable, at most 256 characters, no reserved name (lifecycle_fsm.limits)

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            decision = decisions.receive(current, cid, manifest)
            if not decision.events:
                return decision
            # Hashed only for a new receipt (a retry reads nothing): what a later check is compared with.
            adapter_path, sha256 = manifest.fields["adapter_resolved_path"], manifest.fields["adapter_sha256"]
            at_receipt = checks.verify_artifact(adapter_path, sha256, self.artifact_root)
            first = decision.events[0]
            assert isinstance(first, CandidateReceived)
            return Decision((attrs.evolve(first, artifact_at_receipt=at_receipt.to_json(with_reuse=False)),))

        return self._on_candidate(
            cid,
            decide,
            command="receive",
            event_id=event_id,
            reads_settings=False,
            first_type=CandidateReceived.TYPE,
            inputs={"candidate": manifest.fields},
        )

    def register(
        self,
        candidate_id: str,
        *,
        kind: str,
        source_policy_version: str | None = None,
        provenance: JSON | None = None,
        event_id: str | None = None,
    ) -> CandidateResult:
        """A candidate that exists before its adapter (a training run), so its trusted states, failures and
        plans can be recorded while it trains; `receive` of the finished adapter's manifest completes it
        (`check` and `hand_off` are refused until then). `source_policy_version` defaults to the active
        baseline's; `provenance` (JSON) records what produced the candidate."""
        check_candidate_id(candidate_id)
        check_kind(kind)
        if source_policy_version is not None:
            check_version_text("source policy version", source_policy_version)
        card: JSON = {} if provenance is None else provenance
        if not isinstance(card, dict):
            raise InputError(f"provenance must be a dict, not {type(card).__name__}")
        canonical_json(card)  # JSON or InputError, before anything is decided

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            source = source_policy_version or settings.active_policy_version
            if source is None:
                raise InputError("no active baseline to register against: activate one, or pass source_policy_version")
            return decisions.register(current, candidate_id, kind, source, card)

        return self._on_candidate(
            candidate_id,
            decide,
            command="register",
            event_id=event_id,
            first_type=CandidateRegistered.TYPE,
            inputs={"candidate_id": candidate_id, "kind": kind},
        )

    def check(self, candidate_id: str, *, event_id: str | None = None, rehash: bool = False) -> CandidateResult:
        """Run every check now: verified (or unchanged on a re-check) or reject. An artifact this Ledger read
        whose files are unchanged on disk is not read again (`reused_from`); `rehash=True` reads every byte."""
        return self._on_checks(
            candidate_id, "check", ChecksRecorded.TYPE, lambda _, e: decisions.check(e), event_id, rehash
        )

    def _on_checks(
        self, candidate_id: str, command: str, first_type: str, judge: Judge, event_id: str | None, rehash: bool
    ) -> CandidateResult:
        """`check` and `hand_off`: gather the evidence now (digests re-used unless `rehash`), then decide."""
        cache = None if rehash else self._digests

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            decisions.require_adapter(current, command)
            require_baseline(settings)
            evidence = checks.gather_checks(current.candidate, settings, root=self.artifact_root, cache=cache)
            return judge(current, evidence)

        return self._on_candidate(candidate_id, decide, command=command, event_id=event_id, first_type=first_type)

    def record_trusted_state(
        self, candidate_id: str, kind: str, path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> CandidateResult:
        """Record a state a stage saved, hashed on disk now (under `artifact_root`, like every artifact;
        without one, the path is its own root), for recovery to resume from."""
        require_choice("trusted-state kind", kind, TRUSTED_STATE_KINDS)
        absolute = os.path.abspath(path_argument("trusted-state path", path))
        root = self.artifact_root
        self._refuse_rewritten(event_id, kind, absolute)

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            # Looked at only once the move was found legal and the key is no retry: a refused command
            # reads nothing, and a retry answers even after the file was rotated away.
            if not os.path.lexists(absolute):
                raise InputError(f"no such trusted-state path: {absolute}")
            return decisions.record_trusted_state(kind, absolute, hash_directory(absolute, root), settings)

        return self._on_candidate(
            candidate_id,
            decide,
            command="trusted",
            event_id=event_id,
            reads_settings=kind == "verified_baseline",
            first_type=TrustedStateRecorded.TYPE,
            inputs={"kind": kind, "path": absolute},
        )

    def _refuse_rewritten(self, event_id: str | None, kind: str, path: str) -> None:
        """A key already used to record this state, while the file now holds other bytes, is refused: a
        re-saved checkpoint answered as a duplicate would leave the old hash recorded. A retry whose file
        is gone still answers with what was recorded."""
        if not isinstance(event_id, str):
            return
        stored = self.store.event_by_id(event_id)
        if stored is None or stored.type != TrustedStateRecorded.TYPE or not os.path.lexists(path):
            return
        recorded = decoded_payload(stored)
        if (recorded["kind"], recorded["path"]) != (kind, path):
            return  # another command's key: the command path says so
        now = hash_directory(path, self.artifact_root)
        if now != recorded["sha256"]:
            raise DuplicateEventError(
                f"event id {event_id!r} already recorded {kind} {path} with sha256 {recorded['sha256']} "
                f"(seq {stored.seq}); the file now hashes to {now}: record the new bytes under a new key",
                event_id=event_id,
                seq=stored.seq,
            )

    def invalidate_trusted_state(
        self, candidate_id: str, kind: str, reason: str = "invalidated by operator", *, event_id: str | None = None
    ) -> CandidateResult:
        """Stop trusting a recorded state (it stays in history); `reason` is recorded for the auditor."""
        require_choice("trusted-state kind", kind, TRUSTED_STATE_KINDS)
        if not isinstance(reason, str):
            raise InputError(f"the invalidation reason must be a string, not {type(reason).__name__} ({reason!r})")
        text_or_error("reason", reason)

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.invalidate_trusted_state(current, kind, reason)

        return self._on_candidate(
            candidate_id,
            decide,
            command="untrust",
            event_id=event_id,
            reads_settings=False,
            first_type=TrustedStateInvalidated.TYPE,
            inputs={"kind": kind},
        )

    def fail_stage(self, candidate_id: str, stage: str, *, event_id: str | None = None) -> RecoveryResult:
        """A stage failed: plan recovery from the nearest trusted state the log proves intact."""
        require_choice("stage", stage, STAGES)

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            evidence = checks.trusted_state_evidence(current, settings, stage, self.artifact_root)
            checkpoint = checks.resume_checkpoint(current, stage, self.artifact_root)
            return decisions.fail_stage(current, stage, evidence, checkpoint)

        done = self._on_candidate(
            candidate_id,
            decide,
            command="fail",
            event_id=event_id,
            first_type=StageFailed.TYPE,
            then_types=(RecoveryPlanned.TYPE,),
            inputs={"stage": stage},
        )
        # The plan this command recorded (a retried event_id returns the original one, not a later plan).
        planned = next(e for e in done.events if e.type == RecoveryPlanned.TYPE)
        recorded = done.candidate.last_recovery
        if done.duplicate or recorded is None or recorded.get("seq") != planned.seq:
            recorded = decoded_payload(planned)  # read back from the log: hash-checked, upcast
        # else: just appended and folded into the state returned, from this very payload
        plan = self._plan(planned.stream_id, recorded, planned.seq)
        return RecoveryResult(candidate=done.candidate, events=done.events, duplicate=done.duplicate, plan=plan)

    def complete_recovery(
        self, candidate_id: str, *, resumed_from: str | None = None, event_id: str | None = None
    ) -> CandidateResult:
        """The planned recovery is done; the candidate goes back to be checked again. `resumed_from` records
        what the trainer resumed from (a checkpoint, the SFT adapter)."""
        if resumed_from is not None:
            text_or_error("resumed_from", path_argument("resumed_from", resumed_from))

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.complete_recovery(current, resumed_from)

        return self._on_candidate(
            candidate_id,
            decide,
            command="recovered",
            event_id=event_id,
            reads_settings=False,
            first_type=RecoveryCompleted.TYPE,
        )

    def hand_off(self, candidate_id: str, *, event_id: str | None = None, rehash: bool = False) -> CandidateResult:
        """Re-run the checks now and decide under today's rules: ready (for evaluation), tune or reject. An
        earlier check is never trusted; `rehash` as in `check`."""
        return self._on_checks(candidate_id, "handoff", HandoffDecided.TYPE, decisions.hand_off, event_id, rehash)
