"""Reading a ledger kept on read-only media (an auditor's copy on a read-only mount).

A WAL ledger is read through its `-shm` index, which SQLite creates beside the file
on first open; in a folder nobody may write it cannot, and every read failed with
"unable to open database file". There the store opens the file `immutable` instead:
no `-shm`, no locks, no WAL. That is only the truth when nothing can change the file
and the WAL holds nothing, so it is taken only when the folder is not writable, and
a non-empty `-wal` (committed events not yet in the main file, which an immutable
read would silently leave out) is refused instead.
"""

from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from urllib.parse import quote

from store.errors import StoreError

__all__ = ["open_immutable", "on_read_only_media"]


def on_read_only_media(path: Path, error: sqlite3.Error) -> bool:
    """SQLite could not open the ledger's `-shm` because its folder may not be written."""
    return "unable to open database file" in str(error) and not os.access(path.parent, os.W_OK)


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
