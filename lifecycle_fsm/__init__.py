"""lifecycle-fsm: an event-sourced ledger deciding whether a post-training candidate
may go to independent evaluation, and recovering failed stages from trusted state.

The embedding API is `Ledger` (commands in, events out); the rules are pure
functions in `lifecycle_fsm.rules`; whole-ledger replay lives in the `replay` package.

The public names are loaded on first use (PEP 562 `__getattr__`): `import lifecycle_fsm`
alone costs next to nothing, so the CLI and embedders pay only for the modules they use.
"""

from __future__ import annotations

import sys
import typing

if typing.TYPE_CHECKING:  # what type checkers and IDEs see; at run time `__getattr__` below loads these
    from lifecycle_fsm.artifacts import hash_directory
    from lifecycle_fsm.errors import (
        ArtifactError,
        ConcurrencyError,
        ConflictError,
        CorruptionError,
        DuplicateEventError,
        IllegalCommandError,
        InputError,
        IntegrityError,
        LedgerClosedError,
        LifecycleError,
        NotFoundError,
        StoreError,
        WaitTimeout,
    )
    from lifecycle_fsm.feed import FeedEvent
    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.machine import State
    from lifecycle_fsm.recovery import RecoveryAction, RecoveryPlan
    from lifecycle_fsm.results import CandidateResult, CommandResult, RecoveryResult, SettingsResult
    from lifecycle_fsm.retry import RetryPolicy
    from lifecycle_fsm.rules import check_candidate_freshness, choose_recovery_action, decide_lifecycle_handoff
    from lifecycle_fsm.state import CandidateState, LedgerSettings, apply

# public name -> the submodule that defines it (keep in step with the TYPE_CHECKING block)
_WHERE = {
    "hash_directory": "artifacts",
    **dict.fromkeys(
        (
            "ArtifactError",
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
            "StoreError",
            "WaitTimeout",
        ),
        "errors",
    ),
    "FeedEvent": "feed",
    "Ledger": "ledger",
    "State": "machine",
    "RecoveryAction": "recovery",
    "RecoveryPlan": "recovery",
    "CandidateResult": "results",
    "CommandResult": "results",
    "RecoveryResult": "results",
    "SettingsResult": "results",
    "RetryPolicy": "retry",
    "check_candidate_freshness": "rules",
    "choose_recovery_action": "rules",
    "decide_lifecycle_handoff": "rules",
    "CandidateState": "state",
    "LedgerSettings": "state",
    "apply": "state",
}

__all__ = [
    "ArtifactError",
    "CandidateResult",
    "CandidateState",
    "CommandResult",
    "ConcurrencyError",
    "ConflictError",
    "CorruptionError",
    "DuplicateEventError",
    "FeedEvent",
    "IllegalCommandError",
    "InputError",
    "IntegrityError",
    "Ledger",
    "LedgerClosedError",
    "LedgerSettings",
    "LifecycleError",
    "NotFoundError",
    "RecoveryAction",
    "RecoveryPlan",
    "RecoveryResult",
    "RetryPolicy",
    "SettingsResult",
    "State",
    "StoreError",
    "WaitTimeout",
    "apply",
    "check_candidate_freshness",
    "choose_recovery_action",
    "decide_lifecycle_handoff",
    "hash_directory",
]


def __getattr__(name: str) -> typing.Any:
    """Load a public name from its submodule on first use, then keep it as a plain attribute."""
    where = _WHERE.get(name)
    if where is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = f"{__name__}.{where}"
    __import__(module)  # the import statement's path (not importlib's), so `-X importtime` sees it
    value = getattr(sys.modules[module], name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))
