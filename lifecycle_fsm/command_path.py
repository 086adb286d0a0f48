"""The one path every command takes from folded state to appended events (ARCHITECTURE.md, "The
command path"): answer a retried key, fold what the decision reads (from the reader's cache when
held), refuse a move the table forbids, decide, fire the triggers, append asserting the version of
every stream read, fold what was appended. A lost race re-decides with jittered backoff until the
deadline; a decision from the cache that the append refuses, or that appends nothing, is re-decided
at once from a fresh read.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
from transitions import MachineError

from lifecycle_fsm.candidate_events import CandidateEvent
from lifecycle_fsm.decisions import Decision, Invalidation
from lifecycle_fsm.errors import ConcurrencyError, DuplicateEventError, IllegalCommandError, LifecycleError
from lifecycle_fsm.events import LEDGER_STREAM, Event, LedgerInitialized, candidate_id_of
from lifecycle_fsm.limits import check_event_id
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.machine import (
    COMMAND_TRIGGERS,
    INITIAL_TRIGGERS,
    State,
    allowed_commands,
    command_allowed,
    command_name,
    sources_of,
)
from lifecycle_fsm.manifests import check_key, recorded_time
from lifecycle_fsm.results import CandidateResult, CommandResult, SettingsResult, replayed, stored_field
from lifecycle_fsm.retry import DEFAULT_RETRY, RetryPolicy
from lifecycle_fsm.state import CandidateState, LedgerSettings, LedgerState, fold, stream_start
from lifecycle_fsm.store.base import StoreTransaction
from lifecycle_fsm.store.records import NewEvent, Row, StoredEvent
from lifecycle_fsm.streams import StreamReader

log = get_logger(__name__)

Decide = Callable[[CandidateState | None, LedgerSettings], Decision]
# The states an evidence invalidation reaches, read from the machine's table.
INVALIDATED_STATES = sources_of("invalidate_evidence")
_Fanned = list[tuple[str, tuple[StoredEvent, ...], CandidateState]]


def new_event_id() -> str:
    """A random event id (a command without an idempotency key, a seal)."""
    return uuid.uuid4().hex


def require_command(current: CandidateState, command: str) -> None:
    """Refuse a command the machine's table does not allow (checked before any work)."""
    if not command_allowed(current.state, COMMAND_TRIGGERS[command]):
        allowed = allowed_commands(current.state)
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is in state {current.state}: `{command_name(command)}` is not "
            f"allowed there (allowed: {', '.join(allowed) or 'nothing, reject is terminal'})",
            state=current.state,
            trigger="|".join(sorted(COMMAND_TRIGGERS[command])),
        )


@attrs.frozen
class Command:
    """What `CommandPath.run` is asked to do (see `Ledger` for each command's values)."""

    stream_id: str
    decide: Decide
    command: str
    event_id: str | None
    first_type: str
    then_types: Sequence[str] = ()
    inputs: Mapping[str, Any] = attrs.Factory(dict)
    reads_settings: bool = True


class _Reread(Exception):
    """A decision taken from the cache must be taken again from a fresh read."""


class CommandPath:
    """Runs commands for one Ledger (see the module docstring)."""

    def __init__(
        self,
        reader: StreamReader,
        *,
        actor: str,
        clock: Callable[[], str],
        retry: RetryPolicy = DEFAULT_RETRY,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.new_id = new_id or new_event_id  # the simulator passes a counter: one seed, one head
        self.reader = reader
        self.store = reader.store
        self.actor = actor
        self.clock = clock
        self.retry = retry

    def run(self, cmd: Command) -> CommandResult:
        """Run one command on its stream (a candidate's or the ledger's own)."""
        check_key(cmd.event_id)
        check_event_id(cmd.event_id)  # KEY/<n> ids are the commands' own further events
        replayed = self._replayed(cmd)
        if replayed is not None:
            return replayed
        give_up = time.monotonic() + self.retry.deadline
        attempt = 0
        from_cache = True  # the first attempt decides from cached folds where the reader has them
        while True:
            current, settings, unread = self._fold(cmd, from_cache=from_cache)
            from_cache = False
            try:
                return self._attempt(cmd, current, settings, unread)
            except _Reread:
                continue
            except ConcurrencyError as e:
                attempt += 1
                if not unread and time.monotonic() >= give_up:
                    raise
                log.info(
                    "command_retried",
                    stream_id=cmd.stream_id,
                    command=cmd.command,
                    event_id=cmd.event_id,
                    attempt=attempt,
                    conflict_stream=e.stream_id,
                    cached=unread,
                )
                if not unread:  # a stale cache is re-read at once; a race lost on fresh reads backs off
                    time.sleep(self.retry.delay(attempt))

    def _attempt(
        self, cmd: Command, current: CandidateState | None, settings: LedgerSettings, unread: bool
    ) -> CommandResult:
        """Decide and append once; `_Reread` when a decision taken from the cache cannot be trusted."""
        try:
            if current is not None and cmd.command not in INITIAL_TRIGGERS:  # those may start a stream
                require_command(current, cmd.command)
            decision = cmd.decide(current, settings)
        except LifecycleError as e:
            if unread:  # refused on what may be stale: refuse only what the log says now
                log.info("command_reread", stream_id=cmd.stream_id, command=cmd.command, reason=type(e).__name__)
                raise _Reread from e
            raise
        on_ledger = cmd.stream_id == LEDGER_STREAM
        if not decision.events:
            if unread:  # nothing to append would confirm the cached versions: read them
                log.info("command_reread", stream_id=cmd.stream_id, command=cmd.command, reason="noop")
                raise _Reread
            # Nothing left to do, perhaps because the same keyed command just did it.
            raced = self._replayed(cmd)
            if raced is not None:
                return raced
            if on_ledger:
                return SettingsResult(settings=settings)
            assert current is not None  # a command that may start a stream always appends to a new one
            return CandidateResult(candidate=current)
        result: CommandResult
        try:
            if on_ledger:
                result = self._append_settings(settings, decision, cmd.event_id)
            else:
                result = self._append_candidate(cmd, current, settings, decision)
        except DuplicateEventError as e:
            # The key was taken meanwhile: by this same command (answer as a retry), or by another (the error says).
            answer = self._replayed(cmd) if e.event_id == cmd.event_id else None
            if answer is None:
                raise
            return answer
        if result.duplicate and cmd.event_id is not None:
            # The same keyed command committed while this one ran: answer what it did, all of it.
            return self._replayed(cmd) or result
        return result

    def _replayed(self, cmd: Command) -> CommandResult | None:
        return replayed(self, cmd.event_id, cmd.stream_id, cmd.first_type, cmd.inputs, cmd.then_types)

    def _fold(self, cmd: Command, *, from_cache: bool) -> tuple[CandidateState | None, LedgerSettings, bool]:
        """The states the decision reads, and whether any was taken from the cache without reading."""
        unread = False
        current = None
        candidate_id = candidate_id_of(cmd.stream_id)
        starting = cmd.command in INITIAL_TRIGGERS  # folds what exists and lets the decision tell
        if candidate_id is not None:
            current = self.reader.cached(cmd.stream_id) if from_cache else None
            if from_cache and (current is not None or starting):
                unread = True  # an uncached stream that may start here: assumed new, its append asserts version 0
            elif starting:  # a new stream, a retry or a revision: the decision tells
                current = self.reader.candidate(cmd.stream_id)
            else:
                current = self.reader.existing(candidate_id)
        settings = LedgerSettings()
        if cmd.reads_settings or cmd.stream_id == LEDGER_STREAM:
            cached = self.reader.cached_settings() if from_cache else None
            if cached is not None:
                settings, unread = cached, True
            else:
                settings = self.reader.settings()
        return current, settings, unread

    def _new_events(self, stream_id: str, events: Sequence[Event], event_id: str | None) -> list[NewEvent]:
        """Events with their ids: `event_id`, `event_id/1`, … or fresh random ones."""
        out = []
        keyed = 0
        for event in events:
            # The implied defaults of an uninitialised ledger are not the command's: never keyed.
            implied = isinstance(event, LedgerInitialized) and len(events) > 1
            if event_id is None or (stream_id == LEDGER_STREAM and implied):
                eid = self.new_id()
            else:
                eid = event_id if keyed == 0 else f"{event_id}/{keyed}"
                keyed += 1
            at = recorded_time(self.clock())
            out.append(NewEvent(stream_id, event.TYPE, event.SCHEMA_VERSION, event.to_payload(), eid, at, self.actor))
        return out

    def _append_settings(self, settings: LedgerSettings, decision: Decision, event_id: str | None) -> SettingsResult:
        new = self._new_events(LEDGER_STREAM, decision.events, event_id)
        with self.store.transaction() as tx:
            appended = tx.append(LEDGER_STREAM, settings.version, new, fresh_ids=event_id is None)
            if appended.duplicate:  # the same keyed command landed meanwhile: its fan-out too
                return SettingsResult(settings=self.reader.settings(), events=appended.events, duplicate=True)
            keyed = sum(1 for n in new if n.event_id == event_id or n.event_id.startswith(f"{event_id}/"))
            fanned = self._fan_out(tx, decision.invalidation, event_id, keyed) if decision.invalidation else []
        final = fold(_appended_rows(appended.events), LedgerState(settings, {}, settings.last_seq)).settings
        self.reader.remember(final)
        for _, _, invalidated in fanned:  # committed: the next command on it need not read it
            self.reader.remember(invalidated)
        events = (*appended.events, *(e for _, stored, _ in fanned for e in stored))
        _log_appended(events, None)
        return SettingsResult(settings=final, events=events, invalidated=tuple(cid for cid, _, _ in fanned))

    def _append_candidate(
        self, cmd: Command, current: CandidateState | None, settings: LedgerSettings, decision: Decision
    ) -> CandidateResult:
        events = decision.events
        assert all(isinstance(e, CandidateEvent) for e in events)
        new = self._new_events(cmd.stream_id, events, cmd.event_id)
        landed = self._fire(current, events, [n.payload for n in new])  # type: ignore[arg-type]
        # One append is the whole transaction: a store may do it in one round trip (PostgreSQL),
        # the ledger stream's version asserted in the same statement when the decision read it.
        result = self.store.append(
            cmd.stream_id,
            0 if current is None else current.version,
            new,
            fresh_ids=cmd.event_id is None,
            expect=((LEDGER_STREAM, settings.version),) if cmd.reads_settings else (),
        )
        if result.duplicate:
            final = self.reader.candidate(cmd.stream_id)
        else:
            final = fold(_appended_rows(result.events), stream_start(current)).candidates[_candidate_id(cmd.stream_id)]
            if final.state != landed:
                raise AssertionError(f"the fold says {final.state}, the machine {landed}")
            self.reader.remember(final)
        _log_appended(result.events, final)
        assert final is not None
        return CandidateResult(candidate=final, events=result.events, duplicate=result.duplicate)

    def _fire(
        self, current: CandidateState | None, events: Sequence[CandidateEvent], payloads: Sequence[Mapping[str, Any]]
    ) -> str:
        """Fire the events' triggers (from `payloads`, built once for the append) on the candidate's
        `transitions` model: the state they land in."""
        triggers = [type(e).trigger_for(payload) for e, payload in zip(events, payloads, strict=True)]
        if current is None:  # a new stream: its one event starts it in `received`
            if triggers[0] not in INITIAL_TRIGGERS or len(triggers) != 1:
                raise IllegalCommandError(
                    f"internal: {triggers} cannot start a stream", state=None, trigger=triggers[0]
                )
            return State.RECEIVED.value
        model = self.reader.model(current)
        for trigger in triggers:
            try:
                model.fire(trigger)
            except MachineError as e:  # a decision produced a move the table forbids: a bug, refuse it
                raise IllegalCommandError(
                    f"internal: {trigger} is not allowed from state {model.state}", state=model.state, trigger=trigger
                ) from e
        return model.state

    def _fan_out(self, tx: StoreTransaction, invalidation: Invalidation, event_id: str | None, keyed: int) -> _Fanned:
        """One EvidenceInvalidated per decided candidate, inside the setting's transaction, keyed on from
        the command's numbering (`event_id/N`). Whether a candidate is decided comes from its fold of the
        log, never from the index's label (a row edited by hand must not let it keep stale evidence)."""
        done: _Fanned = []
        for head in tx.streams():
            candidate_id = candidate_id_of(head.stream_id)
            if candidate_id is None:
                continue
            current = self.reader.candidate(head.stream_id, source=tx, evict=False)
            if current is None or current.state not in INVALIDATED_STATES:
                continue
            if invalidation.kinds is not None and current.kind not in invalidation.kinds:
                continue
            key = None if event_id is None else f"{event_id}/{keyed + len(done)}"
            new = self._new_events(head.stream_id, [invalidation.event], key)
            stored = tx.append(head.stream_id, current.version, new).events
            after = fold(_appended_rows(stored), stream_start(current)).candidates[candidate_id]
            done.append((candidate_id, stored, after))
        return done


def _candidate_id(stream_id: str) -> str:
    candidate_id = candidate_id_of(stream_id)
    assert candidate_id is not None
    return candidate_id


def _appended_rows(events: Sequence[StoredEvent]) -> list[Row]:
    """What an append just stored, as fold rows. Their hashes were computed (or re-checked) in this
    process, so unlike rows read back they are not checked again."""
    return [(e.seq, e.stream_id, e.version, e.type, e.schema_version, e.payload) for e in events]


def _log_appended(events: Sequence[StoredEvent], candidate: CandidateState | None) -> None:
    """One line per event and one per decision (candidate id, stream version, event id, plan action)."""
    if not log.enabled("info"):
        return
    action = None
    for e in events:
        if e.type == "RecoveryPlanned":
            action = stored_field(e, "action")
        log.info(
            "event_appended",
            seq=e.seq,
            stream_id=e.stream_id,
            candidate_id=candidate_id_of(e.stream_id),
            type=e.type,
            actor=e.actor,
            event_id=e.event_id,
            version=e.version,
            **({"action": action} if e.type == "RecoveryPlanned" else {}),
        )
    if candidate is not None and events:
        log.info(
            "decision_recorded",
            candidate_id=candidate.candidate_id,
            state=candidate.state,
            version=candidate.version,
            reason_codes=list(candidate.reason_codes),
            seq=events[-1].seq,
            event_id=events[0].event_id,
            **({"action": action} if action is not None else {}),
        )
