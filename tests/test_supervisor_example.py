"""The embedding examples: the docs' supervisor snippet passes `mypy --strict`, the supervisor loop runs.

`examples/supervisor_loop.py` is run as a user would, as a process: it crashes its own
supervisor once mid-run, restarts it, and must still reach a hand-off for both
candidates with an intact chain; run again with the same run name it appends nothing.
"""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.replay.verify import verify
from tests.conftest import REPO

LOOP = REPO / "examples" / "supervisor_loop.py"


def _docs_snippet() -> str:
    page = (REPO / "docs" / "embedding.md").read_text()
    section = page[page.index("## A supervisor") :]
    match = re.search(r"```python\n(.*?)```", section, re.S)
    assert match is not None
    return match.group(1)


@pytest.mark.slow
def test_the_docs_snippet_is_the_example_and_passes_mypy_strict(tmp_path: Path) -> None:
    snippet = _docs_snippet()
    assert snippet.strip() in (REPO / "examples" / "embed.py").read_text()
    source = tmp_path / "docs_snippet.py"
    source.write_text(snippet)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "mypy",
            "--strict",
            "--no-incremental",
            "--cache-dir",
            str(tmp_path / "cache"),
            str(source),
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=False,
        timeout=300,
    )
    assert out.returncode == 0, out.stdout + out.stderr


def test_the_docs_say_how_mypy_finds_an_editable_install_outside_the_checkout() -> None:
    """The test above runs mypy inside the checkout; outside it, setuptools' default editable
    install (an import hook) is invisible to mypy. The section claiming `mypy --strict` says
    which install mypy can read (checked by hand in a scratch venv: default fails, strict passes)."""
    page = (REPO / "docs" / "embedding.md").read_text()
    section = page[page.index("## A supervisor") : page.index("## Results are typed")]
    assert "mypy --strict" in section
    assert "pip install -e . --config-settings editable_mode=strict" in " ".join(section.split())


def _run(workdir: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(LOOP), str(workdir), *args],
        capture_output=True,
        text=True,
        cwd=workdir.parent,
        check=False,
        timeout=300,
    )


@pytest.mark.parametrize("seed", [1, 7])
def test_the_supervisor_loop_survives_its_own_crash(tmp_path: Path, seed: int) -> None:
    workdir = tmp_path / "demo"
    out = _run(workdir, "--seed", str(seed))
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert any(line.startswith("supervisor: crashing after command") for line in lines)
    assert "supervisor: restarted" in lines
    assert [line for line in lines if not line.startswith(" ")][-2:] == ["dpo-run1: ready", "grpo-run1: ready"]
    db = workdir / "lifecycle.db"
    with Ledger.open(db) as ledger:
        assert verify(ledger.store)["ok"]
        assert {cid: ledger.candidate(cid).state for cid in ledger.candidate_ids()} == {
            "dpo-run1": State.READY,
            "grpo-run1": State.READY,
        }
        plans = [e for e in ledger.events() if e.type == "RecoveryPlanned"]
        reported = [line for line in lines if " failed -> " in line]
        # Each failure was planned once, although the crashed supervisor's steps ran twice.
        assert len(plans) == len(set(reported)) > 0
        head = ledger.store.head()
    again = _run(workdir, "--seed", str(seed), "--crash-after", "0")
    assert again.returncode == 0, again.stderr
    with Ledger.open(db) as ledger:
        assert ledger.store.head() == head  # the same run's keys: nothing appended
    other = _run(workdir, "--seed", str(seed + 1))  # would rewrite the files the ledger trusts
    assert other.returncode == 2 and f"was set up with --seed {seed}" in other.stderr, other.stderr
    with Ledger.open(db) as ledger:
        assert ledger.store.head() == head and verify(ledger.store)["ok"]


def test_a_corrupted_trajectory_file_is_passed_over(tmp_path: Path) -> None:
    """Seed 1 garbles the saved trajectories before the reward stage fails: the plan skips them."""
    out = _run(tmp_path / "demo", "--seed", "1")
    assert "  dpo-run1: passed over trajectories (hash_changed)" in out.stdout.splitlines()
    assert "  dpo-run1: reward failed -> restart_sampling_from_prompt_queue (reuse prompt_queue)" in out.stdout
