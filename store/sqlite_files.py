"""The ledger's file on disk, and what `sqlite3` raises translated into the project's error tree.

The file is created 0600, never over an orphaned WAL, and read immutable on read-only media: where SQLite
cannot create the `-shm` beside the file (a read-only folder) it is opened `immutable` (no `-shm`, locks or
WAL): only when there is no `-shm` (no writer has it open), and never over a non-empty `-wal`, whose
committed events an immutable read would leave out.

Nothing from `sqlite3` crosses the store's API. A damaged file fails in many ways; a value that is not
valid UTF-8 means the data was altered (`IntegrityError`), use from another thread is misuse
(`InputError`), anything else means the file is unusable (`StoreError`).
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

from lifecycle_fsm.errors import IntegrityError, LifecycleError, StoreError
from lifecycle_fsm.store.sql import derived_table_dropped
from lifecycle_fsm.store.threads import wrong_thread

SQLITE_FAILURES = (sqlite3.DatabaseError, UnicodeDecodeError)
_MAX_DETAIL = 200  # a decode error quotes the whole damaged value; one line is enough


def begin_immediate(conn: sqlite3.Connection, timeout: float, where: object) -> None:
    """`BEGIN IMMEDIATE` on a connection whose busy timeout is 0, retried after short random waits (a window
    from 50 µs to 2 ms, full jitter) until `timeout`: SQLite's busy handler sleeps milliseconds while the
    lock is held for a fraction of one."""
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
    """Create a new ledger file 0600 (SQLite gives its -wal and -shm the same mode), never beside a `-wal`
    holding events (its file was moved: SQLite would discard it). An existing file is left as it is,
    or with `exclusive` refused (`FileExistsError`)."""
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
        size = _wal_size(path)
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


def _wal_size(path: object) -> int:
    try:
        return Path(f"{path}-wal").stat().st_size
    except FileNotFoundError:
        return 0


_KEPT: list[object] = []


def keep_for_good(obj: object) -> None:
    """Hold `obj` past interpreter shutdown (freeing an sqlite3 connection closes it): how a forked child
    leaves the parent's connection alone."""
    _KEPT.append(obj)
    try:
        import ctypes

        ctypes.pythonapi.Py_IncRef(ctypes.py_object(obj))
    except (ImportError, AttributeError, OSError):  # no ctypes: the module-level reference still holds
        pass


def on_read_only_media(path: Path, error: sqlite3.Error) -> bool:
    """SQLite could not create the `-shm` of the file (a link's target) in a folder it may not write, and
    no connection has the ledger open (none keeps a `-shm` there)."""
    message = str(error)
    real = Path(os.path.realpath(path))
    return (
        ("unable to open database file" in message or "readonly database" in message)
        and not os.access(real.parent, os.W_OK)
        and not Path(f"{real}-shm").exists()
    )


class ImmutableRead:
    """The ledger file opened immutable, and what it was when opened: `check` (before every read, and
    when a read snapshot ends) refuses to answer once the file, or its `-wal`, changed."""

    def __init__(self, path: Path) -> None:
        self.real = Path(os.path.realpath(path))
        self.shown = path
        size = _wal_size(self.real)
        if size:
            raise StoreError(
                f"{path}: its folder is read-only and {self.real.name}-wal holds {size} bytes of events not yet "
                f"in the ledger file, which SQLite cannot read without creating {self.real.name}-shm; copy the "
                "ledger with its -wal file to a writable folder to read it"
            )
        self.identity = self._identity()
        self.conn = sqlite3.connect(f"file:{quote(str(self.real))}?immutable=1", uri=True, isolation_level=None)

    def _identity(self) -> tuple[int, int, int, int]:
        st = self.real.stat()
        return st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns

    def check(self) -> None:
        """StoreError once the file is not the one opened, or a writer's `-wal` holds events."""
        try:
            moved = self._identity() != self.identity or _wal_size(self.real) > 0
        except OSError:
            moved = True
        if moved:
            raise StoreError(
                f"{self.shown}: the ledger changed while it was read as an immutable file (a writer with access to "
                "its folder appended); read it again"
            )


class OpenedFiles:
    """The ledger file, its `-wal` and its `-shm` as a connection opened them (device and inode).

    SQLite never looks at their names again: one deleted or replaced means the next process opens a
    new one (a new `-shm`: two WAL indexes writing over each other's frames; a deleted file: appends
    nobody reads). `check`, before each commit, refuses the write then. A file not there at open is
    not held to anything.
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
        """The first file missing or no longer the one opened, if any (`but_wal`: not the `-wal`)."""
        for name, identity in self._files:
            if not (but_wal and name.endswith("-wal")) and _inode(name) != identity:
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


def _inode(name: str) -> tuple[int, int] | None:
    try:
        st = os.stat(name)
    except OSError:
        return None
    return st.st_dev, st.st_ino


def close_without_checkpoint(conn: sqlite3.Connection, files: OpenedFiles) -> None:
    """Close a connection whose files were deleted or replaced, without its closing checkpoint when its
    `-shm` or the ledger file is not the one others use (through a stale `-shm` it would write old pages
    over others' appends). With only the `-wal` gone it closes as usual (its checkpoint saves the
    commits). SQLite skips the checkpoint while a read-only connection of the process holds the file's
    shared lock, so one is held while `conn` closes; with the ledger file gone, `conn` is never closed.
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


def translate_sqlite_error(error: BaseException, where: object) -> LifecycleError:
    detail = " ".join(str(error).split())
    if len(detail) > _MAX_DETAIL:
        detail = detail[:_MAX_DETAIL] + "…"
    if isinstance(error, sqlite3.ProgrammingError) and "same thread" in detail:
        return wrong_thread(where)
    if isinstance(error, UnicodeDecodeError) or "Could not decode to UTF-8" in detail:
        return IntegrityError(f"{where}: a stored value is not valid UTF-8, the ledger file is damaged ({detail})")
    if "readonly" in detail or "read-only" in detail:
        return StoreError(f"{where}: the ledger database is read-only ({detail})")
    if detail.startswith("no such table: ") and (dropped := derived_table_dropped(where, detail[15:], detail)):
        return dropped
    return StoreError(f"{where}: the ledger database failed, it may be damaged or not a ledger ({detail})")
