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

from lifecycle_fsm.store.errors import StoreError

__all__ = ["ImmutableRead", "on_read_only_media"]


def on_read_only_media(path: Path, error: sqlite3.Error) -> bool:
    """SQLite could not create the ledger's `-shm`: its folder may not be written, and no
    connection has the ledger open (none keeps a `-shm` there). Judged at the file a link
    leads to, where SQLite keeps its `-wal` and `-shm`."""
    message = str(error)
    real = Path(os.path.realpath(path))
    return (
        ("unable to open database file" in message or "readonly database" in message)
        and not os.access(real.parent, os.W_OK)
        and not Path(f"{real}-shm").exists()
    )


class ImmutableRead:
    """The ledger file opened immutable, and what it was when opened.

    Immutable means SQLite takes no lock and trusts the file not to change. Another
    account may still write it through a writable path: `check` (before every read, and
    when a read snapshot ends) refuses to answer once the file, or its `-wal`, moved.
    """

    def __init__(self, path: Path) -> None:
        self.real = Path(os.path.realpath(path))
        self.shown = path
        size = self._wal_size()
        if size:
            raise StoreError(
                f"{path}: its folder is read-only and {self.real.name}-wal holds {size} bytes of events not yet "
                f"in the ledger file, which SQLite cannot read without creating {self.real.name}-shm; copy the "
                "ledger with its -wal file to a writable folder to read it"
            )
        self.identity = self._identity()
        self.conn = sqlite3.connect(f"file:{quote(str(self.real))}?immutable=1", uri=True, isolation_level=None)

    def _wal_size(self) -> int:
        try:
            return Path(f"{self.real}-wal").stat().st_size
        except FileNotFoundError:
            return 0

    def _identity(self) -> tuple[int, int, int, int]:
        st = self.real.stat()
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def check(self) -> None:
        """StoreError once the file is not the one opened, or a writer's `-wal` holds events."""
        try:
            moved = self._identity() != self.identity or self._wal_size() > 0
        except OSError:
            moved = True
        if moved:
            raise StoreError(
                f"{self.shown}: the ledger changed while it was read as an immutable file (a writer with access to "
                "its folder appended); read it again"
            )
