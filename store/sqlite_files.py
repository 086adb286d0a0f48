"""The ledger's file on disk: created 0600, never over an orphaned WAL, read immutable on read-only media.

A WAL ledger is read through its `-shm` index, which SQLite creates beside the file
on first open; where it cannot (a read-only mount, a reader's account without write
access), every read failed. There the store opens the file `immutable` instead: no
`-shm`, no locks, no WAL. That is only the truth when no connection has the ledger
open and the WAL holds nothing, so it is taken only when the folder is not writable and
there is no `-shm` (a writer holding the ledger open keeps one, and then SQLite reads
through it by itself), and a non-empty `-wal` (committed events not yet in the main
file, which an immutable read would silently leave out) is refused instead.
"""

from __future__ import annotations

import contextlib
import errno
import os
import random
import sqlite3
import time
from pathlib import Path
from urllib.parse import quote

from lifecycle_fsm.errors import StoreError

__all__ = [
    "ImmutableRead",
    "OpenedFiles",
    "begin_immediate",
    "close_without_checkpoint",
    "create_ledger_file",
    "keep_for_good",
    "on_read_only_media",
]


def begin_immediate(conn: sqlite3.Connection, timeout: float, where: object) -> None:
    """`BEGIN IMMEDIATE` on a connection whose busy timeout is 0, retried after short random waits.

    SQLite's own busy handler sleeps 1, 2, 5, 10 ms… between tries while a command holds the
    lock for a fraction of a millisecond, so with several writers the lock sat free while every
    waiter slept. Here the wait is drawn from a window growing from 50 µs to 2 ms (full jitter,
    so waiters do not retry in step) until `timeout` seconds have passed. It is still the
    database's lock, taken by the database.
    """
    deadline, window = time.monotonic() + timeout, 0.00005
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as e:
            now = time.monotonic()
            if getattr(e, "sqlite_errorcode", 0) & 0xFF != sqlite3.SQLITE_BUSY or now >= deadline:
                raise StoreError(f"{where}: could not take the write lock ({e})") from e
        time.sleep(min(random.uniform(0.0, window), deadline - now))
        window = min(window * 2, 0.002)


def create_ledger_file(path: Path, *, exclusive: bool = False) -> None:
    """Create a new ledger file 0600 (SQLite then gives its -wal and -shm the same mode).

    Not beside a `-wal` that holds events: its ledger file was deleted or moved, and a new
    one here would silently start over (SQLite discards a WAL that is not its file's).
    An existing file is left as it is, or with `exclusive` refused (`FileExistsError`).
    """
    if str(path) in ("", ":memory:"):
        return
    if os.path.lexists(path):
        if exclusive:
            raise FileExistsError(errno.EEXIST, "File exists", str(path))
        if os.path.islink(path) and not os.path.exists(path):
            # A link to a ledger not made yet: make its target 0600 here, or SQLite makes it with the umask's mode.
            target = Path(os.path.realpath(path))
            if os.path.lexists(target):  # still a link once resolved: a loop
                raise StoreError(f"{path}: a symbolic link loop, not a ledger file")
            create_ledger_file(target)
        return
    try:
        size = Path(f"{path}-wal").stat().st_size
    except FileNotFoundError:
        size = 0
    except OSError as e:  # a folder that is a file, a name too long for its -wal, a folder we may not search
        raise StoreError(f"{path}: cannot create the ledger file ({e.strerror})") from e
    if size and not path.exists():  # again: another process may have just made the ledger and its WAL
        raise StoreError(
            f"{path}: no ledger file, but {path.name}-wal holds {size} bytes of its events; "
            "restore the ledger file (or move the -wal away) instead of starting a new ledger over them"
        )
    try:
        os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600))
    except FileExistsError:
        if exclusive:
            raise
    except OSError as e:
        raise StoreError(f"{path}: cannot create the ledger file ({e.strerror})") from e


_KEPT: list[object] = []


def keep_for_good(obj: object) -> None:
    """Hold `obj` until the process ends, past interpreter shutdown (which frees what it can, and
    freeing an sqlite3 connection closes it): how a forked child leaves the parent's connection alone."""
    _KEPT.append(obj)
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except (ImportError, AttributeError, OSError):  # no ctypes: the module-level reference still holds
        pass


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


class OpenedFiles:
    """The ledger file, its `-wal` and its `-shm` as a connection opened them (device and inode).

    SQLite keeps all three open by descriptor and never looks at their names again. If one
    is deleted or replaced while the connection is open, the next process opens a new one
    beside it: a new `-shm` gives that process a WAL index of its own, so it and this
    connection write over each other's WAL frames, and an append into a deleted ledger file
    lands nowhere anyone will read. `check`, just before each commit (one `os.stat` per file),
    refuses the write then instead of acknowledging it. A `-wal` or `-shm` that did not exist
    at open is not held to anything.
    """

    def __init__(self, path: Path) -> None:
        real = self.real = os.path.realpath(path)
        self.shown = path
        self._files: list[tuple[str, tuple[int, int]]] = []
        for name in (real, f"{real}-wal", f"{real}-shm"):
            with contextlib.suppress(FileNotFoundError):
                st = os.stat(name)
                self._files.append((name, (st.st_dev, st.st_ino)))

    def changed(self, *, but_wal: bool = False) -> str | None:
        """The first file that is missing or no longer the one opened, None when all still are (`but_wal`:
        of the ledger file and its `-shm`)."""
        for name, identity in self._files:
            if but_wal and name.endswith("-wal"):
                continue
            try:
                st = os.stat(name)
            except OSError:
                return name
            if (st.st_dev, st.st_ino) != identity:
                return name
        return None

    def check(self) -> None:
        """StoreError, naming the file, once one is missing or not the file this connection opened."""
        name = self.changed()
        if name is not None:
            raise StoreError(
                f"{name}: deleted or replaced while {self.shown} was open, so a write through this connection "
                "could be lost; nothing was written: close the ledger and open it again"
            )


def close_without_checkpoint(conn: sqlite3.Connection, files: OpenedFiles) -> None:
    """Close a connection whose files were deleted or replaced; without its closing checkpoint when
    its WAL index (the `-shm`) or the ledger file is not the one others use.

    The last connection to close checkpoints the WAL into the ledger file through its WAL
    index, then deletes the WAL by name. With only the `-wal` deleted that checkpoint is
    what saves the commits made into it, so `conn` closes as usual. Through a stale `-shm`
    it would write old pages over what other processes appended since, and delete their
    WAL. SQLite skips it when another connection of the process holds the file's shared
    lock, and a read-only connection never checkpoints: one is opened and read from (taking
    that lock) while `conn` closes, then closed. When the ledger file itself is gone or
    replaced no such connection can reach it, and `conn` is left open until the process
    ends instead.
    """
    if files.changed(but_wal=True) is None:
        conn.close()
        return
    if files.changed(but_wal=True) == files.real:
        keep_for_good(conn)
        return
    try:
        holder = sqlite3.connect(f"file:{quote(files.real)}?mode=ro", uri=True, isolation_level=None)
        holder.execute("SELECT count(*) FROM sqlite_master").fetchone()
    except sqlite3.Error:
        keep_for_good(conn)
        return
    try:
        conn.close()
    finally:
        holder.close()
