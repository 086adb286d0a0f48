"""A command whose output cannot be written (a full disk, a closed stdout) says so in one line, exit 3.

Before: a traceback and exit 1 (a bug, per the exit codes) — after a write command had
already committed its events. The events are still there; the message says where to look.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, count_events

from lifecycle_fsm.ledger import Ledger

REPO = Path(__file__).resolve().parent.parent
COMMANDS = [
    ["status"],
    ["status", "dpo-v5"],
    ["--json", "status"],
    ["status", "dpo-v5", "--json"],
    ["log"],
    ["log", "--jsonl"],
    ["verify"],
    ["diagram"],
    ["explain", "dpo-v5"],
    ["history", "dpo-v5"],
    ["check", "dpo-v5"],
]


def _run(db: Path, args: list[str], stdout: int | None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args],
        stdout=stdout,
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


@pytest.fixture
def db(ws: Workspace) -> Path:
    with Ledger.open(ws.db, actor="setup") as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())
    return ws.db


def _one_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in stderr, stderr
    return lines[0]


@pytest.mark.parametrize("args", COMMANDS, ids=" ".join)
def test_a_full_disk_under_stdout_is_one_line_and_exit_3(db: Path, args: list[str]) -> None:
    before = count_events(db)
    with open("/dev/full", "w") as full:
        done = _run(db, args, full.fileno())
    assert done.returncode == 3, done.stderr
    assert _one_line(done.stderr).startswith("Error: cannot write the output (No space left on device)")
    assert count_events(db) == before + (args == ["check", "dpo-v5"])  # a write commits before it prints


@pytest.mark.parametrize("args", [["status"], ["status", "dpo-v5"], ["check", "dpo-v5"]], ids=" ".join)
def test_a_closed_stdout_runs_nothing(db: Path, args: list[str]) -> None:
    before = count_events(db)
    done = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args],
        stderr=subprocess.PIPE,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
        preexec_fn=lambda: os.close(1),  # as `lifecycle … >&-`
    )
    assert done.returncode == 3, done.stderr
    assert "standard output is closed" in _one_line(done.stderr)
    assert count_events(db) == before


def test_a_reader_that_goes_away_is_still_quiet(db: Path) -> None:
    """A closed pipe (`| head`) is not an error to report: exit 1, nothing on stderr, as before."""
    reader, writer = os.pipe()
    os.close(reader)
    done = _run(db, ["log"], writer)
    os.close(writer)
    assert done.returncode == 1 and done.stderr == ""
