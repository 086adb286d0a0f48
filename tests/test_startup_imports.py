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
    """`import lifecycle_fsm` (the embedding API) does not import rich, sqlite_utils or structlog."""
    modules = imported_by("-c", "import lifecycle_fsm")
    assert "lifecycle_fsm.ledger" in modules  # the probe sees our own imports
    assert heavy_in(modules) == []


def test_status_on_an_existing_ledger_imports_only_what_it_uses(populated_db: Path) -> None:
    """`lifecycle --json status ID` on an existing ledger: no sqlite-utils, no structlog, no rich, no
    replay package, no other command module."""
    modules = imported_by("-m", "lifecycle_fsm", "--db", str(populated_db), "--json", "status", "cand-1")
    assert "lifecycle_fsm.cli.render" in modules  # what `queries` imports: the command ran (exit 0)
    assert sorted(m for m in modules if m == "replay" or m.startswith("replay.")) == []  # one stream: no replay
    assert heavy_in(modules) == []
    others = {"audit", "auditor", "drill", "serve", "migrate", "writes", "integrity"}
    assert sorted(m for m in modules if m.rsplit(".", 1)[-1] in others and m.startswith("lifecycle_fsm.cli")) == []


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


@pytest.fixture
def populated_db(ws: Workspace) -> Path:
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.grpo("cand-1"), candidate_id="cand-1")
    return ws.db
