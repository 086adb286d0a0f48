"""The project's error tree root and the errors a store can raise.

The root lives here, at the bottom of the dependency graph, so that `store/` needs
nothing from the domain and every error in the project still shares one root. The
domain adds its own leaves in `lifecycle_fsm/errors.py`, which re-exports these.
Every error also inherits the builtin it resembles and keeps structured fields.
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
]


class LifecycleError(Exception):
    """Root of every error the library raises on purpose."""


class InputError(LifecycleError, ValueError):
    """The input cannot be used: a missing file, bad JSON, a malformed manifest."""


class NotFoundError(LifecycleError, LookupError):
    """No such candidate (or event) in the ledger."""


class ConflictError(LifecycleError):
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
    """The log, its hash chain or a checkpoint does not hold together."""

    def __init__(self, message: str, *, seq: int | None = None, **details: Any) -> None:
        super().__init__(message)
        self.seq = seq
        self.details = details


class StoreError(LifecycleError):
    """The database itself failed (locked too long, disk full, not a ledger file)."""
