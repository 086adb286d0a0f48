"""A DPO run recorded in the ledger: a fault, the recovery plan, the resume, the hand-off.

    python examples/trl_dpo.py WORKDIR

Builds a tiny model in WORKDIR, a new or empty folder (nothing is downloaded), makes its SFT adapter the
active baseline, trains a DPO candidate with `LedgerCallback` while a fault is injected
at step 3, resumes from the checkpoint the ledger's plan names, and hands the
candidate off. Prints the candidate's path through the ledger; exits 0 when it is
ready for evaluation. Needs the `trainer` extra.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from tiny_model import build_base_model, dpo_config, policy, preference_data, sft_adapter, tokenizer
from transformers import TrainerCallback
from trl import DPOTrainer

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.integrations.transformers import LedgerCallback
from lifecycle_fsm.manifests import write_manifest
from lifecycle_fsm.replay.drills.workspace import baseline_manifest


class FaultAtStep3(TrainerCallback):  # type: ignore[misc]  # transformers' classes are untyped
    """Stands in for a real failure in the update (a NaN loss, a lost device) once, at step 3."""

    fired = False

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.global_step == 3 and not self.fired:
            self.fired = True
            raise RuntimeError("injected fault in the update at step 3")


def main(workdir: Path) -> int:
    base = build_base_model(workdir / "base")
    sft = sft_adapter(base, workdir / "sft-adapter")
    baseline = baseline_manifest(hash_directory(sft), adapter_path="sft-adapter")  # its sha256: the policy version
    sft_manifest = write_manifest(workdir / "sft-manifest.json", baseline)
    with Ledger.open(workdir / "ledger.db") as ledger:
        ledger.init()
        ledger.activate_baseline(sft_manifest)
        ledger.activate_evaluation("eval-v1")

        data = preference_data()
        cb = LedgerCallback(ledger, kind="dpo", run_id="dpo-example-1", dataset=data)  # the card names `data`
        trainer = DPOTrainer(
            model=policy(base, sft),
            args=dpo_config(workdir / "run"),
            train_dataset=data,
            processing_class=tokenizer(base),
            callbacks=[FaultAtStep3(), cb],
        )
        cb.train(trainer)
        result = cb.finish(trainer, decision="accept")

        for event in ledger.events(stream=cb.candidate_id):
            print(f"{event.seq:>3}  {event.type:<22} {event.event_id}")
        for point in cb.resumed:
            print(f"recovery plan: {point.plan.action} from {point.plan.path}; the trainer: {point.action}")
        print(f"candidate {cb.candidate_id}: {result.state}")
        return 0 if result.state is State.READY else 1


if __name__ == "__main__":
    workdir = Path(sys.argv[1]) if len(sys.argv) == 2 else None
    if workdir is None or (workdir.exists() and any(workdir.iterdir())):  # a used one: handed off already
        why = "" if workdir is None else f" ({workdir} holds an earlier run: give a new folder)"
        print(f"usage: python examples/trl_dpo.py WORKDIR{why}", file=sys.stderr)
        sys.exit(2)  # as the other examples' usage errors
    sys.exit(main(workdir))
