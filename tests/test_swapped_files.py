"""A ledger file, `-wal` or `-shm` deleted or replaced under an open SQLite store: its writes are refused.

SQLite holds the three files by descriptor. Once one is gone from its name, a new
process makes a new one there and the two stop seeing each other's writes; a write
acknowledged through the old connection can be lost. The store compares each file's
device and inode with what it opened before every commit.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, run_cli

from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.store.records import NewEvent
from lifecycle_fsm.store.sqlite import SQLiteEventStore


def _event_ids(db: Path) -> set[str]:
    """The log's event ids, read by a fresh process (this one may hold the old files' state)."""
    query = "SELECT event_id FROM events"
    code = f"import sqlite3, sys; print(*(r for r, in sqlite3.connect(sys.argv[1]).execute({query!r})))"
    out = subprocess.run([sys.executable, "-c", code, str(db)], capture_output=True, text=True, check=True).stdout
    return set(out.split())


def _event(n: int) -> NewEvent:
    return NewEvent("s", "Tick", 1, {"n": n}, f"e{n}", "2026-01-01T00:00:00+00:00", "test")


def test_a_deleted_shm_under_a_held_open_ledger_loses_no_acknowledged_write(ws: Workspace) -> None:
    """The reported case: a held-open Ledger appends, its `-shm` is deleted, CLI writers run meanwhile."""
    assert run_cli(ws.db, "init").returncode == 0
    acknowledged, refused = [], []
    with ws.ledger() as held:
        for step in range(9):
            try:
                held.advance_window(step + 2)
            except StoreError as e:
                refused.append(str(e))
            if step == 1:
                os.unlink(f"{ws.db}-shm")
            if step % 3 == 2:
                key = f"K{step}"
                if run_cli(ws.db, "receive", str(ws.dpo(f"c{step}")), "--event-id", key).returncode == 0:
                    acknowledged.append(key)
    assert acknowledged, "no CLI write went through"
    assert not set(acknowledged) - _event_ids(ws.db), "a write acknowledged with exit 0 is not in the log"
    assert refused and all(f"{ws.db.name}-shm" in r and "nothing was written" in r for r in refused)
    verify = run_cli(ws.db, "verify")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with ws.ledger() as reopened:  # in the same process: it reads and writes the current files
        reopened.advance_window(100)
    assert run_cli(ws.db, "receive", str(ws.dpo("after")), "--event-id", "late").returncode == 0
    assert {"late", *acknowledged} <= _event_ids(ws.db)


def test_a_folder_removed_under_a_live_ledger_takes_no_write(ws: Workspace) -> None:
    with ws.ledger() as held:
        held.init()
        manifests = [ws.dpo(f"c{n}") for n in range(3)]
        copies = ws.root.parent / f"{ws.root.name}-manifests"
        shutil.copytree(ws.root, copies, ignore=shutil.ignore_patterns("ledger.db*"))
        shutil.rmtree(ws.root)
        for manifest in manifests:
            with pytest.raises(StoreError, match=f"{ws.db.name}: deleted or replaced"):
                held.receive(copies / manifest.relative_to(ws.root), event_id=manifest.parent.name)
    assert not ws.db.exists()


def test_a_ledger_file_replaced_by_another_takes_no_write(tmp_path: Path) -> None:
    db, other = tmp_path / "ledger.db", tmp_path / "other.db"
    with SQLiteEventStore(other) as second:
        second.append("s", 0, [_event(2)])
    with SQLiteEventStore(db) as store:
        store.append("s", 0, [_event(1)])
        os.replace(other, db)
        with pytest.raises(StoreError, match=r"ledger\.db: deleted or replaced"):
            store.append("s", 1, [_event(3)])
    assert "e3" not in _event_ids(db)


def test_a_replaced_wal_takes_no_write(tmp_path: Path) -> None:
    db = tmp_path / "ledger.db"
    with SQLiteEventStore(db) as store:
        store.append("s", 0, [_event(1)])
        wal = Path(f"{db}-wal")
        wal.rename(tmp_path / "moved-wal")
        shutil.copyfile(tmp_path / "moved-wal", wal)
        with pytest.raises(StoreError, match=r"ledger\.db-wal: deleted or replaced"):
            store.append("s", 1, [_event(2)])
