"""A ledger on read-only media: every read command works, a write is refused, nothing changes.

The folder is made read-only for real: a read-only bind mount when the tests run as
root (root ignores permission bits), permission bits otherwise.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sqlite3
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from conftest import Workspace

from lifecycle_fsm import InputError, State
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.store import SQLiteEventStore, StoreError

REPO = Path(__file__).resolve().parent.parent


class ReadOnly:
    """Put files into `src`, then `seal()`: `ro` shows them read-only."""

    def __init__(self, root: Path) -> None:
        self.src, self.ro = root / "src", root / "ro"
        self.src.mkdir()
        self.ro.mkdir()
        self.mounted = False  # a bind mount on the same file system: os.path.ismount cannot tell

    def seal(self) -> None:
        if os.geteuid() != 0:
            os.chmod(self.src, 0o555)
            self.ro.rmdir()
            self.ro.symlink_to(self.src)
            return
        done = subprocess.run(
            ["mount", "--bind", str(self.src), str(self.ro)], capture_output=True, text=True, check=False
        )
        if done.returncode != 0:
            pytest.skip(f"cannot make a read-only folder here (mount --bind: {done.stderr.strip()})")
        self.mounted = True
        subprocess.run(["mount", "-o", "remount,ro,bind", str(self.ro)], capture_output=True, check=True)
        assert not os.access(self.ro, os.W_OK)

    def cleanup(self) -> None:
        if self.mounted:
            subprocess.run(["umount", str(self.ro)], check=True)
            self.mounted = False
        os.chmod(self.src, 0o755)


@pytest.fixture
def read_only(tmp_path: Path) -> Iterator[ReadOnly]:
    folder = ReadOnly(tmp_path)
    yield folder
    folder.cleanup()


def _lifecycle(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "--db", str(db), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
        check=False,
    )


def _digest(folder: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(folder.iterdir())}


def _ledger(ws: Workspace, db: Path) -> str:
    with Ledger.open(db, actor="setup") as ledger:
        ledger.activate_baseline(ws.baseline())
        cid = ledger.receive(ws.dpo()).candidate_id
        ledger.check(cid)
    return cid


@pytest.mark.slow
def test_every_read_works_on_a_read_only_folder_and_a_write_is_refused(
    ws: Workspace, read_only: ReadOnly, tmp_path: Path
) -> None:
    """Before: every command failed with "not a usable ledger database (unable to open database
    file)", exit 7, because SQLite could not create the ledger's -shm beside it."""
    src, ro = read_only.src, read_only.ro
    cid = _ledger(ws, src / "l.db")
    assert sorted(p.name for p in src.iterdir()) == ["l.db"]  # closed: the WAL is in the file
    read_only.seal()
    db = ro / "l.db"
    before = _digest(ro)
    checked = _lifecycle(db, "--json", "verify")
    assert checked.returncode == 0, checked.stderr
    assert json.loads(checked.stdout)["events"] == 4
    shown = _lifecycle(db, "--json", "status", cid)
    assert shown.returncode == 0 and json.loads(shown.stdout)["state"] == "verified", shown.stderr
    for args in (
        ["status"],
        ["explain", cid],
        ["history", cid],
        ["log", "--type", "ChecksRecorded"],
        ["report", "--out", str(tmp_path / "report")],
    ):
        assert _lifecycle(db, *args).returncode == 0, args
    refused = _lifecycle(db, "check", cid)
    assert refused.returncode == 7 and "read-only" in refused.stderr, refused.stderr
    assert _digest(ro) == before


def test_a_read_only_copy_with_events_in_its_wal_is_refused_not_read_short(ws: Workspace, read_only: ReadOnly) -> None:
    """Its -wal holds committed events: reading the file alone would silently show an older ledger."""
    src, ro = read_only.src, read_only.ro
    _ledger(ws, src / "live.db")
    holder = sqlite3.connect(src / "live.db")  # an open connection keeps the WAL from being folded in
    holder.execute("SELECT count(*) FROM events").fetchone()
    with Ledger.open(src / "live.db", actor="late") as ledger:
        ledger.advance_window(2)
    shutil.copy(src / "live.db", src / "l.db")
    shutil.copy(src / "live.db-wal", src / "l.db-wal")
    holder.close()
    for name in ("live.db", "live.db-wal", "live.db-shm"):
        (src / name).unlink(missing_ok=True)
    assert (src / "l.db-wal").stat().st_size > 0
    read_only.seal()
    refused = _lifecycle(ro / "l.db", "--json", "verify")
    assert refused.returncode == 7, refused.stdout + refused.stderr
    assert "l.db-wal holds" in refused.stderr and "writable folder" in refused.stderr


def test_the_immutable_read_is_taken_only_where_sqlite_cannot_make_its_index(read_only: ReadOnly) -> None:
    """Either message SQLite gives (root on a read-only mount; a user without write access to the
    folder), only for a folder this process may not write, and never while a `-shm` says a
    connection has the ledger open (SQLite then reads through it by itself)."""
    from lifecycle_fsm.store.sqlite_files import on_read_only_media

    cannot_open = sqlite3.OperationalError("unable to open database file")
    read_only_file = sqlite3.OperationalError("attempt to write a readonly database")
    (read_only.src / "l.db").write_bytes(b"")
    assert not on_read_only_media(read_only.src / "l.db", cannot_open)  # a writable folder
    read_only.seal()
    ledger = read_only.ro / "l.db"
    assert on_read_only_media(ledger, cannot_open) and on_read_only_media(ledger, read_only_file)
    assert not on_read_only_media(ledger, sqlite3.OperationalError("database disk image is malformed"))
    read_only.cleanup()
    (read_only.src / "l.db-shm").write_bytes(b"")
    read_only.seal()
    assert not on_read_only_media(ledger, cannot_open)


def test_a_link_to_a_ledger_whose_wal_holds_events_is_refused_too(ws: Workspace, read_only: ReadOnly) -> None:
    """SQLite reads the -wal beside the file a link leads to: so is it judged (a link was read short)."""
    src, ro = read_only.src, read_only.ro
    _ledger(ws, src / "n.db")
    holder = sqlite3.connect(src / "n.db")  # keeps the WAL from being folded into the file
    holder.execute("SELECT count(*) FROM events").fetchone()
    with Ledger.open(src / "n.db", actor="late") as ledger:
        ledger.advance_window(2)
    shutil.copy(src / "n.db-wal", tmp_wal := src / "wal.copy")
    holder.close()
    (src / "n.db-shm").unlink(missing_ok=True)
    tmp_wal.rename(src / "n.db-wal")
    (src / "link.db").symlink_to("n.db")
    read_only.seal()
    for name in ("n.db", "link.db"):
        refused = _lifecycle(ro / name, "--json", "verify")
        assert refused.returncode == 7 and "n.db-wal holds" in refused.stderr, (name, refused.stdout, refused.stderr)


def test_a_ledger_written_while_read_immutable_is_refused_not_answered(ws: Workspace, read_only: ReadOnly) -> None:
    """Another account appends through a writable path while we read the read-only view: the next
    read says the ledger changed (before: the reader answered head 5 and count 6 in a row)."""
    _ledger(ws, read_only.src / "l.db")
    read_only.seal()
    reader = SQLiteEventStore(read_only.ro / "l.db", create=False)
    try:
        assert reader.head().seq == 4
        with Ledger.open(read_only.src / "l.db", actor="writer") as writer:  # closing folds the WAL in
            writer.advance_window(2)
        with pytest.raises(StoreError, match="changed while it was read"):
            reader.count_events()
        with pytest.raises(StoreError, match="changed while it was read"), reader.read_snapshot():
            pass
    finally:
        reader.close()


def test_a_ledger_opened_to_write_in_a_read_only_folder_says_so_and_create_false_reads_it(
    ws: Workspace, read_only: ReadOnly
) -> None:
    """`Ledger.open` said "not a usable ledger database (unable to open database file)" of a sound
    ledger whose folder it may not write. It now says what is true and how to read it;
    `create=False` opens it for reading (the store's immutable read), and its writes are refused."""
    cid = _ledger(ws, read_only.src / "l.db")
    read_only.seal()
    db = read_only.ro / "l.db"
    before = _digest(read_only.ro)
    with pytest.raises(StoreError) as info:
        Ledger.open(db)
    folder = os.path.dirname(os.path.realpath(db))
    assert str(info.value) == (
        f"{db}: cannot open the ledger to write: its folder {folder} is read-only for this process (a Ledger "
        "writes, and SQLite keeps the ledger's -wal and -shm files beside it); to read it, use "
        "Ledger.open(path, create=False) (reads work, writes are refused) or the CLI's read commands "
        "(status, log, explain, verify)"
    )
    with Ledger.open(db, create=False) as reader:
        assert reader.candidate(cid).state is State.VERIFIED
        assert [e.type for e in reader.events()][-1] == "ChecksRecorded"
        assert reader.wait_for(cid, State.VERIFIED, timeout=0) is State.VERIFIED
        with pytest.raises(StoreError, match="read-only"):
            reader.hand_off(cid)
    assert _digest(read_only.ro) == before


def test_a_new_ledger_in_a_read_only_folder_is_refused_as_before(read_only_folder: Path) -> None:
    """No ledger there: the store's own refusal (it cannot create the file), not the read-only-folder
    advice; `create=False` says there is no ledger."""
    with pytest.raises(StoreError, match="cannot create the ledger file"):
        Ledger.open(read_only_folder / "new.db")
    with pytest.raises(InputError, match="no ledger at"):
        Ledger.open(read_only_folder / "new.db", create=False)
    assert list(read_only_folder.iterdir()) == []
