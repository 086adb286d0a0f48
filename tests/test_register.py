"""Candidates that exist while they train, a key that never hides new bytes, and failures after hand-off."""

from __future__ import annotations

from pathlib import Path

import pytest
from conftest import Workspace

from lifecycle_fsm import DuplicateEventError, IllegalCommandError, InputError, Ledger, RecoveryAction, State
from lifecycle_fsm.replay import load_state


def _ready_ledger(ws: Workspace) -> Ledger:
    ledger = ws.ledger()
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    return ledger


def _checkpoint(ws: Workspace, body: bytes = b"step 10") -> Path:
    folder = ws.root / "run" / "checkpoint-10"
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.safetensors").write_bytes(body)
    return folder


def test_a_registered_candidate_trains_then_its_adapter_completes_it(ws: Workspace) -> None:
    """Trusted states, failures and plans are recorded before the adapter exists; receive completes it."""
    ledger = _ready_ledger(ws)
    registered = ledger.register("dpo-v5", kind="dpo", provenance={"git_commit": "abc"})
    assert registered.candidate.state is State.RECEIVED and registered.candidate.pending
    assert registered.candidate.candidate["source_policy_version"] == ws.sft_sha  # the active baseline's
    ledger.record_trusted_state("dpo-v5", "pre_update_checkpoint", _checkpoint(ws), event_id="run-1/step-10/a0")
    plan = ledger.fail_stage("dpo-v5", "update").plan
    assert plan.action is RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT
    ledger.complete_recovery("dpo-v5")

    done = ledger.receive(ws.dpo(), candidate_id="dpo-v5")
    assert not done.candidate.pending and done.candidate.state is State.RECEIVED
    assert done.candidate.provenance == {"git_commit": "abc"}
    assert "pre_update_checkpoint" in done.candidate.trusted_states  # what training recorded stays
    assert ledger.check("dpo-v5").candidate.state is State.VERIFIED
    assert ledger.hand_off("dpo-v5").candidate.state is State.READY
    types = [e.type for e, _ in ledger.history("dpo-v5")]
    assert types[:2] == ["CandidateRegistered", "TrustedStateRecorded"]
    assert types.count("CandidateReceived") == 1  # no placeholder events
    assert load_state(ledger.store, use_checkpoints=False).state.candidates["dpo-v5"] == ledger.candidate("dpo-v5")


def test_a_pending_candidate_is_refused_checks_never_rejected(ws: Workspace) -> None:
    ledger = _ready_ledger(ws)
    ledger.register("dpo-v5", kind="dpo")
    head = ledger.store.head()
    with pytest.raises(IllegalCommandError, match="adapter was not received yet"):
        ledger.check("dpo-v5")
    with pytest.raises(IllegalCommandError):  # hand-off needs verified: the table refuses it first
        ledger.hand_off("dpo-v5")
    assert ledger.store.head() == head
    assert ledger.candidate("dpo-v5").state is State.RECEIVED


def test_an_adapter_with_another_identity_does_not_complete_it(ws: Workspace) -> None:
    ledger = _ready_ledger(ws)
    ledger.register("grpo-v7", kind="grpo")
    head = ledger.store.head()
    with pytest.raises(InputError, match="candidate_kind is 'dpo'"):
        ledger.receive(ws.dpo(), candidate_id="grpo-v7")
    with pytest.raises(InputError, match="source_policy_version"):
        ledger.receive(ws.grpo(source_policy_version="f" * 64), candidate_id="grpo-v7")
    assert ledger.store.head() == head


def test_registering_again_is_a_no_op_and_another_identity_a_conflict(ws: Workspace) -> None:
    ledger = _ready_ledger(ws)
    ledger.register("dpo-v5", kind="dpo", provenance={"a": 1})
    again = ledger.register("dpo-v5", kind="dpo", provenance={"a": 1})
    assert again.events == ()
    with pytest.raises(Exception, match="another identity"):
        ledger.register("dpo-v5", kind="grpo")
    with pytest.raises(InputError, match=r"^unknown candidate kind 'ppo' \(expected one of dpo, grpo, rlvr\)$"):
        ledger.register("x", kind="ppo")  # one rule with manifests.check_kind; a ppo run is not steered to dpo


def test_a_used_key_never_hides_new_bytes(ws: Workspace) -> None:
    """A restarted run re-saves checkpoint-10 with other bytes: the old key is refused, naming both hashes."""
    ledger = _ready_ledger(ws)
    ledger.receive(ws.grpo())
    folder = _checkpoint(ws)
    first = ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder, event_id="run-1/step-10")
    assert ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder, event_id="run-1/step-10").duplicate
    old = first.candidate.trusted_states["pre_update_checkpoint"]["sha256"]
    _checkpoint(ws, b"step 10, re-saved")
    with pytest.raises(DuplicateEventError, match=old) as refused:
        ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder, event_id="run-1/step-10")
    assert refused.value.event_id == "run-1/step-10"
    again = ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder, event_id="run-1/step-10/attempt-1")
    assert again.candidate.trusted_states["pre_update_checkpoint"]["sha256"] != old
    for f in folder.iterdir():  # a retry whose file is gone still answers what was recorded
        f.unlink()
    folder.rmdir()
    assert ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder, event_id="run-1/step-10").duplicate


def test_artifact_validation_can_fail_after_hand_off(ws: Workspace) -> None:
    """An export or merge after hand-off: roll back to the baseline (recovering), or block the release (reject)."""
    ledger = _ready_ledger(ws)
    ledger.receive(ws.dpo())
    ledger.check("dpo-v5")
    assert ledger.hand_off("dpo-v5").candidate.state is State.READY
    with pytest.raises(IllegalCommandError, match="only stage artifact_validation"):
        ledger.fail_stage("dpo-v5", "update")
    failed = ledger.fail_stage("dpo-v5", "artifact_validation")
    assert failed.plan.action is RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE
    assert failed.candidate.state is State.RECOVERING

    ledger.complete_recovery("dpo-v5")
    ledger.check("dpo-v5")
    ledger.hand_off("dpo-v5")
    baseline_weights = ws.root / "sft" / "adapter" / "adapter_model.safetensors"
    baseline_weights.write_bytes(b"tampered")  # nothing left to roll back to: the release is blocked
    blocked = ledger.fail_stage("dpo-v5", "artifact_validation")
    assert blocked.plan.action is RecoveryAction.BLOCK_RELEASE
    assert blocked.candidate.state is State.REJECT
    assert load_state(ledger.store, use_checkpoints=False).state.candidates["dpo-v5"].state is State.REJECT


def test_a_rollback_names_the_baseline_the_candidate_came_from(ws: Workspace) -> None:
    """After a baseline change, a failed update rolls back to the candidate's own baseline and says it is not active."""
    ledger = _ready_ledger(ws)
    first_baseline = ledger.settings().baseline
    assert first_baseline is not None
    ledger.receive(ws.grpo())
    plan = ledger.fail_stage("grpo-v7", "update").plan
    assert plan.action is RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE and plan.note is None
    ledger.complete_recovery("grpo-v7")
    ledger.activate_baseline(ws.baseline("sft-v2"))
    plan = ledger.fail_stage("grpo-v7", "update").plan
    assert plan.action is RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE
    assert plan.sha256 == first_baseline["adapter_sha256"] == ws.sft_sha
    assert plan.path == first_baseline["adapter_path"]
    assert plan.note is not None and "no longer the active one" in plan.note


def test_an_unreadable_artifact_is_inconclusive_not_a_reject(ws: Workspace) -> None:
    """The artifact root gone (an unmounted volume): nothing is decided, the state stays, and it says why."""
    volume = Workspace(ws.root / "volume", paths_from_root=True)
    volume.root.mkdir()
    ledger = Ledger.open(ws.db, synchronous="NORMAL", artifact_root=volume.root)
    ledger.init()
    ledger.activate_baseline(volume.baseline())
    ledger.receive(volume.dpo())
    assert ledger.check("dpo-v5").state is State.VERIFIED
    volume.root.rename(ws.root / "unmounted")
    checked = ledger.check("dpo-v5", rehash=True)
    assert checked.inconclusive and checked.state is State.VERIFIED
    handed = ledger.hand_off("dpo-v5", rehash=True)
    assert handed.inconclusive and handed.state is State.VERIFIED
    assert [e.type for e in handed.events] == ["InconclusiveCheckRecorded"]
    why = ledger.explain("dpo-v5").inconclusive
    assert why is not None and why["command"] == "handoff" and "does not exist" in why["checks"]["artifact"]
    (ws.root / "unmounted").rename(volume.root)  # mounted again: a good candidate was never lost
    assert ledger.hand_off("dpo-v5", rehash=True).state is State.READY


def test_a_missing_file_in_a_readable_folder_still_rejects(ws: Workspace) -> None:
    ledger = _ready_ledger(ws)
    ledger.receive(ws.dpo())
    (ws.root / "dpo-v5" / "adapter" / "adapter_model.safetensors").unlink()
    checked = ledger.check("dpo-v5")
    assert not checked.inconclusive and checked.state is State.REJECT


def test_os_errors_the_environment_causes_are_told_apart() -> None:
    import errno

    from lifecycle_fsm.artifact_walk import os_error
    from lifecycle_fsm.errors import ArtifactUnreadable

    assert isinstance(os_error("read", "x", OSError(errno.EACCES, "Permission denied")), ArtifactUnreadable)
    assert isinstance(os_error("read", "x", OSError(errno.EIO, "Input/output error")), ArtifactUnreadable)
    assert not isinstance(os_error("read", "x", OSError(errno.ELOOP, "loop")), ArtifactUnreadable)


def test_a_reward_plan_names_the_checkpoint_to_resume_from_and_the_recovery_what_was_done(ws: Workspace) -> None:
    ledger = _ready_ledger(ws)
    ledger.register("grpo-v7", kind="grpo")
    folder = _checkpoint(ws)
    ledger.record_trusted_state("grpo-v7", "pre_update_checkpoint", folder)
    plan = ledger.fail_stage("grpo-v7", "reward").plan
    assert plan.action is RecoveryAction.RESTART_SAMPLING
    assert plan.checkpoint == str(folder) and plan.checkpoint_sha256 is not None
    done = ledger.complete_recovery("grpo-v7", resumed_from=str(folder))
    assert [e.type for e in done.events] == ["RecoveryCompleted"]
    assert ledger.history("grpo-v7")[-1][1].resumed_from == str(folder)  # type: ignore[attr-defined]
    (folder / "model.safetensors").write_bytes(b"changed")
    assert ledger.fail_stage("grpo-v7", "sampling").plan.checkpoint is None  # bytes changed: nothing to resume


def test_ledger_explain_shows_the_registration_and_an_inconclusive_check(ws: Workspace) -> None:
    """`Ledger.explain` is the explanation `lifecycle explain` prints: typed, with the provenance card."""
    ledger = _ready_ledger(ws)
    ledger.register("dpo-v5", kind="dpo", provenance={"git_commit": "abc123", "dirty": False})
    pending = ledger.explain("dpo-v5")
    assert pending.candidate.pending and pending.to_json()["provenance"] == {"git_commit": "abc123", "dirty": False}
    ledger.receive(ws.dpo(), candidate_id="dpo-v5")
    ledger.check("dpo-v5")
    explained = ledger.explain("dpo-v5")
    assert explained.candidate.state is State.VERIFIED and explained.inconclusive is None
    assert ledger.explain("dpo-v5", as_of=pending.as_of).candidate.pending
