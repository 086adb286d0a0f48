"""Taking the SQLite write lock (`BEGIN IMMEDIATE`) with short, jittered waits.

Why not leave the waiting to SQLite's busy handler: it sleeps 1, 2, 5, 10, 15, 20, 25 ms…
between tries, while a command holds the lock for a fraction of a millisecond, so with
several writers the lock sits free while every waiter sleeps. Here each try fails at
once (the connection's busy timeout is 0 while it writes: `SQLiteEventStore._begin`)
and the wait before the next is drawn from a window that grows from 50 µs to 2 ms (full
jitter, so waiters do not retry in step), until the store's own busy timeout has passed.
It is still the database's lock, taken by the database; nothing is held in process.
"""

from __future__ import annotations

import random
import sqlite3
import time

__all__ = ["begin_immediate"]

_FIRST_WINDOW = 0.00005  # seconds: the first wait is drawn from [0, 50 µs]
_MAX_WINDOW = 0.002  # the window doubles per failed try up to 2 ms


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
