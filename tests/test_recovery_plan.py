"""`fail_stage(...).plan`: every field of the typed plan, for each stage and each fallback (SPEC §10)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lifecycle_fsm import CandidateResult, Ledger, RecoveryAction, RecoveryPlan, RecoveryResult, State
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.rules import RECOVERY_STATES_BY_STAGE, choose_recovery_action
from tests.conftest import Workspace


@pytest.fixture
def active(ws: Workspace, ledger: Ledger) -> Ledger:
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    ledger.receive(ws.grpo())
    return ledger


def _saved(ws: Workspace, name: str, text: str = "state") -> Path:
    path = ws.root / "states" / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def _baseline_adapter(ws: Workspace) -> Path:
    return ws.root / "sft" / "adapter"


def test_recovery_action_names_every_action_the_rules_can_choose() -> None:
    """The enum is the seed's actions exactly, each member named as its value in upper case."""
    chosen = set()
    for stage, kinds in RECOVERY_STATES_BY_STAGE.items():
        for available in [{}, *({k: True} for k in kinds)]:
            chosen.add(choose_recovery_action({"stage": stage, "available": available})["action"])
    assert {a.value for a in RecoveryAction} == chosen
    assert all(a.name == a.value.upper() for a in RecoveryAction)


def test_sampling_reuses_the_prompt_queue(ws: Workspace, active: Ledger) -> None:
    queue = _saved(ws, "queue.jsonl")
    active.record_trusted_state("grpo-v7", "prompt_queue", queue)
    result = active.fail_stage("grpo-v7", "sampling")
    assert isinstance(result, RecoveryResult) and result.state is State.RECOVERING
    planned = result.events[-1]
    assert result.plan == RecoveryPlan(
        stage="sampling",
        action=RecoveryAction.RETRY_SAMPLING_FROM_PROMPT_QUEUE,
        recovery_state="prompt_queue",
        reused_state=True,
        path=str(queue),
        sha256=hash_directory(queue),
        blocking=False,
        skipped=(),
        seq=planned.seq,
    )


def test_sampling_without_a_queue_rebuilds_it(active: Ledger) -> None:
    plan = active.fail_stage("grpo-v7", "sampling").plan
    assert (plan.action, plan.recovery_state, plan.reused_state, plan.path, plan.sha256, plan.blocking) == (
        RecoveryAction.REBUILD_PROMPT_QUEUE,
        None,
        False,
        None,
        None,
        False,
    )
    assert plan.skipped == (("prompt_queue", "not_recorded"),)


def test_reward_passes_over_changed_trajectories_to_the_queue(ws: Workspace, active: Ledger) -> None:
    trajectories, queue = _saved(ws, "traj.jsonl"), _saved(ws, "queue.jsonl")
    active.record_trusted_state("grpo-v7", "trajectories", trajectories)
    active.record_trusted_state("grpo-v7", "prompt_queue", queue)
    trajectories.write_text("edited after it was trusted")
    plan = active.fail_stage("grpo-v7", "reward").plan
    assert plan.action is RecoveryAction.RESTART_SAMPLING_FROM_PROMPT_QUEUE
    assert (plan.recovery_state, plan.path, plan.sha256) == ("prompt_queue", str(queue), hash_directory(queue))
    assert plan.skipped == (("trajectories", "hash_changed"),)


def test_reward_with_missing_and_invalidated_states_restarts_sampling(ws: Workspace, active: Ledger) -> None:
    trajectories, queue = _saved(ws, "traj.jsonl"), _saved(ws, "queue.jsonl")
    active.record_trusted_state("grpo-v7", "trajectories", trajectories)
    active.record_trusted_state("grpo-v7", "prompt_queue", queue)
    active.invalidate_trusted_state("grpo-v7", "prompt_queue", "queue rebuilt by hand")
    trajectories.unlink()
    plan = active.fail_stage("grpo-v7", "reward").plan
    assert (plan.action, plan.recovery_state, plan.reused_state, plan.blocking) == (
        RecoveryAction.RESTART_SAMPLING,
        None,
        False,
        False,
    )
    assert plan.skipped == (("trajectories", "missing"), ("prompt_queue", "invalidated"))


def test_a_state_recorded_again_after_an_invalidation_is_trusted_again(ws: Workspace, active: Ledger) -> None:
    queue = _saved(ws, "queue.jsonl")
    active.record_trusted_state("grpo-v7", "prompt_queue", queue)
    active.invalidate_trusted_state("grpo-v7", "prompt_queue")
    assert active.fail_stage("grpo-v7", "sampling").plan.skipped == (("prompt_queue", "invalidated"),)
    active.record_trusted_state("grpo-v7", "prompt_queue", queue)
    assert active.fail_stage("grpo-v7", "sampling").plan.recovery_state == "prompt_queue"


def test_update_restores_the_pre_update_checkpoint(ws: Workspace, active: Ledger) -> None:
    checkpoint = ws.adapter("ckpt")
    active.record_trusted_state("grpo-v7", "pre_update_checkpoint", checkpoint)
    plan = active.fail_stage("grpo-v7", "update").plan
    assert plan.action is RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT
    assert (plan.path, plan.sha256, plan.skipped) == (str(checkpoint), hash_directory(checkpoint), ())


@pytest.mark.parametrize("stage", ["update", "artifact_validation"])
def test_rollback_to_the_active_baseline(ws: Workspace, active: Ledger, stage: str) -> None:
    """Without a recorded baseline state, the active SFT baseline's adapter is the verified baseline."""
    plan = active.fail_stage("grpo-v7", stage).plan
    adapter = _baseline_adapter(ws)
    assert plan.action is RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE and plan.recovery_state == "verified_baseline"
    assert Path(str(plan.path)).resolve() == adapter.resolve() and plan.sha256 == hash_directory(adapter)
    assert plan.skipped == ((("pre_update_checkpoint", "not_recorded"),) if stage == "update" else ())


@pytest.mark.parametrize(
    ("stage", "action", "skipped"),
    [
        (
            "update",
            RecoveryAction.BLOCK_UPDATE,
            (("pre_update_checkpoint", "not_recorded"), ("verified_baseline", "hash_changed")),
        ),
        ("artifact_validation", RecoveryAction.BLOCK_RELEASE, (("verified_baseline", "hash_changed"),)),
    ],
)
def test_blocking_fallbacks_reject(
    ws: Workspace, active: Ledger, stage: str, action: RecoveryAction, skipped: tuple[tuple[str, str], ...]
) -> None:
    weights = next(p for p in _baseline_adapter(ws).iterdir() if p.name != "adapter_config.json")
    weights.write_bytes(b"tampered")
    result = active.fail_stage("grpo-v7", stage)
    assert result.state is State.REJECT and result.candidate.reason_codes == (action.value,)
    assert (result.plan.action, result.plan.blocking, result.plan.reused_state) == (action, True, False)
    assert (result.plan.path, result.plan.sha256, result.plan.skipped) == (None, None, skipped)


def test_a_missing_baseline_adapter_is_missing(ws: Workspace, active: Ledger) -> None:
    shutil.rmtree(_baseline_adapter(ws))
    plan = active.fail_stage("grpo-v7", "artifact_validation").plan
    assert plan.skipped == (("verified_baseline", "missing"),)


def test_a_retried_fail_returns_its_own_plan_and_the_query_returns_the_latest(ws: Workspace, active: Ledger) -> None:
    """A retried key answers with the plan it recorded, even after a later plan; `recovery_plan` is the latest."""
    first = active.fail_stage("grpo-v7", "sampling", event_id="run/1/fail")
    active.record_trusted_state("grpo-v7", "prompt_queue", _saved(ws, "queue.jsonl"))
    later = active.fail_stage("grpo-v7", "sampling")
    retried = active.fail_stage("grpo-v7", "sampling", event_id="run/1/fail")
    assert retried.duplicate and not retried.appended and retried.plan == first.plan
    assert later.plan.action is RecoveryAction.RETRY_SAMPLING_FROM_PROMPT_QUEUE
    assert active.recovery_plan("grpo-v7") == later.plan


def test_results_are_typed_without_asserts(ws: Workspace, active: Ledger) -> None:
    """Candidate results carry a candidate and a `State`; a candidate that never failed has no plan."""
    result = active.check("grpo-v7")
    assert isinstance(result, CandidateResult) and result.state is State.VERIFIED
    assert result.candidate_id == "grpo-v7" and result.appended
    assert active.recovery_plan("grpo-v7") is None


def test_log_lines_carry_candidate_version_event_id_and_action(ws: Workspace, active: Ledger) -> None:
    """Every line a command logs names the candidate, the stream version and the event id; a plan's its action."""
    import structlog

    with structlog.testing.capture_logs() as logs:
        active.fail_stage("grpo-v7", "sampling", event_id="run-3/0007/fail-sampling")
    appended = [line for line in logs if line["event"] == "event_appended"]
    assert [(line["candidate_id"], line["version"], line["event_id"]) for line in appended] == [
        ("grpo-v7", 2, "run-3/0007/fail-sampling"),
        ("grpo-v7", 3, "run-3/0007/fail-sampling/1"),
    ]
    assert appended[1]["action"] == "rebuild_prompt_queue" and "action" not in appended[0]
    (decision,) = [line for line in logs if line["event"] == "decision_recorded"]
    assert (decision["candidate_id"], decision["version"], decision["event_id"], decision["action"]) == (
        "grpo-v7",
        3,
        "run-3/0007/fail-sampling",
        "rebuild_prompt_queue",
    )
