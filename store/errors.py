"""The project's error tree root and the errors a store can raise.

The root lives here, at the bottom of the dependency graph, so that `store/` needs
nothing from the domain and every error in the project still shares one root. The
domain adds its own leaves in `lifecycle_fsm/errors.py`, which re-exports these and
draws the whole tree. An error that resembles a builtin also inherits it; every error
keeps structured fields and survives pickling with them. Exit codes are not here:
the CLI maps classes to codes (`lifecycle_fsm.cli.exit_codes`).
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "ConcurrencyError",
    "ConflictError",
    "DuplicateEventError",
    "InputError",
    "IntegrityError",
    "LifecycleError",
    "NotFoundError",
    "StoreError",
    "write_in_read_snapshot",
    "write_in_transaction",
]


def _rebuild(cls: type[LifecycleError], args: tuple[Any, ...]) -> LifecycleError:
    """Unpickle an error without calling `__init__` (its fields come back from its `__dict__`)."""
    error = cls.__new__(cls, *args)
    error.args = args  # OSError.__new__ leaves args empty when a subclass defines __init__
    return error


class LifecycleError(Exception):
    """Root of every error the library raises on purpose."""

    def __reduce__(self) -> tuple[Any, ...]:
        # The default re-calls `cls(*args)`, which fails for leaves with keyword-only fields
        # (ConcurrencyError, DuplicateEventError, …): an error raised in a worker process
        # (multiprocessing, concurrent.futures) would not come back to its parent.
        return _rebuild, (type(self), self.args), self.__dict__


class InputError(LifecycleError, ValueError):
    """The input cannot be used: a missing file, bad JSON, a malformed manifest."""


class NotFoundError(LifecycleError, LookupError):
    """No such candidate (or event) in the ledger."""


class ConflictError(LifecycleError, RuntimeError):
    """The command is well-formed but not allowed in the ledger's current state.

    A `RuntimeError`, as the standard library's own refusals of a call in the wrong
    state are (starting a thread twice, running a closed event loop).
    """


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

    Deliberately no builtin base: corrupt history is neither a bad argument
    (`ValueError`) nor a failing device (`OSError`), and the fold's own
    `except ValueError` around payload parsing must never catch and re-label it.
    """

    def __init__(self, message: str, *, seq: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self.seq = seq
        self.details = details


class StoreError(LifecycleError, OSError):
    """The database itself failed (locked too long, disk full, not a ledger file).

    An `OSError`, as a failing file or disk is. Always built from one message, so
    `str(e)` is that message: `errno`, `strerror` and `filename` stay None (OSError's
    two-argument form would print "[Errno …] …" instead).
    """

    def __init__(self, message: str) -> None:
        super().__init__(message)


def write_in_read_snapshot(where: object) -> InputError:
    """What a write through a store handle inside its own `read_snapshot()` raises."""
    return InputError(f"{where}: a write inside read_snapshot() is refused (it holds one read transaction)")


def write_in_transaction(where: object) -> InputError:
    """What a write through a store handle inside its own open `transaction()` raises (write through
    the transaction; a second transaction on the same connection cannot be had)."""
    return InputError(
        f"{where}: a write through the store inside its own open transaction is refused (use the transaction's methods)"
    )
