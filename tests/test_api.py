"""The public surface: explicit sorted `__all__`, one-way dependencies, the embedding example."""

from __future__ import annotations

import importlib
import subprocess
import sys

import pytest

from tests.conftest import REPO, Workspace

PACKAGES = ["lifecycle_fsm", "store", "replay"]


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_resolves(name: str) -> None:
    """Each package's __all__ is sorted and every name in it exists."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    missing = [n for n in exported if not hasattr(module, n)]
    assert missing == []


def _imports_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return set(out.stdout.split())


def test_store_knows_nothing_of_the_domain() -> None:
    """Importing the store loads neither the domain nor replay (dependencies point one way)."""
    loaded = _imports_after("import store, store.sqlite")
    assert not {m for m in loaded if m.startswith(("lifecycle_fsm", "replay"))}


def test_domain_does_not_import_replay() -> None:
    """The Ledger folds only the streams it touches; whole-ledger replay is not its business."""
    loaded = _imports_after("import lifecycle_fsm, lifecycle_fsm.ledger")
    assert not {m for m in loaded if m == "replay" or m.startswith("replay.")}


def test_library_import_does_not_configure_logging() -> None:
    """Importing the library leaves structlog unconfigured (only the CLI configures it)."""
    code = "import structlog, lifecycle_fsm, replay; print(structlog.is_configured())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_embedding_example_runs(ws: Workspace) -> None:
    """examples/embed.py (the README's example) survives a reward failure and hands off ready."""
    sft = ws.baseline()
    grpo = ws.grpo()
    trajectories = ws.root / "trajectories.jsonl"
    trajectories.write_text('{"prompt": 1, "completion": "x"}\n')
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "embed.py"), str(ws.db), str(sft), str(grpo), str(trajectories)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ws.root,
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split()[-2:] == ["resume_reward_from_saved_trajectories", "ready"]


def test_readme_opens_with_the_two_commands() -> None:
    """README.md starts with a set-up + main-job command and a set-up + tests command."""
    text = (REPO / "README.md").read_text()
    blocks = text.split("```")
    first, second = blocks[1], blocks[3]
    assert "pip install" in first and "lifecycle" in first
    assert "pip install" in second and "pytest" in second
    ci = (REPO / ".ci" / "run").read_text()
    assert "pytest -q" in ci
