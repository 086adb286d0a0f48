"""`examples/trl_dpo.py WORKDIR` runs as a user runs it: a fault, a resume, a hand-off, exit 0."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO
from trainer.support import require_training_stack

require_training_stack()


def _example(workdir: Path) -> subprocess.CompletedProcess[str]:
    command = [sys.executable, str(REPO / "examples" / "trl_dpo.py"), str(workdir)]
    return subprocess.run(command, capture_output=True, text=True, timeout=300, check=False)


@pytest.mark.slow
def test_the_dpo_example_hands_its_candidate_off(tmp_path: Path) -> None:
    done = _example(tmp_path / "work")
    assert done.returncode == 0, done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == "candidate dpo-example-1: ready"
    checkpoint = tmp_path / "work" / "run" / "checkpoint-2"
    plan = f"recovery plan: restore_pre_update_checkpoint from {checkpoint}; the trainer: resume_from_plan_checkpoint"
    assert plan in lines
    assert any("StageFailed" in line for line in lines)
    again = _example(tmp_path / "work")  # its candidate was handed off: a new folder is asked for
    assert again.returncode == 2 and "holds an earlier run: give a new folder" in again.stderr, again.stderr[-4000:]
