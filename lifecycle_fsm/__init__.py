"""lifecycle-fsm: an event-sourced ledger deciding whether a post-training candidate
may go to independent evaluation, and recovering failed stages from trusted state.

The embedding API is `Ledger` (commands in, events out); the rules are pure
functions in `lifecycle_fsm.rules`; whole-ledger replay lives in the `replay` package.
"""

import importlib
import typing

from lifecycle_fsm.errors import (
    ArtifactError,
    ArtifactUnreadable,
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
    ScenarioError,
    StoreError,
    WaitTimeout,
)

if typing.TYPE_CHECKING:
    from lifecycle_fsm.artifacts import hash_directory
    from lifecycle_fsm.feed import FeedEvent
    from lifecycle_fsm.ledger import Ledger
    from lifecycle_fsm.machine import State
    from lifecycle_fsm.results import CandidateResult, CommandResult, RecoveryResult, SettingsResult
    from lifecycle_fsm.retry import RetryPolicy
    from lifecycle_fsm.rules import (
        RecoveryAction,
        RecoveryPlan,
        check_candidate_freshness,
        choose_recovery_action,
        decide_lifecycle_handoff,
    )
    from lifecycle_fsm.state import CandidateState, LedgerSettings, apply

# Importing the package loads only its errors; each other name loads its module on first use, so an
# auditor's script loads no command modules and the `lifecycle` script answers Ctrl-C at once.
_LAZY_MODULES = {
    "artifacts": ("hash_directory",),
    "feed": ("FeedEvent",),
    "ledger": ("Ledger",),
    "machine": ("State",),
    "results": ("CandidateResult", "CommandResult", "RecoveryResult", "SettingsResult"),
    "retry": ("RetryPolicy",),
    "rules": (
        "RecoveryAction",
        "RecoveryPlan",
        "check_candidate_freshness",
        "choose_recovery_action",
        "decide_lifecycle_handoff",
    ),
    "state": ("CandidateState", "LedgerSettings", "apply"),
}
_LAZY = {name: module for module, names in _LAZY_MODULES.items() for name in names}

__all__ = [
    "ArtifactError",
    "ArtifactUnreadable",
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
    "ScenarioError",
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


def __getattr__(name: str) -> object:
    if name not in _LAZY:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{_LAZY[name]}"), name)
    globals()[name] = value
    return value
