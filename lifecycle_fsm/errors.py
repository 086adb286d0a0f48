"""The exceptions lifecycle-fsm raises, one shallow tree under `LifecycleError`. It imports nothing of
ours: the store, the domain and replay share it.

An error that resembles a builtin also inherits it (IntegrityError alone on purpose has none); its
structured fields (`seq`, `stream_id`, …) survive pickling. Exit codes are the CLI's business
(`lifecycle_fsm.cli.exit_codes`); the store translates driver errors into these at its boundary.
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ArtifactError",
    "ArtifactUnreadable",
    "ConcurrencyError",
    "ConflictError",
    "CorruptionError",
    "DuplicateEventError",
    "IllegalCommandError",
    "InputError",
    "IntegrityError",
    "LedgerClosedError",
    "LifecycleError",
    "NotFoundError",
    "ScenarioError",
    "StoreError",
    "WaitTimeout",
]


def _rebuild(cls: type[LifecycleError], args: tuple[Any, ...]) -> LifecycleError:
    """Unpickle an error without calling `__init__` (its fields come back from its `__dict__`)."""
    error = cls.__new__(cls, *args)
    error.args = args  # OSError.__new__ leaves args empty when a subclass defines __init__
    return error


class LifecycleError(Exception):
    """Root of every error the library raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default re-calls `cls(*args)`, which fails for keyword-only fields: an error raised in
        # a worker process would not reach its parent.
        return _rebuild, (type(self), self.args), self.__dict__


class InputError(LifecycleError, ValueError):
    """The input cannot be used: a missing file, bad JSON, a malformed manifest."""


class NotFoundError(LifecycleError, LookupError):
    """No such candidate (or stream) in the ledger; `candidate_id` names the candidate looked up."""

    def __init__(self, message: str, *, candidate_id: str | None = None) -> None:
        super().__init__(message)
        self.candidate_id = candidate_id


class ConflictError(LifecycleError, RuntimeError):
    """The command is well-formed but not allowed in the ledger's current state."""


class ConcurrencyError(ConflictError):
    """Another writer appended to a stream this command read; retry the command."""

    def __init__(self, message: str, *, stream_id: str, expected_version: int, actual_version: int) -> None:
        super().__init__(message)
        self.stream_id = stream_id
        self.expected_version = expected_version
        self.actual_version = actual_version


class DuplicateEventError(ConflictError):
    """An event_id was reused for different content."""

    def __init__(self, message: str, *, event_id: str, seq: int) -> None:
        super().__init__(message)
        self.event_id = event_id
        self.seq = seq


class IntegrityError(LifecycleError):
    """The log, its hash chain or a checkpoint does not hold together.

    No builtin base: the fold's own `except ValueError` around payload parsing must never catch it.
    """

    def __init__(self, message: str, *, seq: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self.seq = seq
        self.details = details


class StoreError(LifecycleError, OSError):
    """The database itself failed (locked too long, disk full, not a ledger file).

    Always one message, so `str(e)` is that message (not OSError's "[Errno …] …").
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)


class ArtifactError(InputError):
    """An artifact cannot be hashed: missing, outside the root, a link loop, changing."""


class ArtifactUnreadable(ArtifactError):
    """An artifact could not be read for a reason of the environment (permission, I/O, an absent root):
    a check that meets it is inconclusive."""


class ScenarioError(InputError):
    """A drill scenario file is malformed (names file, step and key)."""


class IllegalCommandError(ConflictError):
    """The state machine's table does not allow this command in this state."""

    def __init__(self, message: str, *, state: str | None, trigger: str) -> None:
        super().__init__(message)
        self.state = state
        self.trigger = trigger


class CorruptionError(IntegrityError):
    """Replay found a recorded sequence the machine's table forbids, or an unreadable event."""


class LedgerClosedError(StoreError):
    """A Ledger (or its store) was used after `close()`."""


class WaitTimeout(LifecycleError, TimeoutError):
    """`wait_for` gave up: the candidate did not reach any of the states in time, or it was rejected.

    Defined here (not in `feed.py`) so the CLI's exit-code table does not import the Ledger's modules.
    """

    def __init__(self, message: str, *, candidate_id: str, states: tuple[str, ...], last_state: str | None) -> None:
        super().__init__(message)
        self.candidate_id = candidate_id
        self.states = states
        self.last_state = last_state
