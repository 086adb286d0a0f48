"""One rank of the two-process DDP test: DPO with LedgerCallback under torchrun (gloo, CPU).

    torchrun --standalone --nproc_per_node 2 tests/trainer/ddp_worker.py WORKDIR BASE SFT

Every rank opens the ledger and calls `cb.train` and `cb.finish`; a fault is injected at
step 3 on every rank, and rank 1 writes its share of each checkpoint late. Each rank
writes `rank<N>.json`: what it saw in the checkpoint folder when its `on_save` began,
and the result.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from lifecycle_fsm import Ledger
from lifecycle_fsm.integrations.transformers import LedgerCallback
from trainer.support import Tiny, dpo_trainer, fail_at


class LookAtSave(TrainerCallback):  # type: ignore[misc]
    """Lists the checkpoint folder as this rank finds it on arrival, before LedgerCallback's barrier."""

    def __init__(self) -> None:
        self.seen: dict[int, list[str]] = {}

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        self.seen[state.global_step] = sorted(os.listdir(folder)) if folder.is_dir() else []


def _slow_down(trainer: Any) -> None:
    """Rank 1 writes its part of each checkpoint (its RNG state) a second late: without the barrier the
    main process would record the folder before that file is there."""
    save = trainer._save_rng_state

    def late(*args: Any, **kwargs: Any) -> None:
        time.sleep(1.0)
        save(*args, **kwargs)

    trainer._save_rng_state = late


def main(workdir: Path, base: Path, sft: Path) -> None:
    rank = int(os.environ["RANK"])
    look = LookAtSave()
    with Ledger.open(workdir / "ledger.db", synchronous="NORMAL") as ledger:
        cb = LedgerCallback(ledger, kind="dpo", run_id="ddp-1")
        trainer = dpo_trainer(
            Tiny(base=base, sft=sft),
            workdir / "out",
            [fail_at(3), look, cb],
            per_device_train_batch_size=2,
            ddp_backend="gloo",
        )
        if rank == 1:
            _slow_down(trainer)
        output = cb.train(trainer)
        result = cb.finish(trainer, decision="accept")
    report = {
        "rank": rank,
        "steps": output.global_step,
        "state": str(result.state),
        "seen": look.seen,
        "candidate_sha256": result.candidate.candidate.get("adapter_sha256"),
    }
    (workdir / f"rank{rank}.json").write_text(json.dumps(report))


if __name__ == "__main__":
    main(*(Path(a) for a in sys.argv[1:4]))
