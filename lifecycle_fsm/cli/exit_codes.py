"""The documented exit codes (`lifecycle --help` prints them): the one place an error or a decision becomes one."""

from __future__ import annotations

from enum import IntEnum

from lifecycle_fsm.errors import (
    ConflictError,
    InputError,
    IntegrityError,
    LifecycleError,
    NotFoundError,
    StoreError,
    WaitTimeout,
)

__all__ = ["ERROR_EXIT_CODES", "EXIT_CODES", "ExitCode", "decision_exit_code", "exit_code_for"]


class ExitCode(IntEnum):
    """What the process exit status means (the values are the contract)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    INPUT = 3
    NOT_FOUND = 4
    CONFLICT = 5
    INTEGRITY = 6
    STORE = 7
    DRILL_FAILED = 8
    TIMED_OUT = 9
    TUNE = 10
    REJECT = 11
    INCONCLUSIVE = 12
    INTERRUPTED = 130  # 128 + SIGINT, as shells report a command stopped by Ctrl-C


EXIT_CODES: dict[int, str] = {
    ExitCode.OK: "success (`verify`: the chain and every checkpoint hold)",
    ExitCode.INTERNAL: (
        "unexpected internal error (a bug: please report it with the traceback); also, silently, when the "
        "reader of stdout went away (`lifecycle log | head -1`), as click does"
    ),
    ExitCode.USAGE: "usage error: unknown command or option, missing argument",
    ExitCode.INPUT: "bad input: missing file, bad JSON, malformed manifest, unknown stage or kind",
    ExitCode.NOT_FOUND: "not found: unknown candidate id",
    ExitCode.CONFLICT: (
        "conflict: the candidate's or the ledger's state does not allow the command (a window going back), "
        "or another writer won"
    ),
    ExitCode.INTEGRITY: "integrity: the hash chain, a checkpoint or a recorded transition is broken",
    ExitCode.STORE: (
        "store or environment: the database file is unusable or stayed locked, or the filesystem cannot take "
        "an output (full, over quota, read-only); nothing half-written is left"
    ),
    ExitCode.DRILL_FAILED: (
        "`drill`: an expectation did not hold, or a fault could not be injected (inconclusive); "
        "`drill --simulate`: an invariant failed; `decisions replay`: a decision would change"
    ),
    ExitCode.TIMED_OUT: "`wait`: the candidate did not reach a wanted state before the timeout",
    ExitCode.TUNE: "`handoff --exit-status`: the hand-off decided tune",
    ExitCode.REJECT: (
        "`check --exit-status`, `handoff --exit-status`: the candidate was rejected; "
        "`wait`: it reached reject (terminal) instead of a wanted state"
    ),
    ExitCode.INCONCLUSIVE: (
        "`check --exit-status`, `handoff --exit-status`: an artifact could not be read for a reason "
        "of the environment (nothing was decided about its bytes)"
    ),
    ExitCode.INTERRUPTED: (
        "interrupted (SIGINT, Ctrl+C): a command stopped before its commit appended nothing, one stopped "
        "after it did; `status ID` tells which, and a keyed command run again is a safe retry"
    ),
}

# Most specific class first (the first match decides); a bare LifecycleError, last, is a bug.
ERROR_EXIT_CODES: tuple[tuple[type[LifecycleError], ExitCode], ...] = (
    (InputError, ExitCode.INPUT),
    (NotFoundError, ExitCode.NOT_FOUND),
    (ConflictError, ExitCode.CONFLICT),
    (WaitTimeout, ExitCode.TIMED_OUT),
    (IntegrityError, ExitCode.INTEGRITY),
    (StoreError, ExitCode.STORE),
    (LifecycleError, ExitCode.INTERNAL),
)

# (command, the state it left) -> the code `--exit-status` and `wait` end with, else 0; a passed check
# leaves a tuned candidate in tune, so for `check` only a rejection fails.
_DECISION_CODES = {
    ("check", "reject"): ExitCode.REJECT,
    ("handoff", "tune"): ExitCode.TUNE,
    ("handoff", "reject"): ExitCode.REJECT,
    ("wait", "reject"): ExitCode.REJECT,
}


def exit_code_for(error: LifecycleError) -> ExitCode:
    """The exit code a refusal ends the process with."""
    return next(code for cls, code in ERROR_EXIT_CODES if isinstance(error, cls))


def decision_exit_code(command: str, state: str, *, inconclusive: bool = False) -> ExitCode:
    """The code a script gates on after `command`: 0 only for a pass or ready."""
    return ExitCode.INCONCLUSIVE if inconclusive else _DECISION_CODES.get((command, str(state)), ExitCode.OK)
