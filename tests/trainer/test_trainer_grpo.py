"""GRPO with LedgerCallback: a reward fault and a generation fault are planned as their stages and resumed."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from lifecycle_fsm import RecoveryAction, State
from trainer.support import Tiny, baseline_ledger, events_of, require_training_stack

require_training_stack()


def test_reward_and_generation_faults_are_their_stages_and_resume(tiny: Tiny, tmp_path: Path) -> None:
    """Step 3's reward fails, then step 4's generation: two plans, each resumed from checkpoint-2."""
    from trl import GRPOTrainer

    from examples.tiny_model import grpo_config, policy, prompt_data, tokenizer
    from lifecycle_fsm.integrations.transformers import LedgerCallback

    ledger = baseline_ledger(tmp_path, tiny.sft)
    cb = LedgerCallback(ledger, kind="grpo", run_id="grpo-1")
    faults = {"reward": 2, "sampling": 3}  # the global step at which each stage fails once

    def length_reward(completions: list[Any], trainer_state: Any, **kwargs: Any) -> list[float]:
        if faults.get("reward") == trainer_state.global_step:
            del faults["reward"]
            raise ValueError("injected fault in the reward function")
        return [float(len(str(c).split())) for c in completions]

    trainer = GRPOTrainer(
        model=policy(tiny.base, tiny.sft),
        args=grpo_config(tmp_path / "out"),
        train_dataset=prompt_data(),
        processing_class=tokenizer(tiny.base),
        reward_funcs=cb.reward_function(length_reward),
        callbacks=[cb],
    )
    assert trainer.reward_func_names == ["length_reward"]  # the wrapper keeps the function's name
    generate = trainer._generate

    def failing_generate(*args: Any, **kwargs: Any) -> Any:
        if "reward" not in faults and faults.get("sampling") == trainer.state.global_step:
            del faults["sampling"]
            raise RuntimeError("injected fault in generation")
        return generate(*args, **kwargs)

    trainer._generate = failing_generate
    cb.generation_hook(trainer)

    assert cb.train(trainer).global_step == 4
    assert faults == {}
    stages = [e.event.stage for e in events_of(ledger, "grpo-1", "StageFailed")]
    plans = [e.event.action for e in events_of(ledger, "grpo-1", "RecoveryPlanned")]
    assert stages == ["reward", "sampling"]
    assert plans == [RecoveryAction.RESTART_SAMPLING, RecoveryAction.REBUILD_PROMPT_QUEUE]

    result = cb.finish(trainer, decision="accept", verifier_version="length-v1")
    assert result.state is State.READY, result.candidate.reason_codes
    assert result.candidate.candidate["evidence_window_index"] == 1  # the window active when training began
