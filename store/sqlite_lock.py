"""Taking the SQLite write lock: our writers queue for it in the kernel, then `BEGIN IMMEDIATE`.

Why a queue in front of SQLite's lock: SQLite as Python ships it cannot block on its
write lock, only fail and be retried. Its busy handler sleeps 1, 2, 5, 10 ms… between
tries while a command holds the lock for a fraction of a millisecond; our own short
jittered sleeps keep the lock busier, but every waiter keeps waking up, trying and
failing, and on a busy machine each wake-up can preempt the holder (8 writers on 2
cores: ~460 µs CPU per command; ~360 µs when the waiters block instead). So a writer
first takes an exclusive `flock` on `<ledger>-lock` (`WriterQueue`): a waiter sleeps in
the kernel until the holder lets go, and no CPU is spent on tries that cannot succeed.

The file only orders our own writers: the database's lock is still the one that
counts. `BEGIN IMMEDIATE` is taken after the file lock as before, retried after short
jittered waits of our own for any writer that does not use the file (another program,
an older release, a file reached through another path), and nothing is held in
process. A crashed holder's `flock` goes with its process. A file that cannot be
opened or locked (a read-only folder, a system or file system without `flock`) leaves SQLite's
lock alone to order writers.

`flock` cannot time out, and a write gives up after the store's busy timeout; so a
writer that finds the file locked waits on a helper thread (one per queue, started on
first contention) that blocks in `flock` on a descriptor of its own, for at most the
time left. A wait given up is finished by the helper, which then unlocks at once.
"""

from __future__ import annotations

import os
import random
import sqlite3
import threading
import time
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # imported when a writer first waits (start-up of a read never needs it)
    import queue

__all__ = ["WriterQueue", "begin_immediate"]

_FIRST_WINDOW = 0.00005  # seconds: the first wait is drawn from [0, 50 µs]
_MAX_WINDOW = 0.002  # the window doubles per failed try up to 2 ms
_OPEN_FLAGS = os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0)


def _is_busy(error: sqlite3.OperationalError) -> bool:
    code = getattr(error, "sqlite_errorcode", None)
    return code is not None and code & 0xFF == sqlite3.SQLITE_BUSY


def begin_immediate(conn: sqlite3.Connection, timeout: float) -> None:
    """`BEGIN IMMEDIATE` on a connection whose busy timeout is 0, retried after short random waits.

    The waits are drawn from a window that grows from 50 µs to 2 ms (full jitter, so
    waiters do not retry in step) until `timeout` seconds have passed; then the last
    `sqlite3.OperationalError` is raised (at once for any error that is not "busy").
    """
    deadline = None
    window = _FIRST_WINDOW
    while True:
        try:
            conn.execute("BEGIN IMMEDIATE")
            return
        except sqlite3.OperationalError as e:
            if not _is_busy(e):
                raise
            now = time.monotonic()
            if deadline is None:
                deadline = now + timeout
            if now >= deadline:
                raise
            time.sleep(min(random.uniform(0.0, window), deadline - now))
            window = min(window * 2, _MAX_WINDOW)


class _Wait:
    """One wait for the file lock, handed to the helper thread."""

    def __init__(self) -> None:
        self.done = threading.Event()
        self.mutex = threading.Lock()
        self.fd: int | None = None  # the helper's descriptor, holding the lock, once done
        self.abandoned = False


def _serve(path: str, waits: queue.SimpleQueue[_Wait | None]) -> None:
    """The helper thread: block in `flock` on a descriptor of its own for each wait in turn
    (None stops it). A wait given up meanwhile is let go at once."""
    import fcntl

    fd = None
    while (wait := waits.get()) is not None:
        try:
            if fd is None:
                fd = os.open(path, _OPEN_FLAGS, 0o600)
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError:
            with wait.mutex:
                wait.done.set()  # no descriptor: the writer falls back on the database's lock
            continue
        with wait.mutex:
            if wait.abandoned:
                fcntl.flock(fd, fcntl.LOCK_UN)
                continue
            wait.fd = fd
            wait.done.set()
    if fd is not None:
        os.close(fd)


class WriterQueue:
    """Our writers' turn at the write lock: an exclusive `flock` on one file (module docstring).

    `take` returns False when the file cannot be used, so SQLite's lock alone orders
    writers; `give_back` after the transaction ends (committed or rolled back).
    """

    def __init__(self, path: str) -> None:
        try:
            import fcntl  # here, not at import: a read command never writes (start-up)
        except ImportError:  # no flock on this system: the database's lock alone
            fcntl = None  # type: ignore[assignment]
        self._fcntl = fcntl
        self._path = path
        self._fd: int | None = None  # opened on the first write
        self._usable = fcntl is not None
        self._held: int | None = None  # the descriptor holding the lock now
        self._waits: queue.SimpleQueue[_Wait | None] | None = None
        self._helper_pid = 0

    def take(self, timeout: float) -> bool:
        """Wait up to `timeout` seconds for our turn; TimeoutError when it does not come."""
        if not self._usable:
            return False
        try:
            if self._fd is None:
                self._fd = os.open(self._path, _OPEN_FLAGS, 0o600)
            self._fcntl.flock(self._fd, self._fcntl.LOCK_EX | self._fcntl.LOCK_NB)
        except BlockingIOError:
            return self._wait(timeout)
        except OSError:
            self._usable = False  # read-only folder, no flock here: the database's lock alone
            return False
        self._held = self._fd
        return True

    def give_back(self) -> None:
        held, self._held = self._held, None
        if held is None:
            return
        self._fcntl.flock(held, self._fcntl.LOCK_UN)  # ours, or the helper's (it keeps it open)

    def close(self) -> None:
        self.give_back()
        if self._waits is not None:
            self._waits.put(None)
            self._waits = None
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    def _wait(self, timeout: float) -> bool:
        if self._waits is None or self._helper_pid != os.getpid():  # none yet, or inherited across fork
            import queue

            self._waits = queue.SimpleQueue()
            self._helper_pid = os.getpid()
            helper = threading.Thread(target=_serve, args=(self._path, self._waits), daemon=True)
            helper.name = "lifecycle-write-queue"
            helper.start()
            weakref.finalize(self, self._waits.put, None)  # stop the helper with its queue
        wait = _Wait()
        self._waits.put(wait)
        wait.done.wait(timeout)
        with wait.mutex:
            if not wait.done.is_set():
                wait.abandoned = True
                raise TimeoutError(f"another writer kept {self._path} locked for {timeout:g} s")
        if wait.fd is None:  # the helper could not lock the file
            self._usable = False
            return False
        self._held = wait.fd
        return True
