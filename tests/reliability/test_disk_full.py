"""Filesystem faults on SQLite: a full disk and a filesystem remounted read-only under the ledger.

The ledger lives on a tiny tmpfs the test mounts (root only: otherwise a visible
skip, and a failure under CI, which runs as root).

Full disk: a filler file takes nearly all the space, then `window` commands run (in
this process: thousands may fit) until one fails. Then: the failure was exit 7 with
one `Error:` line, every command that succeeded is in the log, nothing of the failed
one is, the chain verifies and, once space is freed, the ledger takes writes again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store.base import select_events
from reliability.damage import invoke, judge, run


@contextlib.contextmanager
def tiny_filesystem(where: Path, size: str) -> Iterator[Path]:
    if os.geteuid() != 0 or shutil.which("mount") is None:
        if os.environ.get("CI"):  # CI runs as root: a skip there would hide the whole filesystem campaign
            pytest.fail("a full disk needs a tiny filesystem: mounting a tmpfs needs root, and CI runs as root")
        pytest.skip("a full disk needs a tiny filesystem: mounting a tmpfs needs root")
    where.mkdir()
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(where)], capture_output=True, text=True, check=False
    )
    if mounted.returncode != 0:
        if os.environ.get("CI"):
            pytest.fail(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False)


def _fill(fs: Path, leave: int) -> Path:
    filler = fs / "filler"
    stat = os.statvfs(fs)
    free = stat.f_bavail * stat.f_frsize
    with filler.open("wb") as fh:
        fh.write(b"\0" * max(0, free - leave))
    return filler


def test_a_full_disk_fails_one_append_cleanly(tmp_path: Path, tally: list[dict[str, Any]]) -> None:
    with tiny_filesystem(tmp_path / "fs", "4m") as fs:
        db = fs / "ledger.db"
        assert run(db, "init").returncode == 0
        filler = _fill(fs, leave=96 * 1024)
        succeeded, failure = [], None
        for n in range(2, 5000):
            result = invoke(db, "--json", "window", str(n))  # in-process: thousands of appends may fit
            if result.returncode != 0:
                failure = result
                break
            succeeded.append(n)
        assert failure is not None, "the disk never filled"
        assert failure.returncode == 7 and judge(failure, "") == "error", failure.stderr
        assert "full" in failure.stderr
        filler.unlink()
        verify = run(db, "verify")
        assert verify.returncode == 0, verify.stdout + verify.stderr
        with Ledger.open(db) as ledger:
            windows = [e for e in select_events(ledger.store) if e.type == "WindowAdvanced"]
            assert len(windows) == len(succeeded), "a succeeded append is missing, or the failed one landed"
            assert ledger.settings().active_window == (succeeded[-1] if succeeded else 1)
        assert run(db, "window", str(1000)).returncode == 0, "the ledger takes writes again once space is freed"
    tally.append(
        {
            "campaign": "disk full",
            "backend": "sqlite",
            "filesystem": "tmpfs, 4 MiB",
            "runs": 1,
            "faults": 1,
            "appends_before_full": len(succeeded),
            "lost": 0,
            "wrong": 0,
            "result": "pass",
        }
    )


def test_a_filesystem_remounted_read_only_refuses_writes_and_still_reads(
    tmp_path: Path, tally: list[dict[str, Any]]
) -> None:
    """Remounted read-only (what the kernel does after an I/O error): a write is one clear error (exit 7,
    nothing appended), reads and `verify` still answer, and once writable again the ledger takes writes."""
    with tiny_filesystem(tmp_path / "fs", "4m") as fs:
        db = fs / "ledger.db"
        assert run(db, "init").returncode == 0 and run(db, "window", "2").returncode == 0
        before = run(db, "--json", "verify")
        subprocess.run(["mount", "-o", "remount,ro", str(fs)], check=True)
        try:
            write = run(db, "window", "3")
            assert write.returncode == 7 and judge(write, "") == "error", write.stderr
            status = run(db, "--json", "verify")
            assert status.returncode == 0 and status.stdout == before.stdout, status.stdout + status.stderr
        finally:
            subprocess.run(["mount", "-o", "remount,rw", str(fs)], check=True)
        assert run(db, "window", "3").returncode == 0
        with Ledger.open(db, create=False) as ledger:
            assert ledger.settings().active_window == 3 and ledger.store.count_events() == 3
    tally.append(
        {
            "campaign": "filesystem remounted read-only",
            "backend": "sqlite",
            "filesystem": "tmpfs, remounted ro",
            "runs": 1,
            "faults": 1,
            "lost": 0,
            "wrong": 0,
            "result": "pass",
        }
    )
