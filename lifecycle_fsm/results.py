"""What commands return: a candidate that is never None (`ledger.check(cid).state` needs no assert), a
typed plan, settings. A retried command (`duplicate`) returns the events its first call appended and
the candidate as that call left it."""

from __future__ import annotations

from typing import TypeAlias

import attrs

from lifecycle_fsm.machine import State
from lifecycle_fsm.rules import RecoveryPlan
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.store.records import StoredEvent

__all__ = ["CandidateResult", "CommandResult", "RecoveryResult", "SettingsResult"]


@attrs.frozen(kw_only=True)
class CandidateResult:
    """A candidate command's outcome: the candidate as this command left it (for a retry, as the first call did)."""

    candidate: CandidateState
    events: tuple[StoredEvent, ...] = ()
    duplicate: bool = False

    @property
    def state(self) -> State:
        return self.candidate.state

    @property
    def candidate_id(self) -> str:
        return self.candidate.candidate_id

    @property
    def appended(self) -> bool:
        """Whether this call appended events (False for a no-op or a retried `event_id`)."""
        return bool(self.events) and not self.duplicate

    @property
    def inconclusive(self) -> bool:
        """Whether a check or hand-off could not read an artifact (the environment's fault): nothing decided."""
        return any(e.type == "InconclusiveCheckRecorded" for e in self.events)


@attrs.frozen(kw_only=True)
class RecoveryResult(CandidateResult):
    """`fail_stage`'s outcome: the candidate (recovering, or reject when blocked) and the plan."""

    plan: RecoveryPlan


@attrs.frozen(kw_only=True)
class SettingsResult:
    """A settings command's outcome; `invalidated` names the candidates it sent back to `received`."""

    settings: LedgerSettings
    events: tuple[StoredEvent, ...] = ()
    duplicate: bool = False
    invalidated: tuple[str, ...] = ()

    @property
    def appended(self) -> bool:
        """Whether this call appended events (False for a no-op or a retried `event_id`)."""
        return bool(self.events) and not self.duplicate


# Any command's outcome (what the CLI renders).
CommandResult: TypeAlias = CandidateResult | SettingsResult
