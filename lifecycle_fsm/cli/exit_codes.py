"""The documented exit codes, and which error class ends in which.

Exit codes belong to the command line: the error classes say *what* went wrong, this
table says what a shell sees (httpx keeps the same split). README's exit-code table
documents `EXIT_CODES` word for word (`lifecycle --help` prints them; a test compares the
two); a test checks that every error class maps to one of them.
"""

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

__all__ = ["ERROR_EXIT_CODES", "EXIT_CODES", "ExitCode", "exit_code_for"]


class ExitCode(IntEnum):
    """What the process exit status means (the values are the contract, SPEC §6)."""

    OK = 0
    INTERNAL = 1
    USAGE = 2
    INPUT = 3
    NOT_FOUND = 4
    CONFLICT = 5
    INTEGRITY = 6
    STORE = 7
    DRILL_FAILED = 8
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
        "conflict: the candidate's state does not allow the command, another writer won, or a wait timed out"
    ),
    ExitCode.INTEGRITY: "integrity: the hash chain, a checkpoint or a recorded transition is broken",
    ExitCode.STORE: "store: the database file is unusable or stayed locked",
    ExitCode.DRILL_FAILED: (
        "`drill`: an expectation did not hold, or a fault could not be injected (inconclusive); "
        "`drill --simulate`: an invariant failed; `decisions replay`: a decision would change"
    ),
    ExitCode.INTERRUPTED: (
        "interrupted (SIGINT, Ctrl+C): a command stopped before its commit appended nothing, one stopped "
        "after it did; `status ID` tells which, and a keyed command run again is a safe retry"
    ),
}

# Most specific class first: the first entry the error is an instance of decides. Leaves
# (ArtifactError, IllegalCommandError, CorruptionError, …) share their branch's code; give
# one its own row above its branch if it ever needs a different code. The root comes last:
# a bare LifecycleError is a bug, not a documented refusal.
ERROR_EXIT_CODES: tuple[tuple[type[LifecycleError], ExitCode], ...] = (
    (InputError, ExitCode.INPUT),
    (NotFoundError, ExitCode.NOT_FOUND),
    (ConflictError, ExitCode.CONFLICT),
    (WaitTimeout, ExitCode.CONFLICT),  # the candidate did not reach the awaited state in time
    (IntegrityError, ExitCode.INTEGRITY),
    (StoreError, ExitCode.STORE),
    (LifecycleError, ExitCode.INTERNAL),
)


def exit_code_for(error: LifecycleError) -> ExitCode:
    """The exit code a refusal ends the process with."""
    for cls, code in ERROR_EXIT_CODES:
        if isinstance(error, cls):
            return code
    return ExitCode.INTERNAL  # pragma: no cover - the root's row above catches every LifecycleError
