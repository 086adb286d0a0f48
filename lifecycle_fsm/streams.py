"""Reading one stream's state: fold its events, or (a query only) start from a checkpoint's copy.

`StreamReader` keeps the folds this process made, topped up from the store on every read. A command
may decide from a cached fold: its append asserts the version of every stream it read, so a stale
entry costs a re-decide, never a wrong append.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Sequence
from typing import Protocol

import orjson
from transitions import Machine

from lifecycle_fsm.errors import InputError, NotFoundError
from lifecycle_fsm.events import LEDGER_STREAM, candidate_id_of, stream_of
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.machine import CandidateModel, new_machine
from lifecycle_fsm.state import EMPTY, CandidateState, LedgerSettings, LedgerState, fold, rows_of, stream_start
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.records import StoredEvent

log = get_logger(__name__)

# How many candidates' folds a `StreamReader` keeps by default (least recently used evicted first).
CACHED_CANDIDATES = 1024


class StreamSource(Protocol):
    """What a fold reads a stream from: the store, or a write transaction."""

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]: ...


def fold_candidate(events: Sequence[StoredEvent], start: CandidateState | None = None) -> CandidateState | None:
    """One candidate from its stream's events (or from `start` plus the events after it)."""
    if not events:
        return start
    folded = fold(rows_of(events), stream_start(start))
    cid = candidate_id_of(events[0].stream_id)
    return None if cid is None else folded.candidates.get(cid)


def fold_settings(events: Sequence[StoredEvent]) -> LedgerSettings:
    """The ledger's settings from its stream's events, from the first."""
    return fold(rows_of(events), EMPTY).settings


def state_from_checkpoint(store: EventStore, stream_id: str) -> CandidateState | None:
    """The stream's state from the latest checkpoint when it can be trusted; None otherwise (said why)."""
    snap = store.latest_stream_snapshot(stream_id)
    if snap is None:
        return None
    from lifecycle_fsm.snapshots import snapshot_problem

    problem = snapshot_problem(store, snap, snap.state, snap.state_sha256)
    reason = None if problem is None else problem.reason
    if problem is None:
        try:
            state = CandidateState.from_dict(orjson.loads(snap.state))
        except (ValueError, KeyError, TypeError) as e:
            reason = f"state cannot be read ({e!r})"
        else:
            if state.version == snap.version:
                return state
            reason = "state version differs from its row"
    log.warning("stream_snapshot_skipped", stream_id=stream_id, checkpoint_id=snap.checkpoint_id, reason=reason)
    return None


def check_cache_size(max_candidates: object) -> int:
    """How many candidates' folds a reader keeps: an int of at least 1, else an InputError."""
    if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
        raise InputError(
            f"the candidate cache's size (cached_candidates) must be an int of at least 1, not {max_candidates!r}"
        )
    return max_candidates


class StreamReader:
    """The folds of the streams this process touched, kept current from the store; at most `max_candidates`
    candidates are held (each also a model of the live machine), the least recently used evicted first."""

    def __init__(self, store: EventStore, *, max_candidates: int = CACHED_CANDIDATES) -> None:
        check_cache_size(max_candidates)
        self.store = store
        self._settings: LedgerSettings | None = None  # as this process last read or wrote them
        self._candidates: OrderedDict[str, CandidateState] = OrderedDict()
        self._models: dict[str, CandidateModel] = {}
        self._machine: Machine | None = None
        self._max_candidates = max_candidates

    @property
    def held(self) -> int:
        """How many candidates' folds are held now."""
        return len(self._candidates)

    def model(self, candidate: CandidateState) -> CandidateModel:
        """The held candidate as a model of this reader's `transitions` machine, in its folded state."""
        if self._machine is None:
            self._machine = new_machine()
        stream_id = stream_of(candidate.candidate_id)
        model = self._models.get(stream_id)
        if model is None:
            model = self._models[stream_id] = CandidateModel()
            self._machine.add_model(model, initial=candidate.state.value)
        elif model.state != candidate.state:
            self._machine.set_state(candidate.state.value, model=model)
        return model

    def _keep(self, stream_id: str, state: CandidateState) -> None:
        """Hold `state` as the most recently used fold, evicting the least recently used past the bound."""
        self._candidates[stream_id] = state
        self._candidates.move_to_end(stream_id)
        if len(self._candidates) > self._max_candidates:
            evicted, _ = self._candidates.popitem(last=False)
            model = self._models.pop(evicted, None)
            if model is not None and self._machine is not None:
                self._machine.remove_model(model)

    def settings(self) -> LedgerSettings:
        """The ledger's settings now: the cached fold plus any events appended since."""
        cached = self._settings or LedgerSettings()
        new = self.store.read_stream(LEDGER_STREAM, after_version=cached.version)
        self._settings = fold(rows_of(new), LedgerState(cached, {}, cached.last_seq)).settings if new else cached
        return self._settings

    def cached_settings(self) -> LedgerSettings | None:
        """The settings as this process last read or wrote them, without reading (None if never)."""
        return self._settings

    def cached(self, stream_id: str) -> CandidateState | None:
        """The candidate as this process last read or wrote it, without reading (None if not held)."""
        return self._candidates.get(stream_id)

    def candidate(
        self, stream_id: str, *, source: StreamSource | None = None, evict: bool = True
    ) -> CandidateState | None:
        """A candidate folded from the log alone (what commands decide from), None if unknown. `source`: an
        open write transaction. `evict=False`: hold it only where that evicts and promotes nothing (a
        settings change's sweep must not push the supervisor's working set out)."""
        cached = self._candidates.get(stream_id)
        reader = self.store if source is None else source
        new = reader.read_stream(stream_id, after_version=0 if cached is None else cached.version)
        state = fold_candidate(new, start=cached)
        if state is None:
            return None
        if evict:
            self._keep(stream_id, state)
        elif cached is not None or len(self._candidates) < self._max_candidates:
            self._candidates[stream_id] = state  # a held one keeps its place in the LRU order
        return state

    def existing(self, candidate_id: str) -> CandidateState:
        """`candidate`, or NotFoundError."""
        state = self.candidate(stream_of(candidate_id))
        if state is None:
            raise NotFoundError(f"unknown candidate: {candidate_id!r}", candidate_id=candidate_id)
        return state

    def query(self, candidate_id: str) -> CandidateState:
        """A candidate for a query: it may start from the latest checkpoint's copy (never cached)."""
        stream_id = stream_of(candidate_id)
        if stream_id not in self._candidates:
            start = state_from_checkpoint(self.store, stream_id)
            if start is not None:
                state = fold_candidate(self.store.read_stream(stream_id, after_version=start.version), start=start)
                assert state is not None
                return state
        return self.existing(candidate_id)

    def remember(self, state: CandidateState | LedgerSettings) -> None:
        """Keep a state a command just folded from what it appended."""
        if isinstance(state, LedgerSettings):
            if self._settings is None or state.version > self._settings.version:
                self._settings = state
        else:
            self._keep(stream_of(state.candidate_id), state)
