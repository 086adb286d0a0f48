"""Start-up cost: what `import lifecycle_fsm` and `lifecycle status ID` import, in real subprocesses.

The heavy libraries (structlog's dev console with rich and pygments, sqlite-utils with
pluggy and dateutil, rich's tables, the command modules a command does not use) are
imported when they are needed, never at start-up. Timings live in benchmarks/
(`bench_startup.py`); here we check the cause: which modules got imported.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, run_cli

HEAVY = ("rich", "sqlite_utils", "structlog", "structlog.dev", "pygments", "markdown_it", "cattrs", "datasette")


def imported_by(*argv: str) -> set[str]:
    """Every module a fresh interpreter imported running `argv`, from `-X importtime` (stderr)."""
    done = subprocess.run([sys.executable, "-X", "importtime", *argv], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    modules = set()
    for line in done.stderr.splitlines():
        if line.startswith("import time:") and "|" in line:
            modules.add(line.rsplit("|", 1)[1].strip())
    assert modules, done.stderr[-2000:]
    return modules


def heavy_in(modules: set[str]) -> list[str]:
    return sorted(m for m in modules if m.split(".")[0] in HEAVY or m in HEAVY)


def test_import_lifecycle_fsm_imports_no_heavy_library() -> None:
    """`import lifecycle_fsm` loads the package's `__init__` and nothing of ours behind it: no
    attrs classes, no store, no sqlite-utils / rich / structlog / transitions."""
    modules = imported_by("-c", "import lifecycle_fsm")
    assert "lifecycle_fsm" in modules  # the probe sees our own imports
    ours = sorted(m for m in modules if m.split(".")[0] in {"lifecycle_fsm", "store", "replay"})
    assert ours == ["lifecycle_fsm"]
    assert heavy_in(modules) == []
    assert sorted(m for m in modules if m.split(".")[0] in {"attr", "attrs", "transitions"}) == []


def test_the_embedding_api_imports_no_heavy_library() -> None:
    """`from lifecycle_fsm import Ledger` (loads the facade) still imports no rich, sqlite_utils or structlog."""
    modules = imported_by("-c", "from lifecycle_fsm import Ledger")
    assert "lifecycle_fsm.ledger" in modules
    assert heavy_in(modules) == []


def test_the_error_classes_do_not_load_the_stores() -> None:
    """`lifecycle_fsm.errors` (every CLI start imports it for the exit codes) imports nothing of ours:
    no store, no records, no attrs."""
    modules = imported_by("-c", "import lifecycle_fsm.errors")
    assert sorted(m for m in modules if m.startswith("lifecycle_fsm.")) == ["lifecycle_fsm.errors"]
    assert sorted(m for m in modules if m.split(".")[0] in {"attr", "attrs"}) == []


@pytest.mark.parametrize("package", ["lifecycle_fsm"])
def test_every_public_name_resolves_to_its_defining_module(package: str) -> None:
    """Each name in `__all__` loads lazily, is the submodule's own object, and `import *` gives them all."""
    code = (
        f"import importlib, {package} as p\n"
        "assert sorted(p._WHERE) == sorted(p.__all__)\n"
        "for n in p.__all__:\n"
        f"    assert getattr(p, n) is getattr(importlib.import_module('{package}.' + p._WHERE[n]), n), n\n"
        "ns = {}\n"
        f"exec('from {package} import *', ns)\n"
        "assert set(p.__all__) <= set(ns)\n"
        "assert set(p.__all__) <= set(dir(p))\n"
        "try:\n"
        "    p.no_such_name\n"
        "except AttributeError as e:\n"
        "    print(e)\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == f"module '{package}' has no attribute 'no_such_name'"


def test_status_on_an_existing_ledger_imports_only_what_it_uses(populated_db: Path) -> None:
    """`lifecycle --json status ID` on an existing ledger: no sqlite-utils, no structlog, no rich, no
    replay package, no other command module."""
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(populated_db), "--json", "status", "cand-1")
    assert "lifecycle_fsm.cli.render" in modules  # what `queries` imports: the command ran (exit 0)
    assert sorted(m for m in modules if m == "replay" or m.startswith("replay.")) == []  # one stream: no replay
    assert heavy_in(modules) == []
    others = {"audit", "auditor", "drill", "serve", "migrate", "writes", "integrity"}
    assert sorted(m for m in modules if m.rsplit(".", 1)[-1] in others and m.startswith("lifecycle_fsm.cli")) == []


def test_status_as_text_draws_its_table_without_rich(populated_db: Path) -> None:
    """`lifecycle status ID` into a pipe prints rich's table text without importing rich."""
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(populated_db), "status", "cand-1")
    assert "lifecycle_fsm.cli.render" in modules
    assert heavy_in(modules) == []
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(populated_db), "status", "cand-1"],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines()[1].split() == [
        "┃",
        "id",
        "┃",
        "kind",
        "┃",
        "state",
        "┃",
        "version",
        "┃",
        "reasons",
        "┃",
    ]
    assert "│ cand-1 │ grpo │ received │ 1       │         │" in done.stdout


def test_a_new_ledger_still_gets_its_schema(tmp_path: Path) -> None:
    """sqlite-utils is imported only to create the schema, and then it is created (with its triggers)."""
    db = tmp_path / "new.db"
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(db), "--json", "init")
    assert "sqlite_utils" in modules
    import sqlite3

    conn = sqlite3.connect(db)
    names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
    conn.close()
    assert {"events", "streams", "meta", "events_refuse_replace"} <= names


@pytest.mark.parametrize("level", ["info", "debug"])
def test_deferred_logging_still_logs_json_lines(tmp_path: Path, level: str) -> None:
    """structlog is set up on the first wanted event: `--log-level info` still writes JSON lines to stderr."""
    done = run_cli(tmp_path / "l.db", "--log-level", level, "init")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events if e["event"] == "event_appended"] == ["event_appended"]
    assert {e["level"] for e in events} <= {"info", "debug"}


def test_default_log_level_writes_nothing_and_imports_no_structlog(tmp_path: Path) -> None:
    """At the default level (warning) an `init` logs nothing, so structlog is never imported."""
    done = run_cli(tmp_path / "l.db", "init")
    assert (done.returncode, done.stderr) == (0, "")
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(tmp_path / "l.db"), "window", "2")
    assert [m for m in modules if m.startswith("structlog")] == []


# What a read of one candidate needs: the fold (events, table, state), the store, the printer.
# The Ledger's command path, the live `transitions` machine and the modules only a write uses
# (evidence, manifests, the clock and actor, results, retry) are imported by the commands that
# write; `logging` only when an event is wanted; `signal` only when a fault plan kills. (attrs is
# imported: the store's records are attrs classes.)
NOT_FOR_A_READ = (
    "lifecycle_fsm.ledger", "lifecycle_fsm.command_path", "lifecycle_fsm.decisions", "lifecycle_fsm.feed",
    "lifecycle_fsm.checks", "lifecycle_fsm.artifacts", "lifecycle_fsm.manifests", "lifecycle_fsm.command_inputs",
    "lifecycle_fsm.results", "lifecycle_fsm.retry", "lifecycle_fsm.recovery", "lifecycle_fsm.snapshots",
    "lifecycle_fsm.rules", "transitions", "logging", "signal", "socket",
)  # fmt: skip


def _console_script() -> list[str]:
    """The installed `lifecycle` script (what a user runs), else `-m lifecycle_fsm`."""
    script = Path(sys.executable).with_name("lifecycle")
    return [str(script)] if script.exists() else ["-m", "lifecycle_fsm"]


@pytest.mark.parametrize("how", ["script", "module"])
@pytest.mark.parametrize("as_json", [False, True])
def test_status_of_one_candidate_imports_no_write_path(populated_db: Path, how: str, as_json: bool) -> None:
    """`lifecycle status ID` (the console script and `-m`) folds and prints without the Ledger's command
    path, the live machine, logging or the write commands' modules, and prints the same state."""
    cli = _console_script() if how == "script" else ["-m", "lifecycle_fsm"]
    argv = [*cli, "--db", str(populated_db), *(["--json"] if as_json else []), "status", "cand-1"]
    modules = imported_by(*argv)
    assert "lifecycle_fsm.streams" in modules  # the fold ran
    loaded = sorted(m for m in modules if m in NOT_FOR_A_READ or m.split(".")[0] in NOT_FOR_A_READ)
    assert loaded == []
    assert [m for m in modules if m.split(".")[0] == "click"] == []  # the script's own `status ID` (cli/entry.py)
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True)
    if as_json:
        assert json.loads(done.stdout)["state"] == "received"
    else:
        assert "│ cand-1 │ grpo │ received │ 1       │         │" in done.stdout


def test_status_of_a_checkpointed_candidate_imports_no_write_path(populated_db: Path) -> None:
    """With a checkpoint, `status ID` starts from the candidate's trusted copy (judged by `snapshots`)
    without the live machine or logging."""
    assert run_cli(populated_db, "checkpoint").returncode == 0
    argv = ["-m", "lifecycle_fsm", "--db", str(populated_db), "--json", "status", "cand-1"]
    modules = imported_by(*argv)
    assert "lifecycle_fsm.snapshots" in modules  # the copy was judged
    assert sorted(m for m in modules if m.split(".")[0] in {"transitions", "logging"}) == []
    done = subprocess.run([sys.executable, *argv], capture_output=True, text=True, check=True)
    assert json.loads(done.stdout)["state"] == "received"


def test_verify_imports_no_command_path(populated_db: Path) -> None:
    """`verify` reads: it opens the store without a Ledger (its command path, evidence gathering, clock)."""
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(populated_db), "--json", "verify")
    assert "lifecycle_fsm.replay.verify" in modules
    write_path = ("lifecycle_fsm.ledger", "lifecycle_fsm.command_path", "lifecycle_fsm.decisions",
                  "lifecycle_fsm.artifacts", "lifecycle_fsm.command_inputs", "socket")  # fmt: skip
    assert sorted(m for m in modules if m in write_path) == []


def test_verify_without_a_key_imports_no_cryptography(populated_db: Path, tmp_path: Path) -> None:
    """`verify` reads no key unless given `--pubkey`: `cryptography` loads only then (a fifth of
    its start-up), and a key-checked verify still checks the key."""
    argv = ("-m", "lifecycle_fsm", "--db", str(populated_db), "--json", "verify")
    assert sorted(m for m in imported_by(*argv) if m.split(".")[0] == "cryptography") == []
    keys = tmp_path / "keys"
    assert run_cli(populated_db, "key", "new", "--out", str(keys)).returncode == 0
    with_key = imported_by(*argv, "--pubkey", str(keys / "lifecycle-signing.pub"))
    assert "cryptography.hazmat.primitives.asymmetric.ed25519" in with_key


def test_the_fold_imports_no_transitions_and_the_live_machine_still_works() -> None:
    """`transitions` is imported when a command first checks a live move, not by the table or the fold."""
    code = (
        "import sys\n"
        "import lifecycle_fsm.state, lifecycle_fsm.streams\n"
        "assert 'transitions' not in sys.modules and 'logging' not in sys.modules, 'imported at import'\n"
        "from lifecycle_fsm import machine\n"
        "assert machine.command_allowed('received', machine.COMMAND_TRIGGERS['check'])\n"
        "assert 'transitions' in sys.modules\n"
        "assert machine.MACHINE is machine.live_machine()\n"
        "print(machine.allowed_commands('verified'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.strip() == "['check', 'fail', 'handoff', 'trusted', 'untrust']"


@pytest.fixture
def populated_db(ws: Workspace) -> Path:
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.grpo("cand-1"), candidate_id="cand-1")
    return ws.db
