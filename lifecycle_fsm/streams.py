"""Reading one stream's state: fold its events, or start from a checkpoint's copy.

The Ledger reads only the streams a command touches. `StreamReader` keeps the folds
this process has made, topped up from the store on every read. A command may decide
from a cached fold without reading (`cached`, `cached_settings`): its append asserts
the version of every stream it decided from, so a stale entry (another process wrote
since) can only cost a re-decide from a fresh read, never a wrong append. Commands
decide only from states folded from the log itself; a query may start from the latest
trusted checkpoint's copy of a long-lived candidate and fold only the events after it.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Sequence
from typing import Any, Protocol, TypeVar

import orjson

from lifecycle_fsm.deferred import field_names
from lifecycle_fsm.errors import InputError, NotFoundError
from lifecycle_fsm.events import LEDGER_STREAM, stream_of
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.state import CandidateState, LedgerSettings, apply_settings, candidate_from_dict, step_candidate_at
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.records import StoredEvent
from lifecycle_fsm.upcasting import decoded_payload

__all__ = [
    "CACHED_CANDIDATES",
    "StreamReader",
    "check_cache_size",
    "fold_candidate",
    "fold_settings",
    "query_work",
    "state_from_checkpoint",
]

log = get_logger(__name__)

JSON = dict[str, Any]
_S = TypeVar("_S", CandidateState, JSON)
_CANDIDATE_FIELDS = frozenset(field_names(CandidateState))
# How many candidates' folds a `StreamReader` (a `Ledger`) keeps by default, least recently
# used evicted first: a fold is a few KB, so a process that touches thousands of candidates
# stays flat; a supervisor cycling over fewer never reads a stream it holds.
CACHED_CANDIDATES = 1024


class StreamSource(Protocol):
    """What a fold reads a stream from: the store, or a write transaction."""

    def read_stream(self, stream_id: str, *, after_version: int = 0) -> list[StoredEvent]: ...


def fold_settings(events: Sequence[StoredEvent], start: LedgerSettings | None = None) -> LedgerSettings:
    """The ledger's settings from its own stream (or from `start` plus the events after it)."""
    settings = start or LedgerSettings()
    for e in events:
        settings = apply_settings(settings, e.type, decoded_payload(e), e.seq)
    return settings


def fold_candidate(events: Sequence[StoredEvent], start: CandidateState | None = None) -> CandidateState | None:
    """One candidate's state from its stream (or from `start` plus the events after it).

    One working dict for the whole stream, frozen once at the end (`status ID` folds a
    long-lived candidate's hundreds of events: not a frozen copy per event). Each payload
    is the fold's own (parsed here, after its row's hash is checked).
    """
    if not events:
        return start
    work = None if start is None else start.to_work()
    for e in events:
        work = step_candidate_at(work, e.type, decoded_payload(e), e.seq, e.stream_id, e.version)
    assert work is not None
    return CandidateState.from_work(work)


def state_from_checkpoint(store: EventStore, stream_id: str) -> CandidateState | None:
    """The stream's state from the latest checkpoint, when it can be trusted.

    A stale or corrupt copy is skipped (and said so); the caller folds the stream.
    """
    return _from_checkpoint(store, stream_id, _state_from_dict)


def _state_from_dict(data: Any) -> tuple[CandidateState, int]:
    state = candidate_from_dict(data)
    return state, state.version


def _work_from_dict(data: Any) -> tuple[JSON, int]:
    """`candidate_from_dict(data).to_work()` without the `CandidateState`: every field, no other."""
    work = dict(data)
    if work.keys() != _CANDIDATE_FIELDS:
        raise KeyError(f"fields {sorted(work.keys() ^ _CANDIDATE_FIELDS)} differ from CandidateState's")
    work["reason_codes"] = tuple(work["reason_codes"])
    return work, work["version"]


def _from_checkpoint(store: EventStore, stream_id: str, read: Callable[[Any], tuple[_S, int]]) -> _S | None:
    """The stream's trusted checkpoint copy, `read` from its JSON (returning it and its version),
    or None: a stale or corrupt copy is skipped, and said so."""
    snap = store.latest_stream_snapshot(stream_id)
    if snap is None:
        return None
    from lifecycle_fsm.snapshots import snapshot_problem  # only with a checkpoint copy to judge (start-up)

    problem = snapshot_problem(
        store, schema_version=snap.schema_version, fingerprint=snap.fingerprint, text=snap.state,
        sha256=snap.state_sha256, position=snap.position, head_hash=snap.head_hash,
    )  # fmt: skip
    reason = None if problem is None else problem.reason
    if problem is None:
        try:
            state, version = read(orjson.loads(snap.state))
        except (ValueError, KeyError, TypeError) as e:  # ValueError: orjson's, or dict() of a JSON string
            reason = f"state cannot be read ({e!r})"
        else:
            if version == snap.version:
                return state
            reason = "state version differs from its row"
    log.warning("stream_snapshot_skipped", stream_id=stream_id, checkpoint_id=snap.checkpoint_id, reason=reason)
    return None


def query_work(store: EventStore, candidate_id: str) -> JSON:
    """`StreamReader(store).query(candidate_id).to_work()`, folded without building a `CandidateState`.

    The same read (the latest trusted checkpoint copy, else the whole stream), the same
    checks on every row and step, the same errors; but no attrs class is built, so a
    process that only prints one candidate (`status ID`) never imports attrs (issue #13).
    `decoded_payload` gives each step a fresh dict, which the step may keep.
    """
    stream_id = stream_of(candidate_id)
    work: JSON | None = _from_checkpoint(store, stream_id, _work_from_dict)
    for e in store.read_stream(stream_id, after_version=0 if work is None else work["version"]):
        work = step_candidate_at(work, e.type, decoded_payload(e), e.seq, e.stream_id, e.version)
    if work is None:
        raise NotFoundError(f"unknown candidate: {candidate_id!r}")
    return work


def check_cache_size(max_candidates: object) -> int:
    """How many candidates' folds a reader keeps: an int of at least 1, else an InputError."""
    if isinstance(max_candidates, bool) or not isinstance(max_candidates, int) or max_candidates < 1:
        raise InputError(f"the candidate cache's size (cached_candidates) must be an int of at least 1, "
                         f"not {max_candidates!r}")  # fmt: skip
    return max_candidates


class StreamReader:
    """The folds of the streams this process touched, kept current from the store.

    At most `max_candidates` candidates are held (an LRU: the one read or written longest
    ago goes first). The log is the truth and the cache only saves reads: an evicted
    candidate is folded again from its stream when next needed.
    """

    def __init__(self, store: EventStore, *, max_candidates: int = CACHED_CANDIDATES) -> None:
        check_cache_size(max_candidates)
        self.store = store
        self._settings = LedgerSettings()
        self._settings_known = False  # whether `_settings` was read or written by this process
        self._candidates: OrderedDict[str, CandidateState] = OrderedDict()
        self._max_candidates = max_candidates

    @property
    def held(self) -> int:
        """How many candidates' folds are held now (at most `max_candidates`)."""
        return len(self._candidates)

    def _keep(self, stream_id: str, state: CandidateState) -> None:
        """Hold `state` as the most recently used fold, evicting the least recently used past the bound."""
        candidates = self._candidates
        candidates[stream_id] = state
        candidates.move_to_end(stream_id)
        if len(candidates) > self._max_candidates:
            candidates.popitem(last=False)

    def settings(self) -> LedgerSettings:
        """The ledger's settings now: the cached fold plus any events appended since."""
        cached = self._settings
        new = self.store.read_stream(LEDGER_STREAM, after_version=cached.version)
        if new:
            self._settings = fold_settings(new, start=cached)
        self._settings_known = True
        return self._settings

    def cached_settings(self) -> LedgerSettings | None:
        """The settings as this process last read or wrote them, without reading (None if never)."""
        return self._settings if self._settings_known else None

    def cached(self, stream_id: str) -> CandidateState | None:
        """The candidate as this process last read or wrote it, without reading (None if not held)."""
        return self._candidates.get(stream_id)

    def candidate(
        self, stream_id: str, *, source: StreamSource | None = None, evict: bool = True
    ) -> CandidateState | None:
        """A candidate folded from the log alone (what commands decide from), None if unknown.

        `source`: read through an open write transaction instead of the store. `evict=False`:
        hold the fold only where that evicts nothing and promotes nothing (a settings change's
        sweep over every candidate must not push the supervisor's working set out of the cache,
        yet a ledger within the bound keeps every fold for the next sweep).
        """
        candidates = self._candidates
        cached = candidates.get(stream_id)
        reader = self.store if source is None else source
        new = reader.read_stream(stream_id, after_version=0 if cached is None else cached.version)
        state = fold_candidate(new, start=cached)
        if state is None:
            return None
        if evict:
            self._keep(stream_id, state)
        elif cached is not None or len(candidates) < self._max_candidates:
            candidates[stream_id] = state  # a held one keeps its place in the LRU order
        return state

    def existing(self, candidate_id: str) -> CandidateState:
        """`candidate`, or NotFoundError."""
        state = self.candidate(stream_of(candidate_id))
        if state is None:
            raise NotFoundError(f"unknown candidate: {candidate_id!r}")
        return state

    def query(self, candidate_id: str) -> CandidateState:
        """A candidate for a query: it may start from the latest checkpoint's copy."""
        stream_id = stream_of(candidate_id)
        if stream_id not in self._candidates:
            start = state_from_checkpoint(self.store, stream_id)
            if start is not None:
                # Not cached: a copy is good enough to answer a query, but commands
                # decide only from states folded from the log itself.
                state = fold_candidate(self.store.read_stream(stream_id, after_version=start.version), start=start)
                assert state is not None
                return state
        return self.existing(candidate_id)

    def remember(self, state: CandidateState | LedgerSettings) -> None:
        """Keep a state a command just folded from what it appended."""
        if isinstance(state, LedgerSettings):
            if state.version > self._settings.version:
                self._settings = state
                self._settings_known = True
        else:
            self._keep(stream_of(state.candidate_id), state)
