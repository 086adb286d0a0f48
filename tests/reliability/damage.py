"""Damaging a ledger file in the ways disks, tools and people do, and judging what the CLI then says.

A case's outcome is one of:
- `error`  exit 6 or 7 with exactly one `Error:` line on stderr and no traceback;
- `same`   exit 0 and the same answer as the undamaged ledger (the damage missed
           anything the command reads, e.g. free space in a page);
- `wrong`  anything else: a traceback, another exit code, or a different answer
           given as if it were true (silently wrong).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import sqlite3
import subprocess
import sys
import traceback
from collections.abc import Iterator
from pathlib import Path
from typing import Protocol

import attrs
from click.testing import CliRunner
from conftest import REPO

from lifecycle_fsm.cli import main

__all__ = ["drop_triggers", "invoke", "judge", "read_only", "reset", "run"]


def run(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )


class Outcome(Protocol):
    """What a command left: a subprocess's result, or click's in-process one (`invoke`)."""

    returncode: int
    stdout: str
    stderr: str


@attrs.frozen
class InProcess:
    returncode: int
    stdout: str
    stderr: str


def invoke(db: Path, *args: str) -> InProcess:
    """The CLI in this process (click's runner): the same code, without a process start per case.

    An exception other than the CLI's own exit is reported as a traceback, as the
    real process would print it.
    """
    result = CliRunner().invoke(main, ["--db", str(db), *args])
    stderr = result.stderr
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        stderr += "Traceback (most recent call last):\n" + "".join(traceback.format_exception(result.exception))
        return InProcess(1, result.stdout, stderr)
    return InProcess(result.exit_code, result.stdout, stderr)


def judge(result: Outcome, expected_stdout: str) -> str:
    """`error`, `same` or `wrong` (see the module docstring).

    `verify` reports a broken chain on stdout (`BROKEN at seq …`, or `BROKEN: checkpoint …`
    when no event is at fault; exit 6) rather than as an `Error:` line: that report counts
    as a clear error too.
    """
    lines = result.stderr.strip().splitlines()
    if "Traceback" in result.stderr:
        return "wrong"
    if result.returncode in (6, 7):
        one_error_line = len(lines) == 1 and lines[0].startswith("Error: ")
        broken_report = not lines and result.stdout.startswith(("BROKEN at seq ", "BROKEN: "))
        return "error" if one_error_line or broken_report else "wrong"
    if result.returncode == 0 and result.stdout == expected_stdout:
        return "same"
    return "wrong"


def reset(db: Path, good: bytes) -> None:
    """The undamaged file back, without a WAL or shared-memory file beside it."""
    for suffix in ("-wal", "-shm", "-journal"):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(f"{db}{suffix}")
    with contextlib.suppress(FileNotFoundError):
        os.unlink(db)
    db.write_bytes(good)


def drop_triggers(conn: sqlite3.Connection) -> None:
    for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        conn.execute(f'DROP TRIGGER "{name}"')


@contextlib.contextmanager
def read_only(db: Path) -> Iterator[None]:
    """The file (and its folder) made read-only: chmod for a user, the immutable flag for root."""
    if os.geteuid() != 0:
        db.chmod(0o444)
        db.parent.chmod(0o555)
        try:
            yield
        finally:
            db.parent.chmod(0o755)
            db.chmod(0o644)
        return
    chattr = shutil.which("chattr")
    if chattr is None or subprocess.run([chattr, "+i", str(db)], check=False).returncode != 0:
        import pytest

        pytest.skip("running as root without chattr +i: a read-only file cannot be made")
    try:
        yield
    finally:
        subprocess.run([chattr, "-i", str(db)], check=True)
