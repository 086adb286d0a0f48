"""Two-process DDP (torchrun, gloo on the CPU): each complete checkpoint recorded once, with its true hash."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lifecycle_fsm import Ledger
from lifecycle_fsm.artifacts import hash_directory
from tests.conftest import REPO
from trainer.support import Tiny, baseline_ledger, events_of, require_training_stack

require_training_stack()


@pytest.mark.slow
def test_two_ranks_record_each_checkpoint_once_resume_together_and_share_the_result(tiny: Tiny, tmp_path: Path) -> None:
    """Each rank reaches on_save when its own files are written (rank 1 sees only its rng_state_1.pth; here it
    also writes late): only the main process records, after the barrier, so each record holds the complete
    folder's hash, exactly once. Both ranks fail at step 3, resume from the same checkpoint, and both get
    the hand-off result."""
    with baseline_ledger(tmp_path, tiny.sft):
        pass
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), str(REPO / "tests")]), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--standalone",
            "--nproc_per_node",
            "2",
            str(REPO / "tests" / "trainer" / "ddp_worker.py"),
            str(tmp_path),
            str(tiny.base),
            str(tiny.sft),
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    for rank in ranks:
        print(f"rank {rank['rank']} saw at on_save: {rank['seen']}")

    out = tmp_path / "out"
    assert [(r["steps"], r["state"]) for r in ranks] == [(4, "ready"), (4, "ready")]
    assert ranks[0]["candidate_sha256"] == ranks[1]["candidate_sha256"] == hash_directory(out / "candidate-adapter")
    with Ledger.open(tmp_path / "ledger.db", create=False) as ledger:
        records = [
            (e.event_id, e.event.path, e.event.sha256) for e in events_of(ledger, "ddp-1", "TrustedStateRecorded")
        ]
        failures = events_of(ledger, "ddp-1", "StageFailed")
    assert records == [
        ("ddp-1/attempt-1/step-2/checkpoint", str(out / "checkpoint-2"), hash_directory(out / "checkpoint-2")),
        ("ddp-1/attempt-2/step-4/checkpoint", str(out / "checkpoint-4"), hash_directory(out / "checkpoint-4")),
    ]
    assert {"rng_state_0.pth", "rng_state_1.pth", "adapter_model.safetensors"} <= set(os.listdir(out / "checkpoint-2"))
    assert len(failures) == 1
