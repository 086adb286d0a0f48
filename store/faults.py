"""Precise crash injection for drills and reliability tests (a testing aid).

A kill timed from outside almost never lands inside a write transaction, so the
store kills itself at named points when `LIFECYCLE_FAULT` asks it to:

- `kill@before_commit`   SIGKILL after a command's rows are inserted, before COMMIT;
- `kill@after_commit`    SIGKILL after COMMIT, before the append returns;
- `kill@after_begin`     SIGKILL right after the write lock is taken (SQLite: `BEGIN
  IMMEDIATE` returned; PostgreSQL: a transaction's first round trip, BEGIN and the lock,
  answered), before anything is inserted;
- `int@before_commit`, `int@after_commit`, `int@after_begin`: SIGINT (Ctrl-C) there
  instead, which the process may handle (the CLI's exit 130 is tested with it; an
  embedding supervisor that catches the KeyboardInterrupt must find its Ledger usable:
  tests/test_store_interrupts.py).

A `#N` suffix (`kill@before_commit#3`) fires the Nth time the process reaches that
point in a command (its Nth commit, or begin) instead of the first. The variable is read
once when a store opens; unset, the hook is a single `is None` test per commit.
"""

from __future__ import annotations

import os

from lifecycle_fsm.errors import InputError

ENV_VAR = "LIFECYCLE_FAULT"
POINTS = ("before_commit", "after_commit", "after_begin")
ACTIONS = ("kill", "int")


class FaultPlan:
    """Which point to kill at, and on which commit."""

    def __init__(self, point: str, nth: int, action: str = "kill") -> None:
        self.action = action
        self.point = point
        self.nth = nth
        self._seen = 0

    def reached(self, point: str) -> None:
        """Signal the process if this is the planned point and commit."""
        if point != self.point:
            return
        self._seen += 1
        if self._seen == self.nth:
            import signal  # here, not at import: every store open would pay for its enums

            os.kill(os.getpid(), signal.SIGKILL if self.action == "kill" else signal.SIGINT)


def fault_from_env() -> FaultPlan | None:
    """Parse `LIFECYCLE_FAULT`; an unknown value is an error, never ignored."""
    raw = os.environ.get(ENV_VAR)
    if not raw:
        return None
    spec, _, count = raw.partition("#")
    action, _, point = spec.partition("@")
    if action not in ACTIONS or point not in POINTS:
        choices = ", ".join(f"{a}@{p}" for a in ACTIONS for p in POINTS)
        raise InputError(f"{ENV_VAR}={raw!r} is not one of {choices}")
    try:
        nth = int(count) if count else 1
    except ValueError:
        raise InputError(f"{ENV_VAR}={raw!r}: the part after '#' must be a commit number") from None
    if nth < 1:
        raise InputError(f"{ENV_VAR}={raw!r}: the commit number must be at least 1")
    return FaultPlan(point, nth, action)
