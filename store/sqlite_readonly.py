"""Reading a ledger in a folder this process may not write (a read-only mount, a reader's
account without write access).

A WAL ledger is read through its `-shm` index, which SQLite creates beside the file
on first open; where it cannot, every read failed ("unable to open database file", or
"attempt to write a readonly database" for a file we may not write). There the store
opens the file `immutable` instead: no `-shm`, no locks, no WAL. That is only the truth
when no connection has the ledger open and the WAL holds nothing, so it is taken only
when the folder is not writable and there is no `-shm` (a writer holding the ledger open
keeps one, and then SQLite reads through it by itself), and a non-empty `-wal`
(committed events not yet in the main file, which an immutable read would silently
leave out) is refused instead.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from store.errors import StoreError

__all__ = ["open_immutable", "on_read_only_media"]


def on_read_only_media(path: Path, error: sqlite3.Error) -> bool:
    """SQLite could not create the ledger's `-shm`: its folder may not be written, and no
    connection has the ledger open (none keeps a `-shm` there)."""
    message = str(error)
    return (
        ("unable to open database file" in message or "readonly database" in message)
        and not os.access(path.parent, os.W_OK)
        and not Path(f"{path}-shm").exists()
    )


def open_immutable(path: Path) -> sqlite3.Connection:
    """The ledger as an immutable file, or StoreError when its `-wal` holds events."""
    wal = Path(f"{path}-wal")
    size = wal.stat().st_size if wal.exists() else 0
    if size:
        raise StoreError(
            f"{path}: its folder is read-only and {wal.name} holds {size} bytes of events not yet in the "
            f"ledger file, which SQLite cannot read without creating {path.name}-shm; copy the ledger with "
            "its -wal file to a writable folder to read it"
        )
    return sqlite3.connect(f"file:{quote(str(path.resolve()))}?immutable=1", uri=True, isolation_level=None)
