"""The one path every command takes from folded state to appended events.

0. A caller's key ending in `/<digits>` is refused (`limits.check_event_id`): a
   command's further events are keyed `KEY/1`, `KEY/2`, ….
1. A retried command (its `event_id` already stored, same stream, type and inputs)
   returns what it did the first time and appends nothing: the events keyed KEY,
   KEY/1, … that command appended in its own transaction, never another's.
2. Fold the streams the command depends on: its own (from the log, never from a
   checkpoint copy) and, when its decision reads them, the ledger's settings. A
   stream this Ledger last read or wrote is taken from the reader's cache without
   reading (a new candidate's stream too: it is assumed absent).
3. Refuse a move the machine's table forbids, before any work; then decide (the
   caller's function: gather evidence, e.g. hash artifacts, then a pure decision).
4. In one write transaction: assert the version of every stream it read, append its
   events, fan out evidence invalidations to the decided candidates.
5. Fold the appended events into the cached state and return (no read).
If another writer appended to a stream it read between 2 and 4, the store raises
`ConcurrencyError` and the command goes back to 2 (re-folds and re-decides), with
jittered backoff, until its deadline; only then does the error reach the caller.
A decision from the cache alone that the append refuses, or that appends nothing
(a refusal, a no-op), is not trusted: it is re-decided at once from a fresh read,
deadline or not (the cache was stale; no race was lost yet).
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import attrs
import orjson

from lifecycle_fsm.decisions import Decision, Invalidation
from lifecycle_fsm.errors import ConcurrencyError, DuplicateEventError, IllegalCommandError, InputError, LifecycleError
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    CandidateEvent,
    CandidateReceived,
    CandidateRegistered,
    Event,
    EvidenceInvalidated,
    LedgerInitialized,
    candidate_id_of,
)
from lifecycle_fsm.limits import check_event_id
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.machine import COMMAND_TRIGGERS, State, allowed_commands, command_allowed, next_state, sources_of
from lifecycle_fsm.retry import DEFAULT_RETRY, RetryPolicy
from lifecycle_fsm.state import CandidateState, LedgerSettings, apply_candidate, apply_settings
from lifecycle_fsm.store.base import StoreTransaction
from lifecycle_fsm.store.records import NewEvent, StoredEvent
from lifecycle_fsm.streams import StreamReader

__all__ = ["CommandPath", "Decide", "Outcome"]

log = get_logger(__name__)

JSON = dict[str, Any]
Decide = Callable[[CandidateState | None, LedgerSettings], Decision]
# The states an evidence invalidation reaches, read from the machine's table.
INVALIDATED_STATES = sources_of("invalidate_evidence")


@attrs.frozen
class Outcome:
    """What a command did: the events it appended (none for a no-op) and where it left things."""

    events: tuple[StoredEvent, ...]
    candidate: CandidateState | None = None
    settings: LedgerSettings | None = None
    invalidated: tuple[str, ...] = ()
    duplicate: bool = False

    @property
    def state(self) -> State | None:
        return None if self.candidate is None else self.candidate.state


# (state, command) -> whether the machine's table allows it: the table never changes, and
# asking transitions costs a few microseconds on every command.
_ALLOWED: dict[tuple[str, str], bool] = {}


def require_command(current: CandidateState, command: str) -> None:
    """Refuse a command the machine's table does not allow (checked before any work)."""
    key = (current.state, command)
    ok = _ALLOWED.get(key)
    if ok is None:
        ok = _ALLOWED[key] = command_allowed(current.state, COMMAND_TRIGGERS[command])
    if not ok:
        allowed = allowed_commands(current.state)
        raise IllegalCommandError(
            f"candidate {current.candidate_id!r} is in state {current.state}: `{command}` is not allowed there "
            f"(allowed: {', '.join(allowed) or 'nothing, reject is terminal'})",
            state=current.state,
            trigger="|".join(sorted(COMMAND_TRIGGERS[command])),
        )


def state_after(current: CandidateState | None, events: Sequence[CandidateEvent], payloads: Sequence[JSON]) -> str:
    """The state the candidate will be in after `events` (the index label written with them).

    `payloads` are the events' own (`to_payload`, built once for the append): a trigger may read them.
    """
    state: str | None = None if current is None else current.state
    for event, payload in zip(events, payloads, strict=True):
        trigger = type(event).trigger_for(payload)
        following = next_state(state, trigger)
        if following is None:  # a decision produced a move the table forbids: a bug, refuse it
            raise IllegalCommandError(
                f"internal: {event.TYPE} is not allowed after state {state}", state=state, trigger=trigger
            )
        state = following
    assert state is not None
    return state


class CommandPath:
    """Runs commands for one Ledger (see the module docstring for the five steps)."""

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

    def run(
        self,
        stream_id: str,
        decide: Decide,
        *,
        command: str,
        event_id: str | None,
        reads_settings: bool = True,
        inputs: Mapping[str, Any] | None = None,
        first_type: str,
        then_types: Sequence[str] = (),
    ) -> Outcome:
        """Run one command on `stream_id` (a candidate's stream or the ledger's own).

        `first_type`, `then_types`: the types of the events a candidate command appends, in
        order (what a retry's stored events must be); a settings command appends one event
        and its fan-out.
        """
        try:
            check_event_id(event_id)  # before anything is appended: KEY/<n> ids are the commands' own
        except InputError:
            # A key an older release stored (it did not refuse them) is still retried as before;
            # only a new one is refused. (`check_event_id` passes None.)
            if event_id is None or not event_id or self.store.event_by_id(event_id) is None:
                raise
        replayed = self._replayed(event_id, stream_id, first_type, inputs or {}, then_types)
        if replayed is not None:
            return replayed
        on_ledger = stream_id == LEDGER_STREAM
        candidate_id = candidate_id_of(stream_id)
        needs_settings = reads_settings or on_ledger
        give_up = time.monotonic() + self.retry.deadline
        attempt = 0
        from_cache = True  # the first attempt decides from cached folds where the reader has them
        while True:
            current, settings, unread = self._fold(stream_id, command, needs_settings, from_cache=from_cache)
            from_cache = False  # any later attempt reads first
            try:
                if current is not None and command not in ("receive", "register"):
                    require_command(current, command)
                decision = decide(current, settings)
            except LifecycleError as e:
                if unread:  # refused on what may be stale: refuse only what the log says now
                    log.info("command_reread", stream_id=stream_id, command=command, event_id=event_id,
                             reason=type(e).__name__)  # fmt: skip
                    continue
                raise
            if not decision.events:
                if unread:  # nothing to append would confirm the cached versions: read them
                    log.info("command_reread", stream_id=stream_id, command=command, event_id=event_id, reason="noop")
                    continue
                raced = None if event_id is None else self._replayed(event_id, stream_id, first_type, inputs or {},
                                                                         then_types)  # fmt: skip
                if raced is not None:
                    return raced  # nothing left to do because the same keyed command just did it
                return Outcome((), candidate=current, settings=settings if on_ledger else None)
            try:
                outcome = self._append(stream_id, current, settings, decision, event_id, reads_settings)
            except DuplicateEventError as e:
                return self._raced(e, event_id, stream_id, first_type, inputs or {}, then_types)
            except ConcurrencyError as e:
                attempt += 1
                if not unread and time.monotonic() >= give_up:
                    raise
                log.info("command_retried", stream_id=stream_id, candidate_id=candidate_id, command=command,
                         event_id=event_id, attempt=attempt, conflict_stream=e.stream_id, cached=unread,
                         version=None if current is None else current.version)  # fmt: skip
                if not unread:  # a stale cache is re-read at once; a race lost on fresh reads backs off
                    time.sleep(self.retry.delay(attempt))
                continue
            if outcome.duplicate and event_id is not None:
                # The same keyed command committed while this one ran: answer what it did, all of it
                # (a settings command's fan-out lives on other streams than the batch the store matched).
                return self._replayed(event_id, stream_id, first_type, inputs or {}, then_types) or outcome
            return outcome

    def _raced(
        self,
        error: DuplicateEventError,
        event_id: str | None,
        stream_id: str,
        first_type: str,
        inputs: Mapping[str, Any],
        then_types: Sequence[str],
    ) -> Outcome:
        """An append refused because an id it would store is taken: the same command keyed the same
        way committed meanwhile (a retry racing the first call: answer as a retry), or the key is
        used by another command (`_replayed` says so), or one of its `KEY/<n>` ids is."""
        if event_id is None:
            raise error
        if error.event_id == event_id:
            raced = self._replayed(event_id, stream_id, first_type, inputs, then_types)
            if raced is None:
                raise error
            return raced
        # Only a key stored before keys ending in /<number> were refused can hold KEY/<n>.
        raise DuplicateEventError(
            f"event id {event_id!r} cannot key this command: {error.event_id!r}, the id of one of its further "
            f"events, is already used at seq {error.seq} by another command (a key ending in '/<number>', "
            "stored before such keys were refused); give this command another key",
            event_id=error.event_id,
            seq=error.seq,
        ) from error

    def _fold(
        self, stream_id: str, command: str, needs_settings: bool, *, from_cache: bool
    ) -> tuple[CandidateState | None, LedgerSettings, bool]:
        """The states the decision reads, and whether any was taken from the cache without reading."""
        unread = False
        current = None
        candidate_id = candidate_id_of(stream_id)
        if candidate_id is not None:
            current = self.reader.cached(stream_id) if from_cache else None
            if from_cache and (current is not None or command in ("receive", "register")):
                unread = True  # an uncached stream on receive: assumed new, its append asserts version 0
            elif command in ("receive", "register"):  # a new stream, a retry or a revision: the decision tells
                current = self.reader.candidate(stream_id)
            else:
                current = self.reader.existing(candidate_id)
        settings = LedgerSettings()
        if needs_settings:
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
            if event_id is None or (stream_id == LEDGER_STREAM and _is_default_init(event, events)):
                eid = self.new_id()  # the implied defaults of an uninitialised ledger are not the command's
            else:
                eid = event_id if keyed == 0 else f"{event_id}/{keyed}"
                keyed += 1
            out.append(NewEvent(stream_id, event.TYPE, event.SCHEMA_VERSION, event.to_payload(), eid,
                                self.clock(), self.actor))  # fmt: skip
        return out

    def _append(
        self,
        stream_id: str,
        current: CandidateState | None,
        settings: LedgerSettings,
        decision: Decision,
        event_id: str | None,
        reads_settings: bool,
    ) -> Outcome:
        new = self._new_events(stream_id, decision.events, event_id)
        if stream_id == LEDGER_STREAM:
            with self.store.transaction() as tx:
                appended = tx.append(LEDGER_STREAM, settings.version, new, fresh_ids=event_id is None)
                if appended.duplicate:  # the same keyed command landed meanwhile: its fan-out too
                    return Outcome(appended.events, settings=self.reader.settings(), duplicate=True)
                stored = list(appended.events)
                keyed = sum(1 for n in new if n.event_id == event_id or n.event_id.startswith(f"{event_id}/"))
                fanned = self._fan_out(tx, decision.invalidation, event_id, keyed) if decision.invalidation else []
            final_settings = settings
            for e, n in zip(stored, new, strict=True):
                final_settings = apply_settings(final_settings, e.type, n.payload, e.seq)
            self.reader.remember(final_settings)
            for _, _, invalidated in fanned:  # committed: the next command on it need not read it
                self.reader.remember(invalidated)
            all_events = [*stored, *(ev for _, evs, _ in fanned for ev in evs)]
            _log_appended(all_events, None)
            return Outcome(tuple(all_events), settings=final_settings,
                                 invalidated=tuple(cid for cid, _, _ in fanned))  # fmt: skip
        events = decision.events
        assert all(isinstance(e, CandidateEvent) for e in events)
        label = state_after(current, events, [n.payload for n in new])  # type: ignore[arg-type]
        expected, category = 0 if current is None else current.version, _category(current, events)
        # One append is the whole transaction: a store may do it in one round trip (PostgreSQL),
        # the ledger stream's version asserted in the same statement when the decision read it.
        expect = ((LEDGER_STREAM, settings.version),) if reads_settings else ()
        result = self.store.append(stream_id, expected, new, status=label, category=category,
                                   fresh_ids=event_id is None, expect=expect)  # fmt: skip
        if result.duplicate:
            final = self.reader.candidate(stream_id)
        else:
            final = current
            for e, n in zip(result.events, new, strict=True):
                final = apply_candidate(final, e.type, n.payload, seq=e.seq, stream_id=stream_id, version=e.version)
            assert final is not None
            self.reader.remember(final)
        _log_appended(result.events, final)
        return Outcome(result.events, candidate=final, settings=settings if reads_settings else None,
                             duplicate=result.duplicate)  # fmt: skip

    def _fan_out(
        self, tx: StoreTransaction, invalidation: Invalidation, event_id: str | None, keyed: int
    ) -> list[tuple[str, tuple[StoredEvent, ...], CandidateState]]:
        """One EvidenceInvalidated per decided candidate, inside the setting's transaction.

        Each with the candidate's state after it (for the reader's cache, once committed).

        With a key, they continue the command's numbering (`event_id/N`), so a retry
        finds and returns them too.

        The stream index lists the candidates; whether each is decided (and of which
        kind) comes from its fold of the log, never from the index's `status`: an index
        row edited by hand must not let a decided candidate keep stale evidence (the
        reader's cache keeps this cheap for a long-lived process).
        """
        done: list[tuple[str, tuple[StoredEvent, ...], CandidateState]] = []
        for head in tx.streams():
            candidate_id = candidate_id_of(head.stream_id)
            if candidate_id is None:
                continue
            current = self.reader.candidate(head.stream_id, source=tx, evict=False)
            if current is None or current.state not in INVALIDATED_STATES:
                continue
            if invalidation.kinds is not None and current.kind not in invalidation.kinds:
                continue
            new = self._new_events(head.stream_id, [invalidation.event], None)
            if event_id is not None:
                new = [new[0].replace(event_id=f"{event_id}/{keyed + len(done)}")]
            stored = tx.append(head.stream_id, current.version, new, status="received").events
            after = apply_candidate(current, stored[0].type, new[0].payload, seq=stored[0].seq,
                                    stream_id=head.stream_id, version=stored[0].version)  # fmt: skip
            done.append((candidate_id, stored, after))
        return done

    def _replayed(
        self,
        event_id: str | None,
        stream_id: str,
        type_name: str,
        inputs: Mapping[str, Any],
        then_types: Sequence[str] = (),
    ) -> Outcome | None:
        """A retried command (same event_id, same inputs) returns what it did the first time.

        The same id for another stream, event type or inputs is `DuplicateEventError`.
        """
        if event_id is None:
            return None
        first = self.store.event_by_id(event_id)
        if first is None:
            return None
        payload = orjson.loads(first.payload)
        same_inputs = all(payload.get(key) == value for key, value in inputs.items())
        if first.stream_id != stream_id or first.type != type_name or not same_inputs:
            raise DuplicateEventError(
                f"event id {event_id!r} is already used at seq {first.seq} by {first.type} on {first.stream_id}",
                event_id=event_id,
                seq=first.seq,
            )
        events = self._command_events(event_id, first, then_types)
        if stream_id == LEDGER_STREAM:
            invalidated = tuple(cid for e in events if (cid := candidate_id_of(e.stream_id)) is not None)
            return Outcome(tuple(events), settings=self.reader.settings(), invalidated=invalidated, duplicate=True)
        return Outcome(tuple(events), candidate=self.reader.candidate(stream_id), duplicate=True)

    def retried_unread(self, event_id: str | None, type_name: str, match: Mapping[str, Any]) -> Outcome | None:
        """A keyed command whose input file is gone (a manifest removed once it was received): the
        stored command of that key when it is of this type and its event's `match` fields agree,
        else None (the caller reports the missing file). The answer a supervisor that lost the
        reply needs, without the bytes it can no longer compare."""
        if event_id is None:
            return None
        first = self.store.event_by_id(event_id)
        if first is None or first.type != type_name:
            return None
        payload = orjson.loads(first.payload)
        if any(payload.get(key) != value for key, value in match.items()):
            return None
        return self._replayed(event_id, first.stream_id, type_name, match)

    def _command_events(self, event_id: str, first: StoredEvent, then_types: Sequence[str]) -> list[StoredEvent]:
        """`first` and the events keyed `event_id/1`, `event_id/2`, … that its command appended with it.

        A command appends all its events in one transaction, so its n-th further event is at
        seq `first.seq + n`; and it is the kind that command appends there: a candidate
        command's next event on its own stream (`then_types`, at the next version), a settings
        command's fan-out (an `EvidenceInvalidated` on a candidate's stream). Anything else
        under such an id (a key ending in /<number> stored by an older release) is another
        command's event and ends the list: it is never reported as this command's.
        """
        events = [first]
        on_ledger = first.stream_id == LEDGER_STREAM
        while on_ledger or len(events) <= len(then_types):
            n = len(events)
            nxt = self.store.event_by_id(f"{event_id}/{n}")
            if nxt is None or nxt.seq != first.seq + n:
                break
            if on_ledger:
                own = nxt.type == EvidenceInvalidated.TYPE and candidate_id_of(nxt.stream_id) is not None
            else:
                own = (nxt.stream_id, nxt.version, nxt.type) == (first.stream_id, first.version + n, then_types[n - 1])
            if not own:
                break
            events.append(nxt)
        return events


def new_event_id() -> str:
    """A random event id: `uuid.uuid4().hex` (version 4, RFC 4122 variant), without building a UUID object
    (the two fields set on the bytes: a third less than through an int)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # variant 10xx
    return raw.hex()


def _is_default_init(event: Event, events: Sequence[Event]) -> bool:
    return isinstance(event, LedgerInitialized) and len(events) > 1


def _category(current: CandidateState | None, events: Sequence[Event]) -> str | None:
    """The candidate's kind, the index's category (what a window change filters on)."""
    kind = None if current is None else current.kind
    for event in events:
        if isinstance(event, CandidateReceived):
            kind = event.candidate.get("candidate_kind")
        elif isinstance(event, CandidateRegistered):
            kind = event.kind
    return kind if isinstance(kind, str) else None


def _recovery_action(event: StoredEvent) -> str | None:
    """The plan's action, on the log lines of a RecoveryPlanned event (parsed only for those)."""
    if event.type != "RecoveryPlanned":
        return None
    action = orjson.loads(event.payload).get("action")
    return action if isinstance(action, str) else None


def _log_appended(events: Sequence[StoredEvent], candidate: CandidateState | None) -> None:
    """One line per event and one per decision, each with candidate id, stream version, event id and plan action.

    Nothing is built when INFO goes nowhere (an embedder that set no logging up).
    """
    if not log.enabled():
        return
    action = None
    for e in events:
        action = _recovery_action(e) or action
        log.info("event_appended", seq=e.seq, stream_id=e.stream_id, candidate_id=candidate_id_of(e.stream_id),
                 type=e.type, actor=e.actor, event_id=e.event_id, version=e.version,
                 **({"action": action} if e.type == "RecoveryPlanned" else {}))  # fmt: skip
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
