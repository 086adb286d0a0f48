"""Where a restarted or resumed run goes on from is what the ledger trusts, loaded before it is recorded."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm import RecoveryAction
from lifecycle_fsm.artifacts import hash_directory
from trainer.support import Tiny, baseline_ledger, dpo_trainer, events_of, fail_at, require_training_stack

require_training_stack()


def _began_at(ledger: Any, cid: str) -> Any:
    """A callback keeping the step each `trainer.train` began at (where the Trainer really resumed) and the
    candidate's state then (its checkpoint loaded, before the ledger's callback ran)."""
    from transformers import TrainerCallback

    class BeganAt(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.steps: list[int] = []
            self.states: list[str] = []

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.steps.append(state.global_step)
            self.states.append(ledger.candidate(cid).state.value)

    return BeganAt()


def test_a_plan_left_by_an_earlier_run_is_made_again_when_its_checkpoint_changed(tiny: Tiny, tmp_path: Path) -> None:
    """The attempts ran out; before the restart the checkpoint the plan names was edited: the restarted run
    plans again from what is intact (the SFT adapter here), never loads it, and records the recovery only
    once the trainer began where the new plan says. Removed instead, it stops with nothing written."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback, TrainingStopped

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="r1", max_attempts=1)
    with pytest.raises(TrainingStopped):
        first.train(dpo_trainer(tiny, tmp_path / "out", [fail_at(3), first]))
    checkpoint = tmp_path / "out" / "checkpoint-2"
    left = ledger.recovery_plan("r1")
    assert (left.action, left.path) == (RecoveryAction.RESTORE_PRE_UPDATE_CHECKPOINT, str(checkpoint))
    shutil.move(checkpoint, tmp_path / "away")  # gone (or on a volume not mounted yet): stop, write nothing
    head, gone = ledger.store.head(), LedgerCallback(ledger, kind="dpo", run_id="r1")
    with pytest.raises(TrainingStopped, match="no such file or directory"):
        gone.train(dpo_trainer(tiny, tmp_path / "out", [gone]))
    assert ledger.store.head() == head and ledger.candidate("r1").state.value == "recovering"
    shutil.move(tmp_path / "away", checkpoint)
    weights = checkpoint / "adapter_model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1] + b"\0")

    again, began = LedgerCallback(ledger, kind="dpo", run_id="r1"), _began_at(ledger, "r1")
    assert again.train(dpo_trainer(tiny, tmp_path / "out", [began, again])).global_step == 4
    assert began.steps == [0]  # from the SFT adapter, not the changed checkpoint's step 2
    assert began.states == ["recovering"]  # completed once the trainer is there, not before
    (_, planned) = events_of(ledger, "r1", "RecoveryPlanned")
    assert planned.event_id == f"r1/plan-{left.seq}/planned-again/1"
    assert planned.event.action == RecoveryAction.ROLLBACK_TO_VERIFIED_BASELINE
    (completed,) = events_of(ledger, "r1", "RecoveryCompleted")
    assert completed.event.resumed_from == str(tiny.sft)


def test_a_failure_after_an_explicit_resume_goes_back_to_where_it_resumed(tiny: Tiny, tmp_path: Path) -> None:
    """Killed after checkpoints 2, 4 and 6; restarted from checkpoint-2 by hand, then a fault: the plan goes
    back to checkpoint-2 (recorded again once loaded), not forward to the abandoned run's checkpoint-6."""
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="r7")
    with pytest.raises(KeyboardInterrupt):
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(7), first], max_steps=8))
    checkpoint = tmp_path / "out" / "checkpoint-2"
    again, began = LedgerCallback(ledger, kind="dpo", run_id="r7"), _began_at(ledger, "r7")
    trainer = dpo_trainer(tiny, tmp_path / "out", [began, fail_at(3), again], max_steps=8)
    assert again.train(trainer, resume_from_checkpoint=str(checkpoint)).global_step == 8
    assert (began.steps, began.states) == ([2, 2], ["received", "recovering"])
    (point,) = again.resumed
    assert point.checkpoint == str(checkpoint)
    resumed = [e for e in events_of(ledger, "r7", "TrustedStateRecorded") if e.event_id == "r7/attempt-2/resumed"]
    assert [(e.event.path, e.event.sha256) for e in resumed] == [(str(checkpoint), hash_directory(checkpoint))]


def test_a_checkpoint_is_recorded_once_every_other_on_save_wrote_into_it(tiny: Tiny, tmp_path: Path) -> None:
    """A callback listed after the ledger's writes into the checkpoint in its own on_save (extra state, a PEFT
    save recipe): the record holds the finished folder's hash, and a fault resumes from it."""
    from transformers import TrainerCallback

    from lifecycle_fsm.integrations.transformers import LedgerCallback

    class SaveExtra(TrainerCallback):  # type: ignore[misc]
        def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            time.sleep(0.2)
            Path(args.output_dir, f"checkpoint-{state.global_step}", "extra_state.bin").write_bytes(os.urandom(64))

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="dpo", run_id="r4")
    assert cb.train(dpo_trainer(tiny, tmp_path / "out", [fail_at(3), cb, SaveExtra()])).global_step == 4
    recorded = {e.event.path: e.event.sha256 for e in events_of(ledger, "r4", "TrustedStateRecorded")}
    assert recorded == {str(p): hash_directory(p) for p in sorted((tmp_path / "out").glob("checkpoint-*"))}
    (point,) = cb.resumed
    assert point.checkpoint == str(tmp_path / "out" / "checkpoint-2")


def _interrupt_at(step: int) -> Any:
    from transformers import TrainerCallback

    class Interrupt(TrainerCallback):  # type: ignore[misc]
        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step == step:
                raise KeyboardInterrupt

    return Interrupt()


def test_a_call_that_failed_before_train_begin_leaves_nothing_for_the_next(tiny: Tiny, tmp_path: Path) -> None:
    """A resume whose trainer failed before the ledger's on_train_begin (another callback raised there), then
    the same callback starting over: the abandoned checkpoint is not recorded as resumed from, and a failure
    goes back to the SFT adapter, not to the checkpoint start_over invalidated."""
    from transformers import TrainerCallback

    from lifecycle_fsm.integrations.transformers import LedgerCallback

    class BeginFailsOnce(TrainerCallback):  # type: ignore[misc]
        fired = False

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if not self.fired:
                self.fired = True
                raise RuntimeError("a logger could not connect")

    ledger = baseline_ledger(tmp_path, tiny.sft)
    first = LedgerCallback(ledger, kind="dpo", run_id="r")
    with pytest.raises(KeyboardInterrupt):
        first.train(dpo_trainer(tiny, tmp_path / "out", [_interrupt_at(5), first], max_steps=8))
    cb = LedgerCallback(ledger, kind="dpo", run_id="r")
    trainer = dpo_trainer(tiny, tmp_path / "out", [BeginFailsOnce(), cb], max_steps=8)
    with pytest.raises(RuntimeError, match="could not connect"):
        cb.train(trainer, resume_from_checkpoint=str(tmp_path / "out" / "checkpoint-4"))
    began = _began_at(ledger, "r")
    assert cb.train(dpo_trainer(tiny, tmp_path / "out2", [began, fail_at(1), cb], max_steps=8)).global_step == 8
    assert began.steps == [0, 0]
    assert not [e for e in events_of(ledger, "r", "TrustedStateRecorded") if e.event_id.endswith("/resumed")]
    (point,) = cb.resumed
    assert (point.checkpoint, point.baseline_adapter) == (None, str(tiny.sft))


def test_finish_refuses_before_it_saves_anything(tiny: Tiny, tmp_path: Path) -> None:
    """Before training, or with no evaluation version for its manifest: refused with nothing saved or appended
    (the adapter was saved first and the candidate left pending); given one, it hands off."""
    from lifecycle_fsm import InputError, Ledger, State
    from lifecycle_fsm.integrations.transformers import LedgerCallback
    from lifecycle_fsm.manifests import write_manifest
    from lifecycle_fsm.replay.drills.workspace import baseline_manifest

    ledger = Ledger.open(tmp_path / "ledger.db")
    ledger.init()
    sft = baseline_manifest(hash_directory(tiny.sft), adapter_path=str(tiny.sft))
    ledger.activate_baseline(write_manifest(tmp_path / "sft.json", sft))  # no evaluation version activated
    cb = LedgerCallback(ledger, kind="dpo", run_id="r9")
    trainer = dpo_trainer(tiny, tmp_path / "out", [cb])
    adapter = tmp_path / "out" / "candidate-adapter"
    with pytest.raises(InputError, match="before training"):
        cb.finish(trainer)
    cb.train(trainer)
    head = ledger.store.head()
    with pytest.raises(InputError, match="needs evaluation_version"):
        cb.finish(trainer)
    assert not adapter.exists() and ledger.store.head() == head
    assert cb.finish(trainer, evaluation_version="eval-v1").state is State.READY
