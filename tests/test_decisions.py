"""Each command's decision as a plain function: values in, events out, no store, no disk."""

from __future__ import annotations

from typing import Any

import attrs
import pytest

from lifecycle_fsm import decisions
from lifecycle_fsm.candidate_events import (
    CandidateReceived,
    EvidenceInvalidated,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
)
from lifecycle_fsm.checks import ArtifactCheck, CheckEvidence, TrustedStateCheck
from lifecycle_fsm.errors import ConflictError, IllegalCommandError
from lifecycle_fsm.events import BaselineActivated, EvaluationActivated, LedgerInitialized, WindowAdvanced
from lifecycle_fsm.manifests import CandidateManifest
from lifecycle_fsm.state import CandidateState, LedgerSettings

SHA_A, SHA_B = "a" * 64, "b" * 64
FIELDS = {"candidate_kind": "dpo", "policy_version": "dpo-v5"}


def candidate(state: str = "received", **fields: Any) -> CandidateState:
    base: dict[str, Any] = {
        "candidate_id": "dpo-v5",
        "state": state,
        "version": 3,
        "last_seq": 9,
        "kind": "dpo",
        "candidate": dict(FIELDS),
        "manifest_path": "/m.json",
        "manifest_sha256": SHA_A,
    }
    return CandidateState(**(base | fields))


def baseline_event(policy: str = SHA_B, path: str = "/sft/adapter") -> BaselineActivated:
    return BaselineActivated(policy, None, "/sft/m.json", SHA_A, path, policy, policy, None)


def settings(**fields: Any) -> LedgerSettings:
    base: dict[str, Any] = {"initialized": True, "max_window_age": 2, "active_window": 1, "version": 2}
    return LedgerSettings(**(base | fields))


def test_receive_new_then_identical_then_revision() -> None:
    """A new id is revision 0; the identical manifest again is nothing; a tune candidate's revision is 1."""
    manifest = CandidateManifest("/m.json", SHA_A, dict(FIELDS))
    (event,) = decisions.receive(None, "dpo-v5", manifest).events
    assert event == CandidateReceived("dpo-v5", 0, "/m.json", SHA_A, FIELDS)
    assert decisions.receive(candidate(), "dpo-v5", manifest).events == ()
    revised = CandidateManifest("/m.json", SHA_B, dict(FIELDS))
    (event,) = decisions.receive(candidate("tune", revision=2), "dpo-v5", revised).events
    assert isinstance(event, CandidateReceived) and event.revision == 3
    with pytest.raises(IllegalCommandError, match="only a candidate in tune can be revised"):
        decisions.receive(candidate("verified"), "dpo-v5", revised)


def test_init_once_then_same_values_then_conflict() -> None:
    assert decisions.init(LedgerSettings(), 3, 4).events == (LedgerInitialized(3, 4),)
    assert decisions.init(settings(), 2, 1).events == ()
    with pytest.raises(ConflictError, match="already initialized"):
        decisions.init(settings(), 5, 1)


def test_baseline_on_a_fresh_ledger_fixes_the_seed_defaults_first() -> None:
    decision = decisions.activate_baseline(LedgerSettings(), baseline_event())
    assert decision.events == (LedgerInitialized(2, 1), baseline_event())
    assert decision.invalidation == decisions.Invalidation(EvidenceInvalidated("baseline", None, SHA_B))


def test_new_baseline_invalidates_every_kind_and_names_the_previous_one() -> None:
    old = settings(baseline=attrs.asdict(baseline_event(SHA_A)))
    decision = decisions.activate_baseline(old, baseline_event(SHA_B))
    (event,) = decision.events
    assert isinstance(event, BaselineActivated) and event.previous_policy_version == SHA_A
    assert decision.invalidation == decisions.Invalidation(EvidenceInvalidated("baseline", SHA_A, SHA_B), None)


def test_same_baseline_is_nothing_and_same_policy_elsewhere_invalidates_nobody() -> None:
    current = settings(baseline=attrs.asdict(baseline_event(SHA_B)))
    assert decisions.activate_baseline(current, baseline_event(SHA_B)).events == ()
    moved = decisions.activate_baseline(current, baseline_event(SHA_B, path="/copy/adapter"))
    assert len(moved.events) == 1 and moved.invalidation is None


def test_window_moves_forward_only_and_invalidates_online_kinds() -> None:
    decision = decisions.advance_window(settings(active_window=1), 3)
    assert decision.events == (WindowAdvanced(3, 1),)
    assert decision.invalidation == decisions.Invalidation(EvidenceInvalidated("window", 1, 3), ("grpo", "rlvr"))
    assert decisions.advance_window(settings(active_window=3), 3).events == ()
    with pytest.raises(ConflictError, match="only advances"):
        decisions.advance_window(settings(active_window=3), 2)
    fresh = decisions.advance_window(LedgerSettings(), 2)  # window 1 is the default before init
    assert fresh.events == (LedgerInitialized(2, 1), WindowAdvanced(2, 1))


def test_evaluation_change_invalidates_everyone() -> None:
    decision = decisions.activate_evaluation(settings(evaluation_version="e1"), "e2")
    assert decision.events == (EvaluationActivated("e2", "e1"),)
    assert decision.invalidation == decisions.Invalidation(EvidenceInvalidated("evaluation", "e1", "e2"))
    assert decisions.activate_evaluation(settings(evaluation_version="e2"), "e2").events == ()


def test_fail_stage_plans_from_the_available_states() -> None:
    evidence = {
        "trajectories": TrustedStateCheck(False, "recorded", "t", "a", "b", None),
        "prompt_queue": TrustedStateCheck(True, "recorded", "q", "a", "a", None),
    }
    failed, planned = decisions.fail_stage(candidate(), "reward", evidence).events
    assert failed == StageFailed("reward")
    assert isinstance(planned, RecoveryPlanned)
    assert (planned.recovery_state, planned.action, planned.blocking) == (
        "prompt_queue",
        "restart_sampling_from_prompt_queue",
        False,
    )
    gone = TrustedStateCheck(False, None, None, None, None, "not recorded")
    _, blocked = decisions.fail_stage(
        candidate(), "update", {"pre_update_checkpoint": gone, "verified_baseline": gone}
    ).events
    assert isinstance(blocked, RecoveryPlanned) and (blocked.action, blocked.blocking) == ("block_update", True)


def test_untrust_needs_a_recorded_state_and_recovered_names_the_plan() -> None:
    with pytest.raises(ConflictError, match="no trusted prompt_queue"):
        decisions.invalidate_trusted_state(candidate(), "prompt_queue", "why")
    recorded = candidate(trusted_states={"prompt_queue": {"path": "/q", "sha256": SHA_A, "seq": 4}})
    assert decisions.invalidate_trusted_state(recorded, "prompt_queue", "why").events == (
        TrustedStateInvalidated("prompt_queue", "why"),
    )
    planned = candidate("recovering", last_recovery={"stage": "reward", "action": "restart_sampling"})
    assert decisions.complete_recovery(planned).events == (RecoveryCompleted("reward", "restart_sampling"),)


def test_reason_codes_come_in_the_rules_order() -> None:
    """Freshness checks in their own order, then rollback, artifact, path_escapes_root, then upstream codes."""
    evidence = CheckEvidence(
        freshness={"fresh": False, "failed_checks": ["source_policy", "branch_evidence"]},
        artifact=ArtifactCheck("a", "x", error="path_escapes_root"),
        rollback=ArtifactCheck("b", "y", "z"),
        settings={},
    )
    decision, reasons = evidence.decide("reject")
    assert reasons == [
        "source_policy",
        "branch_evidence",
        "rollback",
        "artifact",
        "path_escapes_root",
        "upstream_reject",
    ]
    assert decision["hard_failures"] == ["freshness", "rollback", "artifact", "upstream_reject"]
    _, reasons = attrs.evolve(evidence, rollback=ArtifactCheck("b", "y", "y", verified=True)).decide("maybe")
    assert reasons == ["source_policy", "branch_evidence", "artifact", "path_escapes_root", "upstream_state"]


def test_an_unreadable_artifact_decides_nothing_unless_another_check_failed_for_good() -> None:
    """Check and hand-off alike: an artifact the environment kept from being read alone is inconclusive
    (nothing decided); with a failure that does not depend on it (a stale source policy), the candidate
    is decided on that failure."""
    unreadable = ArtifactCheck("a", "x", error="permission denied", inconclusive=True)
    fresh = {"fresh": True, "failed_checks": []}
    evidence = CheckEvidence(fresh, unreadable, ArtifactCheck("b", "y", "y", verified=True), settings={})
    stale = attrs.evolve(evidence, freshness={"fresh": False, "failed_checks": ["source_policy"]})
    decide = {
        "check": decisions.check,
        "handoff": lambda e: decisions.hand_off(candidate("verified", candidate={**FIELDS, "decision": "accept"}), e),
    }
    for name, run in decide.items():
        assert [e.TYPE for e in run(evidence).events] == ["InconclusiveCheckRecorded"], name
        decided = run(stale).events
        assert [e.TYPE for e in decided] != ["InconclusiveCheckRecorded"] and decided, name


def test_after_hand_off_only_artifact_validation_can_fail() -> None:
    """A ready candidate's training is over: `update` (or any stage but artifact validation) is refused."""
    with pytest.raises(IllegalCommandError, match="after hand-off only stage artifact_validation can fail"):
        decisions.fail_stage(candidate("ready"), "update", {})
    assert decisions.fail_stage(candidate("ready"), "artifact_validation", {}).events


def test_init_again_with_other_values_says_what_the_ledger_has() -> None:
    settings = LedgerSettings(initialized=True, max_window_age=2, active_window=3, version=2)
    with pytest.raises(ConflictError) as refused:
        decisions.init(settings, 5, 1, initialized_with=(4, 1))
    assert "(max window age 2, active window 3; initialized with 4, 1)" in str(refused.value)
