"""DPO with LedgerCallback on a real (tiny) model: fault -> plan -> resume -> hand-off, and every other plan."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from lifecycle_fsm import IllegalCommandError, InputError, RecoveryAction, State
from lifecycle_fsm.artifacts import hash_directory
from trainer.support import Tiny, baseline_ledger, dpo_trainer, events_of, fail_at, require_training_stack

require_training_stack()


def _recorded(ledger: object, cid: str) -> list[tuple[str, str, str]]:
    """(event id, path, sha256) of each trusted state recorded, in order."""
    return [(e.event_id, e.event.path, e.event.sha256) for e in events_of(ledger, cid, "TrustedStateRecorded")]


def test_a_fault_is_planned_resumed_and_the_candidate_handed_off(tiny: Tiny, tmp_path: Path) -> None:
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-1")
    trainer = dpo_trainer(tiny, tmp_path / "out", [fail_at(3), cb])
    assert cb.train(trainer).global_step == 4
    result = cb.finish(trainer, decision="accept")
    assert result.state is State.READY, result.candidate.reason_codes

    out = tmp_path / "out"
    assert _recorded(ledger, "dpo-1") == [
        ("dpo-1/attempt-1/step-2/checkpoint", str(out / "checkpoint-2"), hash_directory(out / "checkpoint-2")),
        ("dpo-1/attempt-2/step-4/checkpoint", str(out / "checkpoint-4"), hash_directory(out / "checkpoint-4")),
    ]
    (planned,) = events_of(ledger, "dpo-1", "RecoveryPlanned")
    assert (planned.event.stage, planned.event.action) == ("update", RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT)
    assert planned.event.trusted_states["pre_update_checkpoint"]["path"] == str(out / "checkpoint-2")
    adapter = result.candidate.candidate
    assert adapter["adapter_sha256"] == hash_directory(out / "candidate-adapter")
    assert adapter["source_policy_version"] == hash_directory(tiny.sft)
    # finish again once handed off, the model changed since: nothing is saved over the adapter handed off.
    import torch

    with torch.no_grad():
        next(p for p in trainer.model.parameters() if p.requires_grad).add_(0.5)
    adapter_sha = hash_directory(out / "candidate-adapter")
    assert cb.finish(trainer).state is State.READY
    assert hash_directory(out / "candidate-adapter") == adapter_sha
    events = ledger.store.head().seq
    with pytest.raises(InputError, match="received its adapter with decision 'accept'"):
        cb.finish(trainer, decision="reject")  # was answered READY, the reject silently lost
    assert ledger.store.head().seq == events and hash_directory(out / "candidate-adapter") == adapter_sha
    card = result.candidate.provenance  # recorded at registration, nothing written by hand
    assert card is not None and card == cb.card
    assert card["trainer"]["class"] == "trl.trainer.dpo_trainer.DPOTrainer"
    assert card["base_model"]["name"] == str(tiny.base) and card["dataset"]["fingerprint"]

    # Trained again under the same run id once handed off: refused before anything is written.
    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-1")
    head = ledger.store.head()
    with pytest.raises(IllegalCommandError, match="'dpo-1' is ready: its training is over"):
        again.train(dpo_trainer(tiny, tmp_path / "again", [again]))
    assert ledger.store.head() == head

    # Another candidate finished into the same folder would overwrite the adapter dpo-1 was handed off with.
    other = LedgerCallback(ledger, kind="dpo", run_id="dpo-other")
    adapter = hash_directory(out / "candidate-adapter")
    with pytest.raises(InputError, match="holds the adapter and manifest of 'dpo-1', not 'dpo-other'"):
        other.finish(trainer)
    with pytest.raises(InputError, match="finish\\(\\) fills adapter_sha256 itself"):
        cb.finish(trainer, adapter_sha256="0" * 64)
    assert hash_directory(out / "candidate-adapter") == adapter and ledger.store.head() == head


@pytest.mark.slow
def test_a_restarted_run_records_its_re_saved_checkpoint_anew(tiny: Tiny, tmp_path: Path) -> None:
    """A killed run restarted under the same run id re-saves checkpoint-2 with other bytes: a new record
    (the next attempt's key), which the ledger now trusts; never the old hash kept as a silent duplicate."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="dpo-2")
    with pytest.raises(KeyboardInterrupt):  # not a training failure: nothing recorded, as a killed process
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(3), first]))
    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-2")
    again.train(dpo_trainer(tiny, tmp_path / "out", [again], learning_rate=1e-3))

    checkpoint = str(tmp_path / "out" / "checkpoint-2")
    records = [(key, sha) for key, path, sha in _recorded(ledger, "dpo-2") if path == checkpoint]
    assert [key for key, _ in records] == ["dpo-2/attempt-1/step-2/checkpoint", "dpo-2/attempt-2/step-2/checkpoint"]
    assert records[0][1] != records[1][1] == hash_directory(checkpoint)


def test_a_run_started_over_never_resumes_from_the_killed_runs_checkpoint(tiny: Tiny, tmp_path: Path) -> None:
    """Restarted without resume_from_checkpoint, training starts over: the killed run's checkpoints are not
    this run's state. They are invalidated (the reason in the log), so a failure before this run saves one
    rolls back to the SFT adapter instead of jumping onto the abandoned run's step 4."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="dpo-6")
    with pytest.raises(KeyboardInterrupt):
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(5), first], max_steps=6))
    assert "pre_update_checkpoint" in ledger.candidate("dpo-6").trusted_states
    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-6")
    again.train(dpo_trainer(tiny, tmp_path / "out", [fail_at(1), again]))
    (invalidated,) = events_of(ledger, "dpo-6", "TrustedStateInvalidated")
    assert invalidated.event.reason == "training started over without resume_from_checkpoint"
    (planned,) = events_of(ledger, "dpo-6", "RecoveryPlanned")
    assert planned.event.action == RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE


def test_resume_true_passes_over_a_recorded_checkpoint_rotated_away(tiny: Tiny, tmp_path: Path) -> None:
    """checkpoint-4 recorded then gone (save_total_limit, or removed by hand): resume_from_checkpoint=True
    resumes from checkpoint-2, recorded and intact; with none left it says so (it was an ArtifactError about
    the gone folder)."""
    import shutil as sh

    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="dpo-7")
    with pytest.raises(KeyboardInterrupt):
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(5), first], max_steps=6))
    sh.rmtree(tmp_path / "out" / "checkpoint-4")
    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-7")
    assert again.train(dpo_trainer(tiny, tmp_path / "out", [again]), resume_from_checkpoint=True).global_step == 4
    for step in (2, 4):
        sh.rmtree(tmp_path / "out" / f"checkpoint-{step}")
    with pytest.raises(InputError, match="holds no checkpoint of candidate 'dpo-7' to resume from \\(recorded, now"):
        again.train(dpo_trainer(tiny, tmp_path / "out", [again]), resume_from_checkpoint=True)


def _interrupt_at(step: int) -> object:
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: object, state: object, control: object, **kwargs: object) -> None:
            if state.global_step == step:  # type: ignore[attr-defined]
                raise KeyboardInterrupt

    return Interrupt()


def test_a_fault_before_any_checkpoint_restarts_from_the_sft_adapter(tiny: Tiny, tmp_path: Path) -> None:
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-3")
    trainer = dpo_trainer(tiny, tmp_path / "out", [fail_at(1), cb])
    assert cb.train(trainer).global_step == 4
    (planned,) = events_of(ledger, "dpo-3", "RecoveryPlanned")
    assert planned.event.action == RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE
    assert [key for key, _, _ in _recorded(ledger, "dpo-3")] == [
        "dpo-3/attempt-2/step-2/checkpoint",
        "dpo-3/attempt-2/step-4/checkpoint",
    ]


def test_a_recovery_the_trainer_cannot_follow_is_not_recorded_as_completed(tiny: Tiny, tmp_path: Path) -> None:
    """A rollback to the SFT adapter needs a PEFT model: when loading it fails, the ledger must not say the
    candidate resumed (it said so before the load); it stays recovering, its plan left for a restart."""
    from transformers import AutoModelForCausalLM
    from trl import DPOTrainer

    from examples.tiny_model import dpo_config, preference_data, tokenizer
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-full")
    trainer = DPOTrainer(
        model=AutoModelForCausalLM.from_pretrained(tiny.base),
        args=dpo_config(tmp_path / "out"),
        train_dataset=preference_data(),
        processing_class=tokenizer(tiny.base),
        callbacks=[fail_at(1), cb],
    )
    with pytest.raises(TypeError, match="needs a PEFT model"):
        cb.train(trainer)
    assert events_of(ledger, "dpo-full", "RecoveryCompleted") == []
    assert ledger.candidate("dpo-full").state is State.RECOVERING


def test_a_blocking_plan_stops_training_and_rejects(tiny: Tiny, tmp_path: Path) -> None:
    """No checkpoint yet and the baseline's bytes changed: block_update, the candidate is rejected."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback, TrainingStopped

    sft = Path(shutil.copytree(tiny.sft, tmp_path / "sft"))
    ledger = baseline_ledger(tmp_path, sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-4")
    trainer = dpo_trainer(tiny, tmp_path / "out", [fail_at(1), cb], sft=sft)
    (sft / "adapter_config.json").write_text("{}")
    with pytest.raises(TrainingStopped, match="block_update") as stopped:
        cb.train(trainer)
    assert isinstance(stopped.value.__cause__, RuntimeError)
    assert ledger.candidate("dpo-4").state is State.REJECT
    with pytest.raises(IllegalCommandError, match="'dpo-4' is reject \\(block_update\\), which is final"):
        cb.finish(trainer)
    assert not (tmp_path / "out" / "candidate-adapter").exists()


@pytest.mark.slow
def test_attempts_are_bounded_and_a_restart_follows_the_plan_left(tiny: Tiny, tmp_path: Path) -> None:
    """Failing every time: each failure is recorded and the last plan is left in the ledger; the run
    restarted under the same run id follows it before training."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback, TrainingStopped

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-5", max_attempts=2)
    with pytest.raises(TrainingStopped, match="failed 2 times"):
        cb.train(dpo_trainer(tiny, tmp_path / "out", [fail_at(3, always=True), cb]))
    assert len(events_of(ledger, "dpo-5", "StageFailed")) == 2
    assert len(events_of(ledger, "dpo-5", "RecoveryCompleted")) == 1
    assert ledger.candidate("dpo-5").state is State.RECOVERING

    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-5")
    trainer = dpo_trainer(tiny, tmp_path / "out", [again])
    assert again.train(trainer).global_step == 4
    (left,) = again.resumed
    assert (left.plan.action, left.checkpoint) == (
        RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT,
        str(tmp_path / "out" / "checkpoint-2"),
    )
    assert again.finish(trainer, decision="accept").state is State.READY


@pytest.mark.slow
def test_a_restart_resumes_only_from_a_checkpoint_the_ledger_trusts(tiny: Tiny, tmp_path: Path) -> None:
    """A run killed after checkpoint-2 was recorded, restarted with resume_from_checkpoint: edited bytes, or a
    folder the ledger never recorded, are refused before anything is appended; the recorded bytes resume."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="dpo-6")
    with pytest.raises(KeyboardInterrupt):
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(3), first]))
    weights = tmp_path / "out" / "checkpoint-2" / "adapter_model.safetensors"
    original = weights.read_bytes()
    weights.write_bytes(original[:-1] + bytes([original[-1] ^ 1]))
    again = LedgerCallback(ledger, kind="dpo", run_id="dpo-6")
    head = ledger.store.head()
    with pytest.raises(InputError, match="its bytes changed since the ledger recorded them"):
        again.train(dpo_trainer(tiny, tmp_path / "out", [again]), resume_from_checkpoint=True)
    with pytest.raises(InputError, match="not a checkpoint the ledger recorded for candidate 'dpo-6'"):
        again.train(dpo_trainer(tiny, tmp_path / "out", [again]), resume_from_checkpoint=str(tmp_path / "out"))
    assert ledger.store.head() == head
    weights.write_bytes(original)
    (tmp_path / "link").symlink_to(tmp_path / "out")  # the folder recorded, named through a link
    resumed = again.train(
        dpo_trainer(tiny, tmp_path / "out", [again]), resume_from_checkpoint=str(tmp_path / "link" / "checkpoint-2")
    )
    assert resumed.global_step == 4
    assert [key for key, _, _ in _recorded(ledger, "dpo-6")] == [
        "dpo-6/attempt-1/step-2/checkpoint",
        "dpo-6/attempt-2/resumed",  # the checkpoint resumed from, the latest trusted again once loaded
        "dpo-6/attempt-2/step-4/checkpoint",  # resumed at step 2: checkpoint-2 not saved again
    ]
    trainer = dpo_trainer(tiny, tmp_path / "out", [again])
    with pytest.raises(InputError, match="its source_policy_version is 'another-sft', the registration says"):
        again.finish(trainer, source_policy_version="another-sft")  # a field finish fills, overridden
    assert again.finish(trainer).state is State.READY
