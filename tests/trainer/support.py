"""What the trainer tests share: the stack check, the tiny model, a baseline ledger, trainers, faults."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path
from typing import Any

import attrs
import pytest

from lifecycle_fsm import Ledger
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.manifests import write_manifest
from lifecycle_fsm.replay.drills.workspace import baseline_manifest

INSTALL = "pip install -e '.[trainer]' 'torch==2.13.0'"
STACK = ("torch", "datasets", "peft", "transformers", "trl")


def require_training_stack() -> None:
    """Skip the calling test module without the training stack; under CI=true fail instead.

    Looked up, not imported: importing it takes seconds, and every xdist worker collects every module
    while one worker runs these (conftest.py gives tests/trainer to one worker). The tests import it."""
    missing = [name for name in STACK if importlib.util.find_spec(name) is None]
    if missing:
        message = f"the training stack is not installed (no {', '.join(missing)}); install it with: {INSTALL}"
        if os.environ.get("CI") == "true":
            pytest.fail(message + "; under CI=true this is a failure, not a skip", pytrace=False)
        pytest.skip(message, allow_module_level=True)


@attrs.frozen
class Tiny:
    base: Path
    sft: Path


def build_tiny(folder: Path) -> Tiny:
    from examples.tiny_model import build_base_model, sft_adapter

    base = build_base_model(folder / "base")
    return Tiny(base=base, sft=sft_adapter(base, folder / "sft"))


def baseline_ledger(root: Path, sft: Path, **open_options: Any) -> Ledger:
    """A ledger in `root` whose active baseline is the SFT adapter `sft`, evaluation `eval-v1`."""
    manifest = write_manifest(root / "sft-manifest.json", baseline_manifest(hash_directory(sft), adapter_path=str(sft)))
    ledger = Ledger.open(root / "ledger.db", synchronous="NORMAL", **open_options)
    ledger.init()
    ledger.activate_baseline(manifest)
    ledger.activate_evaluation("eval-v1")
    return ledger


def events_of(ledger: Ledger, candidate_id: str, type_name: str) -> list[Any]:
    return [e for e in ledger.events(stream=candidate_id) if e.type == type_name]


def fail_at(*steps: int, always: bool = False) -> Any:
    """A callback raising at the end of each given step (once, unless `always`): a fault in the update."""
    from transformers import TrainerCallback

    class FailAt(TrainerCallback):  # type: ignore[misc]
        def __init__(self) -> None:
            self.pending = list(steps)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if state.global_step in self.pending:
                if not always:
                    self.pending.remove(state.global_step)
                raise RuntimeError(f"injected fault at step {state.global_step}")

    return FailAt()


def dpo_trainer(tiny: Tiny, output: Path, callbacks: list[Any], sft: Path | None = None, **config: Any) -> Any:
    """A DPO trainer of the tiny policy (SFT adapter loaded, trainable) writing to `output`."""
    from trl import DPOTrainer

    from examples.tiny_model import dpo_config, policy, preference_data, tokenizer

    return DPOTrainer(
        model=policy(tiny.base, sft or tiny.sft),
        args=dpo_config(output, **config),
        train_dataset=preference_data(),
        processing_class=tokenizer(tiny.base),
        callbacks=callbacks,
    )
