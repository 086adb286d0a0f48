"""Which stage failed, and from a recorded recovery plan to a trainer action (each resume point checked)."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifecycle_fsm import InputError, Ledger, RecoveryAction
from lifecycle_fsm.integrations.recovery import TRAINER_ACTIONS, StageTracker, TrainerAction, resume_point
from tests.conftest import Workspace
from trainer.support import require_training_stack

require_training_stack()


def test_every_recovery_action_has_a_trainer_action() -> None:
    assert set(TRAINER_ACTIONS) == set(RecoveryAction)
    assert {a for a, t in TRAINER_ACTIONS.items() if t is TrainerAction.STOP} == {
        RecoveryAction.BLOCK_UPDATE,
        RecoveryAction.BLOCK_RELEASE,
    }


def test_the_docstring_table_is_the_code() -> None:
    """The plan -> trainer action table users read is the one `resume_point` follows."""
    from lifecycle_fsm.integrations import recovery

    assert recovery.__doc__ is not None
    wording = {
        TrainerAction.RESUME_FROM_PLAN: "resume from the checkpoint the plan names",
        TrainerAction.RESUME_FROM_LATEST: "resume from the latest trusted checkpoint",
        TrainerAction.RESTART_FROM_BASELINE: "load the SFT baseline's adapter",
        TrainerAction.STOP: "stop",
    }
    for action, trainer_action in TRAINER_ACTIONS.items():
        row = next(line for line in recovery.__doc__.splitlines() if f"`{action}`" in line)
        assert wording[trainer_action] in row.split("|")[2], row


def _candidate(ws: Workspace, ledger: Ledger) -> str:
    ledger.init()
    ledger.activate_baseline(ws.baseline())
    return ledger.receive(ws.grpo()).candidate_id


def _checkpoint(ws: Workspace, ledger: Ledger, cid: str) -> Path:
    folder = ws.adapter("checkpoint-2")
    ledger.record_trusted_state(cid, "pre_update_checkpoint", folder)
    return folder


def test_update_failure_resumes_from_the_checkpoint_the_plan_names(ws: Workspace, ledger: Ledger) -> None:
    cid = _candidate(ws, ledger)
    folder = _checkpoint(ws, ledger, cid)
    failed = ledger.fail_stage(cid, "update")
    point = resume_point(failed.plan, ledger.settings())
    assert (point.action, point.checkpoint) == (TrainerAction.RESUME_FROM_PLAN, str(folder))


def test_reward_failure_resumes_from_the_latest_trusted_checkpoint(ws: Workspace, ledger: Ledger) -> None:
    """TRL keeps no trajectories or prompt queue: the weights to go on from are the latest checkpoint."""
    cid = _candidate(ws, ledger)
    folder = _checkpoint(ws, ledger, cid)
    failed = ledger.fail_stage(cid, "reward")
    assert failed.plan.action is RecoveryAction.RESTART_SAMPLING
    point = resume_point(failed.plan, ledger.settings())
    assert (point.action, point.checkpoint) == (TrainerAction.RESUME_FROM_LATEST, str(folder))


def test_a_changed_latest_checkpoint_is_not_resumed_from(ws: Workspace, ledger: Ledger) -> None:
    """Its bytes no longer match the record: training starts over from the SFT adapter instead."""
    cid = _candidate(ws, ledger)
    folder = _checkpoint(ws, ledger, cid)
    (folder / "adapter_model.safetensors").write_bytes(b"other bytes")
    failed = ledger.fail_stage(cid, "sampling")
    point = resume_point(failed.plan, ledger.settings())
    assert point.action is TrainerAction.RESTART_FROM_BASELINE
    assert point.baseline_adapter == str(ws.root / "sft" / "adapter")
    assert "its bytes changed" in point.why


def test_no_checkpoint_yet_restarts_from_the_baseline(ws: Workspace, ledger: Ledger) -> None:
    cid = _candidate(ws, ledger)
    failed = ledger.fail_stage(cid, "update")
    assert failed.plan.action is RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE
    point = resume_point(failed.plan, ledger.settings())
    assert (point.action, point.baseline_adapter) == (TrainerAction.RESTART_FROM_BASELINE, failed.plan.path)


def test_a_blocking_plan_stops(ws: Workspace, ledger: Ledger) -> None:
    cid = _candidate(ws, ledger)
    (ws.root / "sft" / "adapter" / "adapter_model.safetensors").write_bytes(b"tampered")
    failed = ledger.fail_stage(cid, "update")
    assert failed.plan.action is RecoveryAction.BLOCK_UPDATE
    assert resume_point(failed.plan, ledger.settings()).action is TrainerAction.STOP


@pytest.mark.parametrize(
    ("arguments", "named"),
    [
        ({"kind": "ppo", "run_id": "r"}, "unknown candidate kind"),
        ({"kind": "dpo", "run_id": " "}, "run_id"),
        ({"kind": "dpo", "run_id": "r", "max_attempts": 0}, "max_attempts"),
    ],
)
def test_callback_arguments_are_checked(ledger: Ledger, arguments: dict[str, object], named: str) -> None:
    from lifecycle_fsm import InputError
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    with pytest.raises(InputError, match=named):
        LedgerCallback(ledger, **arguments)  # type: ignore[arg-type]


def test_a_wrapped_function_names_the_stage_of_its_failure() -> None:
    """The first wrapped function that raised names the stage; plain and async functions keep their names."""
    import asyncio

    stages = StageTracker()

    def score(x: int) -> int:
        return 10 // x

    async def generate(x: int) -> int:
        return 10 // x

    staged_score, staged_generate = stages.wrap("reward", score), stages.wrap("sampling", generate)
    assert (staged_score.__name__, staged_generate.__name__) == ("score", "generate")
    assert staged_score(2) == 5 and asyncio.run(staged_generate(5)) == 2 and stages.failed is None
    with pytest.raises(ZeroDivisionError):
        asyncio.run(staged_generate(0))
    with pytest.raises(ZeroDivisionError):
        staged_score(0)
    assert stages.failed == "sampling"


def test_the_integrations_package_alone_loads_no_training_library() -> None:
    import subprocess
    import sys

    code = "import sys, lifecycle_fsm.integrations; print([m for m in ('transformers', 'torch') if m in sys.modules])"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "[]"


@pytest.mark.parametrize("name", ["handoff", "provenance", "recorder", "recovery", "transformers"])
def test_each_integration_module_exports_a_sorted_all(name: str) -> None:
    import importlib

    module = importlib.import_module(f"lifecycle_fsm.integrations.{name}")
    assert list(module.__all__) == sorted(module.__all__)
    assert [n for n in module.__all__ if not hasattr(module, n)] == []


def test_a_baseline_adapter_whose_bytes_changed_is_never_loaded(ws: Workspace, ledger: Ledger) -> None:
    """A reward failure with no checkpoint starts over from the SFT adapter: re-hashed first, and a changed
    one stops training (an update failure's plan blocks it already)."""
    from lifecycle_fsm.integrations.recovery import checked

    cid = _candidate(ws, ledger)
    plan = ledger.fail_stage(cid, "reward").plan
    point = resume_point(plan, ledger.settings())
    assert point.action is TrainerAction.RESTART_FROM_BASELINE
    assert checked(point, ledger.artifact_root) == point
    (ws.root / "sft" / "adapter" / "adapter_model.safetensors").write_bytes(b"other bytes")
    stopped = checked(point, ledger.artifact_root)
    assert (stopped.action, stopped.baseline_adapter) == (TrainerAction.STOP, None)
    assert f"{ws.root / 'sft' / 'adapter'} is not what the ledger trusts" in stopped.why


def test_a_checkpoint_gone_since_the_plan_is_never_resumed_from(ws: Workspace, ledger: Ledger) -> None:
    import shutil

    from lifecycle_fsm.integrations.recovery import checked

    cid = _candidate(ws, ledger)
    folder = _checkpoint(ws, ledger, cid)
    point = resume_point(ledger.fail_stage(cid, "update").plan, ledger.settings())
    shutil.rmtree(folder)
    stopped = checked(point, ledger.artifact_root)
    assert stopped.action is TrainerAction.STOP and "no such file or directory" in stopped.why


def test_a_restart_on_a_plan_it_cannot_follow_stops_and_writes_nothing(ws: Workspace, ledger: Ledger) -> None:
    """The SFT adapter a plan falls back to changed (planning again cannot mend it), or the checkpoint it names
    is gone (a volume not mounted yet): each restart stops, never records a failure of its own nor blocks
    the candidate; once the volume is back the plan is followed."""
    import os

    from lifecycle_fsm.integrations.recovery import left_plan

    cid = _candidate(ws, ledger)
    ledger.fail_stage(cid, "reward")  # no checkpoint: the plan falls back to the SFT adapter
    adapter = ws.root / "sft" / "adapter" / "adapter_model.safetensors"
    original = adapter.read_bytes()
    adapter.write_bytes(b"other bytes")
    head = ledger.store.head()
    for _ in range(3):
        point = left_plan(ledger, cid, "run", "grpo", fresh=True)
        assert point is not None and point.action is TrainerAction.STOP
    assert ledger.store.head() == head and ledger.candidate(cid).state.value == "recovering"
    adapter.write_bytes(original)

    folder = _checkpoint(ws, ledger, cid)
    ledger.fail_stage(cid, "update")
    head = ledger.store.head()
    os.rename(folder, f"{folder}-away")
    point = left_plan(ledger, cid, "run", "grpo", fresh=True)
    assert point is not None and point.action is TrainerAction.STOP and "no such file" in point.why
    assert ledger.store.head() == head
    os.rename(f"{folder}-away", folder)
    point = left_plan(ledger, cid, "run", "grpo", fresh=True)
    assert point is not None and (point.action, point.checkpoint) == (TrainerAction.RESUME_FROM_PLAN, str(folder))
    with pytest.raises(InputError, match="exists as a grpo candidate, not dpo"):
        left_plan(ledger, cid, "run", "dpo", fresh=True)  # refused before anything is planned
    assert ledger.store.head() == head
