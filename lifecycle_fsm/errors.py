"""The exceptions lifecycle-fsm raises, one shallow tree under `LifecycleError`.

The root and the store's errors are defined in `store/errors.py` (the bottom of the
dependency graph) and re-exported here with the domain's own leaves.

An error that resembles a builtin also inherits it, so callers who only know the
standard library can still catch it; IntegrityError alone has none, on purpose (its
docstring says why). Every error keeps structured fields for machines (`seq`,
`stream_id`, `expected_version`, …) and survives pickling with them. Which exit code
each one ends in is the CLI's business (`lifecycle_fsm.cli.exit_codes`), not theirs.

    LifecycleError
    ├── InputError (ValueError)          bad file, bad JSON, bad manifest, unknown stage/kind
    │   ├── ArtifactError                an artifact cannot be hashed (missing, escapes, loop)
    │   └── ScenarioError                a drill file is malformed
    ├── NotFoundError (LookupError)      unknown candidate id
    ├── ConflictError (RuntimeError)     the command is not allowed now
    │   ├── IllegalCommandError          the machine's table refuses the move
    │   ├── ConcurrencyError             another writer appended first
    │   └── DuplicateEventError          same event_id, different content
    ├── IntegrityError                   the log or a checkpoint is corrupt (no builtin)
    │   └── CorruptionError              replay met something the table forbids
    │       └── IllegalTransition        a recorded move the table forbids (lifecycle_fsm.state)
    ├── StoreError (OSError)             the database failed (locked, not a ledger)
    │   └── LedgerClosedError            a Ledger used after `close()`
    └── WaitTimeout (TimeoutError)       `Ledger.wait_for` gave up (re-exported by lifecycle_fsm.feed)

The store translates `sqlite3` errors into these at its boundary (`raise … from e`);
nothing from `sqlite3`, `sqlite_utils` or `transitions` crosses the public API.
"""

from __future__ import annotations

from lifecycle_fsm.store.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    InputError,
    IntegrityError,
    LifecycleError,
    NotFoundError,
    StoreError,
)

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


class ArtifactError(InputError):
    """An artifact cannot be hashed: missing, outside the root, a link loop, changing."""


class ArtifactUnreadable(ArtifactError):
    """An artifact could not be read for a reason of the environment (permission denied, an I/O
    error, its root absent as an unmounted volume's is): a check that meets it is inconclusive."""


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
    """`wait_for` gave up: the candidate did not reach any of the states in time.

    Defined here rather than in `feed.py` (which re-exports it) so that the CLI's exit-code
    table does not import the feed, and with it the Ledger's modules, on every start.
    """

    def __init__(self, message: str, *, candidate_id: str, states: tuple[str, ...], last_state: str | None) -> None:
        super().__init__(message)
        self.candidate_id = candidate_id
        self.states = states
        self.last_state = last_state
