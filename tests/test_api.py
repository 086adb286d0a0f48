"""The public surface: explicit sorted `__all__`, one-way dependencies, the embedding example."""

from __future__ import annotations
import __future__

import ast
import importlib
import pkgutil
import re
import subprocess
import sys
import types
from pathlib import Path

import pytest
from backends import DURABLE, backend_params

from lifecycle_fsm import Ledger, State
from lifecycle_fsm.events import stream_of
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.replay.checkpoints import load_state
from lifecycle_fsm.store.chain import canonical_json
from tests.conftest import REPO, Workspace

PACKAGES = ["lifecycle_fsm", "lifecycle_fsm.store", "lifecycle_fsm.replay", "lifecycle_fsm.cli"]
CLI_MODULES = sorted(
    f"lifecycle_fsm.cli.{m.name}"
    for m in pkgutil.iter_modules([str(REPO / "lifecycle_fsm" / "cli")])
    if m.name != "__main__"  # importing it runs the CLI
)


def _public_names(module: types.ModuleType) -> list[str]:
    """What a package exposes: every public name but its submodules (and `from __future__` flags)."""
    return sorted(
        name
        for name, value in vars(module).items()
        if not name.startswith("_") and not isinstance(value, types.ModuleType | __future__._Feature)
    )


@pytest.mark.parametrize("name", PACKAGES)
def test_all_is_sorted_and_matches_the_public_names(name: str) -> None:
    """Each package's __all__ is sorted, every name in it exists, and every public name is in it (httpx's test)."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    assert [n for n in exported if not hasattr(module, n)] == []
    assert _public_names(module) == exported


def _defined_names(module: types.ModuleType) -> list[str]:
    """Public names a module binds itself at top level (def, class, assignment), not the ones it imports."""
    assert module.__file__ is not None
    tree = ast.parse(Path(module.__file__).read_text(encoding="utf-8"))
    names: list[str] = []
    for node in tree.body:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            names.append(node.name)
        elif isinstance(node, ast.Assign):
            names += [t.id for t in node.targets if isinstance(t, ast.Name)]
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.append(node.target.id)
    return sorted(n for n in names if not n.startswith("_"))


@pytest.mark.parametrize("name", CLI_MODULES)
def test_cli_modules_export_what_they_define(name: str) -> None:
    """Each CLI module's __all__ is sorted, resolves, and lists every public name the module defines."""
    module = importlib.import_module(name)
    exported = list(module.__all__)
    assert exported == sorted(exported)
    assert [n for n in exported if not hasattr(module, n)] == []
    assert [n for n in _defined_names(module) if n not in exported] == []


def _imports_after(statement: str) -> set[str]:
    code = f"import sys; {statement}; print(' '.join(sorted(sys.modules)))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    return set(out.stdout.split())


def _our_imports(path: Path) -> list[str]:
    """The modules of ours a source file imports (absolute imports; the packages use no relative ones)."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names = [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    names += [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    return [m for m in names if m.split(".")[0] in ("lifecycle_fsm", "store", "replay")]


def test_store_knows_nothing_of_the_domain() -> None:
    """Every store module imports, of ours, only the store's own modules and the shared error vocabulary
    (`lifecycle_fsm.errors`, which imports nothing of ours): dependencies point one way."""
    foreign = {
        path.name: [
            m for m in _our_imports(path) if m != "lifecycle_fsm.errors" and not m.startswith("lifecycle_fsm.store")
        ]
        for path in sorted((REPO / "store").glob("*.py"))
    }
    assert len(foreign) > 10 and {name: bad for name, bad in foreign.items() if bad} == {}
    assert _our_imports(REPO / "lifecycle_fsm" / "errors.py") == []


def test_domain_does_not_import_replay() -> None:
    """The Ledger folds only the streams it touches; whole-ledger replay is not its business."""
    loaded = _imports_after("import lifecycle_fsm, lifecycle_fsm.ledger")
    assert not {m for m in loaded if m.startswith("lifecycle_fsm.replay")}


def test_library_does_not_import_the_cli() -> None:
    """`import lifecycle_fsm` (and store, replay) leaves the CLI package unloaded: screen code is not the domain's."""
    loaded = _imports_after(
        "import lifecycle_fsm, lifecycle_fsm.ledger, lifecycle_fsm.audit, lifecycle_fsm.store, lifecycle_fsm.replay"
    )
    assert {m for m in loaded if m.startswith("lifecycle_fsm.cli")} == set()


def _imported_roots(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(encoding="utf-8"))
    roots = {a.name.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    return roots | {n.module.split(".")[0] for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}


def test_only_the_cli_imports_click_and_rich() -> None:
    """No module of the three packages outside lifecycle_fsm/cli/ imports click or rich itself.

    (sqlite-utils and structlog load them on their own; this is about our code.)
    """
    cli = REPO / "lifecycle_fsm" / "cli"
    offenders = [
        str(path.relative_to(REPO))
        for package in ("lifecycle_fsm", "store", "replay")
        for path in sorted((REPO / package).rglob("*.py"))
        if cli not in path.parents and _imported_roots(path) & {"click", "rich"}
    ]
    assert offenders == []


def test_library_import_does_not_configure_logging() -> None:
    """Importing the library leaves structlog unconfigured (only the CLI configures it)."""
    code = "import structlog, lifecycle_fsm, replay; print(structlog.is_configured())"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


def test_structlog_is_imported_only_to_write_an_event() -> None:
    """The library and the command line load structlog only when an event is written through it."""
    loaded = _imports_after("import lifecycle_fsm, lifecycle_fsm.cli, lifecycle_fsm.replay, lifecycle_fsm.store")
    assert "structlog" not in loaded


def test_the_package_loads_each_module_when_first_asked() -> None:
    """`import lifecycle_fsm` (and the CLI's package) loads only the errors and the exit codes, none of
    our other modules, attrs, click or `transitions`; `lifecycle_fsm.Ledger` (and `from lifecycle_fsm
    import Ledger` or `*`) still gives the Ledger class."""
    loaded = _imports_after("import lifecycle_fsm, lifecycle_fsm.cli")
    ours = {m for m in loaded if m.startswith("lifecycle_fsm")}
    assert ours == {"lifecycle_fsm", "lifecycle_fsm.errors", "lifecycle_fsm.cli", "lifecycle_fsm.cli.exit_codes"}
    assert {"attrs", "click", "transitions"} & loaded == set()
    code = (
        "import lifecycle_fsm; from lifecycle_fsm.ledger import Ledger; from lifecycle_fsm import *; "
        "assert lifecycle_fsm.Ledger is Ledger and 'Ledger' in globals(); "
        "assert all(getattr(lifecycle_fsm, n) is globals()[n] for n in lifecycle_fsm.__all__)"
    )
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)


def test_embedding_example_runs(ws: Workspace) -> None:
    """examples/embed.py (the embedding page's example) survives a reward failure and hands off ready."""
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
    other = ws.grpo("grpo-v8")  # the same run's keys for another candidate: one line, exit 1
    argv = [sys.executable, str(REPO / "examples" / "embed.py"), str(ws.db), str(sft), str(other), str(trajectories)]
    again = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=ws.root)
    assert again.returncode == 1 and again.stderr.startswith("error: event id 'run-42/1/receive' is already used")
    assert again.stderr.count("\n") == 1 and "give this command a new one" in again.stderr


@pytest.mark.parametrize(
    "args",
    [[], ["only.db"], ["a.db", "sft.json", "grpo.json"], ["a", "b", "c", "d", "e"], ["a.db", "sft", "grpo", "t"]],
)
def test_embedding_example_with_wrong_arguments_prints_its_usage(tmp_path: Path, args: list[str]) -> None:
    """Too few or too many arguments, or files that are not there: a usage line and exit 2 (as
    supervisor_loop.py), no traceback, no ledger."""
    out = subprocess.run(
        [sys.executable, str(REPO / "examples" / "embed.py"), *args],
        capture_output=True,
        text=True,
        check=False,
        cwd=tmp_path,
        timeout=60,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr.startswith("usage: embed.py [-h] LEDGER_DB SFT_MANIFEST GRPO_MANIFEST TRAJECTORIES_PATH\n")
    assert "Traceback" not in out.stderr and out.stdout == ""
    assert list(tmp_path.iterdir()) == []


def test_readme_opens_with_the_two_commands() -> None:
    """README.md starts with a set-up + main-job command and a set-up + tests command, and CI
    installs and tests exactly as that second command says."""
    text = (REPO / "README.md").read_text()
    blocks = text.split("```")
    first, second = blocks[1], blocks[3]
    assert "pip install" in first and "lifecycle" in first
    assert "pip install" in second and "pytest" in second
    install = re.search(r"\.venv/bin/pip install -q (-e .+?) &&", second)
    assert install is not None, second
    ci = (REPO / ".ci" / "run").read_text()
    assert f"pip install --quiet {install.group(1)}\n" in ci
    assert '\nCI=true PYTEST_ADDOPTS="--cov" .venv/bin/pytest -q\n' in ci and second.strip().endswith(
        ".venv/bin/pytest -q"
    )


@pytest.mark.parametrize("backend", backend_params(DURABLE))
def test_every_candidate_state_a_caller_sees_is_a_state_member(
    ws: Workspace, backend: str, request: pytest.FixtureRequest
) -> None:
    """SPEC §10: `candidate.state` is a `State` (so `is State.X` holds), from a command, a query,
    a checkpoint's JSON copy after reopening, and a replay; the checkpoint's bytes say the plain value."""
    target = str(ws.db) if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    queue = ws.root / "queue.jsonl"
    queue.write_text("{}\n")
    with Ledger.open(target, synchronous="NORMAL") as ledger:
        ledger.activate_baseline(ws.baseline())
        received = ledger.receive(ws.dpo())
        assert received.candidate.state is State.RECEIVED and received.state is State.RECEIVED
        assert ledger.check("dpo-v5").candidate.state is State.VERIFIED
        kept = ledger.record_trusted_state("dpo-v5", "prompt_queue", queue)  # keeps the cached fold's state
        assert kept.candidate.state is State.VERIFIED
        assert ledger.candidate("dpo-v5").state is State.VERIFIED
        assert ledger.hand_off("dpo-v5").candidate.state is State.READY
        assert ledger.wait_for("dpo-v5", [State.READY], timeout=0) is State.READY
        take_checkpoint(ledger.store, clock=utc_now)
        version = ledger.store.stream_version(stream_of("dpo-v5"))
    with Ledger.open(target, synchronous="NORMAL") as reopened:
        snap = reopened.store.latest_stream_snapshot(stream_of("dpo-v5"))
        assert snap is not None and snap.version == version  # no tail: the state is the copy's JSON alone
        from_copy = reopened.candidate("dpo-v5")
        assert from_copy.state is State.READY
        assert '"state":"ready"' in snap.state
        restored = load_state(reopened.store)
        assert restored.checkpoint is not None
        assert restored.state.candidates["dpo-v5"].state is State.READY
        replayed = load_state(reopened.store, use_checkpoints=False).state.candidates["dpo-v5"]
        assert replayed.state is State.READY and replayed == from_copy
        # Serialised, a member is its value: checkpoints, canonical JSON and their hashes are unchanged.
        assert canonical_json(replayed.to_dict()) == canonical_json(replayed.to_dict() | {"state": "ready"})
