"""Refusals before any work: what the machine's table, the kinds and the settings allow.

A refused command appends nothing; these run before a command hashes anything.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from lifecycle_fsm.errors import ConflictError, IllegalCommandError, InputError
from lifecycle_fsm.events import Event
from lifecycle_fsm.machine import COMMAND_BY_TRIGGER, MACHINE, allowed_commands, next_state
from lifecycle_fsm.rules import TRUSTED_STATE_KINDS
from lifecycle_fsm.state import CandidateState, LedgerSettings

__all__ = ["label_after", "require_baseline", "require_kind", "require_move"]

JSON = dict[str, Any]


def label_after(current: CandidateState, events: Sequence[Event], payloads: Sequence[JSON]) -> str:
    """The state the candidate will be in after `events` (the index label written with them)."""
    state: str | None = current.state
    for event, payload in zip(events, payloads, strict=True):
        trigger = type(event).trigger_for(payload)
        state = None if trigger is None else next_state(state, trigger)
        if state is None:  # a decide function produced a move the table forbids: a bug, refuse
            raise IllegalCommandError(
                f"internal: {event.TYPE} is not allowed after state {current.state}", state=current.state,
                trigger=str(trigger),
            )  # fmt: skip
    assert state is not None
    return state


def require_move(current: CandidateState, trigger: str) -> None:
    """Refuse a command the machine's table does not allow (checked before any work)."""
    if not MACHINE.get_transitions(trigger, source=current.state):
        allowed = allowed_commands(current.state)
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is in state {current.state}: "
            f"`{COMMAND_BY_TRIGGER[trigger]}` is not allowed there "
            f"(allowed: {', '.join(allowed) or 'nothing, reject is terminal'})",
            state=current.state,
            trigger=trigger,
        )


def require_kind(kind: str) -> None:
    if kind not in TRUSTED_STATE_KINDS:
        raise InputError(f"unknown trusted-state kind {kind!r} (expected one of {', '.join(TRUSTED_STATE_KINDS)})")


def require_baseline(settings: LedgerSettings) -> None:
    if settings.baseline is None:
        raise ConflictError("no active baseline: run `lifecycle baseline activate SFT_MANIFEST` first")
