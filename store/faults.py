"""Precise crash injection for drills and reliability tests (a testing aid): `LIFECYCLE_FAULT`.

`kill@P` SIGKILLs the process, `int@P` sends it SIGINT (which an embedder may handle) at a point P:
`after_begin` (the write lock taken, nothing inserted), `before_commit` (a command's rows inserted)
or `after_commit` (before the append returns). A `#N` suffix fires at the Nth time the process
reaches P instead of the first. Read once when a store opens; unset, it costs an `is None` test.
"""

from __future__ import annotations

import os

import attrs

from lifecycle_fsm.errors import InputError

ENV_VAR = "LIFECYCLE_FAULT"
POINTS = ("before_commit", "after_commit", "after_begin")
ACTIONS = ("kill", "int")


@attrs.define
class FaultPlan:
    """Which point to signal at, on which pass, and how."""

    point: str
    nth: int
    action: str = "kill"
    _seen: int = 0

    def reached(self, point: str) -> None:
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
