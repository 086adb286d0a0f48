"""Checkpoints are hashed off the training thread; a record that fails is raised at the next boundary."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from lifecycle_fsm import ArtifactError, Ledger, LifecycleError
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.integrations.recorder import on_main
from trainer.support import Tiny, baseline_ledger, events_of, require_training_stack

require_training_stack()
if TYPE_CHECKING:
    from lifecycle_fsm.integrations.transformers import LedgerCallback

MIB = 1024 * 1024


def _begun(ledger: Ledger, output: Path, run_id: str) -> tuple[LedgerCallback, Any, Any, Any]:
    """A callback whose training began (candidate registered), with the arguments a Trainer passes."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from lifecycle_fsm.integrations.transformers import LedgerCallback

    cb = LedgerCallback(ledger, kind="dpo", run_id=run_id)
    args = TrainingArguments(output_dir=str(output), use_cpu=True, report_to=[])
    state, control = TrainerState(), TrainerControl()
    cb.on_train_begin(args, state, control)
    return cb, args, state, control


def _checkpoint(output: Path, step: int, size: int) -> Path:
    folder = output / f"checkpoint-{step}"
    folder.mkdir(parents=True)
    block = os.urandom(MIB)
    with (folder / "model.safetensors").open("wb") as f:
        for _ in range(size // MIB):
            f.write(block)
    return folder


def test_on_save_returns_before_a_256_mib_checkpoint_is_hashed(tiny: Tiny, tmp_path: Path) -> None:
    """The save hook queues the record and returns: under 50 ms, the record not yet made (hashing 256 MiB takes
    most of a second here); the end of training waits for it, and it holds the checkpoint's true hash."""
    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb, args, state, control = _begun(ledger, tmp_path / "out", "run-1")
    state.global_step = 2
    folder = _checkpoint(tmp_path / "out", 2, 256 * MIB)

    started = time.perf_counter()
    cb.on_save(args, state, control)
    elapsed = time.perf_counter() - started
    recorded_on_return = events_of(ledger, "run-1", "TrustedStateRecorded")
    cb.on_train_end(args, state, control)

    print(f"on_save with a 256 MiB checkpoint returned in {elapsed * 1000:.1f} ms")
    assert recorded_on_return == []
    assert elapsed < 0.05
    (record,) = events_of(ledger, "run-1", "TrustedStateRecorded")
    assert (record.event.path, record.event.sha256) == (str(folder), hash_directory(folder))
    assert record.event_id == "run-1/attempt-1/step-2/checkpoint"


def test_a_record_that_failed_is_raised_at_the_next_boundary_once(tiny: Tiny, tmp_path: Path) -> None:
    """A checkpoint the ledger refuses to hash (a link leading out of it) does not fail the save; the next
    save raises it, naming the checkpoint, and it is not raised twice."""
    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb, args, state, control = _begun(ledger, tmp_path / "out", "run-2")
    state.global_step = 2
    folder = _checkpoint(tmp_path / "out", 2, MIB)
    (folder / "outside").symlink_to(tmp_path / "ledger.db")
    cb.on_save(args, state, control)
    state.global_step = 4
    _checkpoint(tmp_path / "out", 4, MIB)
    control.should_save = True
    cb.on_step_end(args, state, control)  # waits for the record before the next save
    with pytest.raises(ArtifactError) as raised:
        cb.on_save(args, state, control)
    assert any(str(folder) in note for note in raised.value.__notes__)
    cb.on_train_end(args, state, control)  # raised once: nothing left
    assert events_of(ledger, "run-2", "TrustedStateRecorded") == []


def test_a_missing_checkpoint_folder_is_an_error(tiny: Tiny, tmp_path: Path) -> None:
    from lifecycle_fsm import InputError

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb, args, state, control = _begun(ledger, tmp_path / "out", "run-3")
    state.global_step = 6
    with pytest.raises(InputError, match="no checkpoint folder"):
        cb.on_save(args, state, control)


def test_a_ledger_the_recorder_cannot_open_fails_every_record_it_was_given(tmp_path: Path) -> None:
    from lifecycle_fsm.integrations.recorder import PendingRecord, TrustedStateRecorder

    recorder = TrustedStateRecorder(tmp_path / "no-such-folder" / "ledger.db", actor="t", artifact_root=None)
    recorder.submit(PendingRecord("c", "pre_update_checkpoint", str(tmp_path), "r/attempt-1/step-2/checkpoint"))
    with pytest.raises(LifecycleError) as raised:
        recorder.close()
    assert "r/attempt-1/step-2/checkpoint" in raised.value.__notes__[-1]
    recorder.close()  # raised once; closing again is quiet


def test_on_main_in_one_process_runs_the_step() -> None:
    assert on_main(True, lambda: 7) == 7


def test_the_last_save_and_an_epoch_save_wait_for_the_records(tiny: Tiny, tmp_path: Path) -> None:
    """The Trainer's clean-up after the last save, and an epoch's save, may remove checkpoints: the record
    of the last save is made before on_save returns, and an epoch that saves waits for the ones queued."""
    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb, args, state, control = _begun(ledger, tmp_path / "out", "run-4")
    state.max_steps, state.global_step = 4, 2
    _checkpoint(tmp_path / "out", 2, MIB)
    cb.on_save(args, state, control)  # not the last: queued
    control.should_save = True
    cb.on_epoch_end(args, state, control)
    assert len(events_of(ledger, "run-4", "TrustedStateRecorded")) == 1
    state.global_step = 4
    _checkpoint(tmp_path / "out", 4, MIB)
    cb.on_save(args, state, control)
    assert len(events_of(ledger, "run-4", "TrustedStateRecorded")) == 2
    # A save by the best metric comes right after an evaluation; the clean-up after the last log.
    state.max_steps, state.global_step = 10, 6
    _checkpoint(tmp_path / "out", 6, 32 * MIB)  # long enough to hash that only a wait sees it recorded
    cb.on_save(args, state, control)
    cb.on_evaluate(args, state, control)
    assert len(events_of(ledger, "run-4", "TrustedStateRecorded")) == 3
    state.global_step = 8
    _checkpoint(tmp_path / "out", 8, 32 * MIB)
    cb.on_save(args, state, control)
    control.should_training_stop = True  # an early stop: the last log before the clean-up
    cb.on_log(args, state, control)
    assert len(events_of(ledger, "run-4", "TrustedStateRecorded")) == 4


def test_a_checkpoint_removed_before_its_record_is_skipped_not_a_failure(tiny: Tiny, tmp_path: Path) -> None:
    """Bytes the ledger never recorded are never trusted; the training is not failed for a checkpoint the
    Trainer rotated away while its record waited."""
    from lifecycle_fsm.integrations.recorder import PendingRecord, TrustedStateRecorder

    ledger = baseline_ledger(tmp_path, tiny.sft)
    _begun(ledger, tmp_path / "out", "run-5")
    recorder = TrustedStateRecorder(tmp_path / "ledger.db", actor="t", artifact_root=None)
    gone = PendingRecord("run-5", "pre_update_checkpoint", str(tmp_path / "out" / "checkpoint-2"), "run-5/k")
    recorder.submit(gone)
    recorder.close()  # nothing raised
    assert recorder.skipped == [gone] and events_of(ledger, "run-5", "TrustedStateRecorded") == []


def test_the_card_fingerprints_the_dataset_given(tiny: Tiny, tmp_path: Path) -> None:
    """TRL trains on a tokenized copy whose fingerprint `datasets` may draw at random: the dataset given to
    the callback is the one its card names, so two runs on the same data record the same card."""
    from transformers import TrainerControl, TrainerState, TrainingArguments

    from examples.tiny_model import preference_data
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    data = preference_data()
    cb = LedgerCallback(ledger, kind="dpo", run_id="run-6", dataset=data)
    args = TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[])
    cb.on_train_begin(args, TrainerState(), TrainerControl())
    assert cb.card is not None and cb.card["dataset"]["fingerprint"] == data._fingerprint
    assert ledger.candidate("run-6").provenance == cb.card
