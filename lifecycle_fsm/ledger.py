"""The Ledger: the embedding API a training supervisor imports (its candidate commands are in
`candidate_commands.py`). Queries read the folds `streams.py` keeps. One Ledger per process.

A Ledger may be closed from another thread (a shutdown handler ending a blocked `follow()`). The
connection belongs to the opening thread, so its `_ClosedStore` holds it until that thread closes it:
when its `follow()` ends, or at its next call. Every call on a closed ledger is a `LedgerClosedError`.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any, NoReturn, cast

from lifecycle_fsm import decisions
from lifecycle_fsm.artifacts import DigestCache
from lifecycle_fsm.candidate_commands import CandidateCommands
from lifecycle_fsm.candidate_events import CandidateEvent
from lifecycle_fsm.checks import verify_artifact
from lifecycle_fsm.command_path import Command, CommandPath, Decide
from lifecycle_fsm.decisions import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE, Decision
from lifecycle_fsm.errors import InputError, LedgerClosedError, StoreError
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    BaselineActivated,
    EvaluationActivated,
    Event,
    LedgerInitialized,
    WindowAdvanced,
    candidate_id_of,
    stream_of,
    text_or_error,
)
from lifecycle_fsm.feed import FeedEvent, follow_events, read_events, wait_for_state
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import check_int, check_version_text
from lifecycle_fsm.machine import State
from lifecycle_fsm.manifests import (
    checked_options,
    default_actor,
    load_baseline_manifest,
    path_argument,
    read_only_folder,
    utc_now,
)
from lifecycle_fsm.results import SettingsResult, retried_unread
from lifecycle_fsm.retry import DEFAULT_RETRY, RetryPolicy
from lifecycle_fsm.rules import RecoveryPlan
from lifecycle_fsm.state import CandidateState, LedgerSettings, reading_stored
from lifecycle_fsm.store.base import EventStore, select_events
from lifecycle_fsm.store.records import EventFilter, StoredEvent
from lifecycle_fsm.streams import CACHED_CANDIDATES, StreamReader
from lifecycle_fsm.upcasting import decoded_event, decoded_payload, dense_versions

SigningKey = str | os.PathLike[str] | bytes
_CLOSED = "this ledger is closed: open it again to use it"

if TYPE_CHECKING:
    from lifecycle_fsm.replay.explanation_parts import Explanation


class _ClosedStore:
    """Stands in for a closed store; closing it again only closes the connection it still holds (`pending`),
    once, from the thread that opened it."""

    def __init__(self, pending: EventStore | None, opener: int) -> None:
        self._pending = pending
        self._opener = opener

    def close(self) -> None:
        pending = self._pending
        if pending is not None and threading.get_ident() == self._opener:
            self._pending = None
            pending.close()

    def __getattr__(self, name: str) -> NoReturn:
        if name.startswith("__"):  # copy, pickle and friends look for these: not a call on the ledger
            raise AttributeError(name)
        self.close()
        raise LedgerClosedError(_CLOSED)


def _require_open(store: object) -> None:
    """LedgerClosedError for a closed ledger's store (closing a connection left to this thread first)."""
    if isinstance(store, _ClosedStore):
        store.close()
        raise LedgerClosedError(_CLOSED)


class Ledger(CandidateCommands):
    """The embedding API: one object per process, safe with many processes on one file. `clock` stamps
    each event as UTC text like `2026-11-30T12:00:00.000000Z` (as `utc_now` does), or a command is refused."""

    def __init__(
        self,
        store: EventStore,
        *,
        actor: str | None = None,
        clock: Callable[[], str] = utc_now,
        artifact_root: str | os.PathLike[str] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        signing_key: SigningKey | None = None,
        new_id: Callable[[], str] | None = None,
        cached_candidates: int = CACHED_CANDIDATES,
    ) -> None:
        self.artifact_root = checked_options(actor, artifact_root, retry, cached_candidates)
        self.store = store
        self.actor = actor or default_actor()
        self.signing_key = signing_key  # the key seals and attestations are signed with
        self._clock = clock
        # The folds of the candidates last read or wrote (LRU): a command on one decides without reading.
        self._reader = StreamReader(store, max_candidates=cached_candidates)
        self._path = CommandPath(self._reader, actor=self.actor, clock=clock, retry=retry, new_id=new_id)
        # Stamped with the wall clock: the event clock is not consumed by a read.
        self._digests = DigestCache(utc_now, max_entries=2 * cached_candidates)
        self._closed = False
        self._opener = threading.get_ident()  # the thread whose connection the store is
        self.location: str | None = None  # the path or URL `open` was given (None for a store passed in)

    @classmethod
    def open(
        cls,
        path_or_url: str | os.PathLike[str],
        *,
        actor: str | None = None,
        synchronous: str = "FULL",
        busy_timeout: float = 30.0,
        signing_key: SigningKey | None = None,
        create: bool = True,
        clock: Callable[[], str] = utc_now,
        artifact_root: str | os.PathLike[str] | None = None,
        retry: RetryPolicy = DEFAULT_RETRY,
        new_id: Callable[[], str] | None = None,
        cached_candidates: int = CACHED_CANDIDATES,
    ) -> Ledger:
        """A ledger on a SQLite file or a `postgresql://` URL, created if missing unless `create=False` (then a
        missing one is an `InputError`, and a SQLite ledger in a folder this process may not write opens to
        read). `busy_timeout`: seconds a write waits for another writer's lock before `StoreError`; the rest
        are the constructor's (`cached_candidates`: how many candidates' folds it keeps, default 1024)."""
        from lifecycle_fsm.store.open import open_store

        path_or_url = path_argument("the ledger's path or URL", path_or_url)
        # Before the store is opened: a refused call must not create a ledger or leave a connection open.
        checked_options(actor, artifact_root, retry, cached_candidates)
        try:
            store = open_store(path_or_url, synchronous=synchronous, busy_timeout=busy_timeout, create=create)
        except StoreError as e:
            read_only = read_only_folder(path_or_url)
            if read_only is None:
                raise
            raise read_only from e
        try:
            ledger = cls(
                store,
                actor=actor,
                clock=clock,
                artifact_root=artifact_root,
                retry=retry,
                signing_key=signing_key,
                new_id=new_id,
                cached_candidates=cached_candidates,
            )
        except BaseException:
            store.close()  # nobody else holds it: its connection is not left to the garbage collector
            raise
        ledger.location = os.fspath(path_or_url)
        return ledger

    def seal(self, *, event_id: str | None = None) -> JSON:
        """Sign the head and append `HeadSealed` to the `seals` stream; the signed head. Needs `signing_key`;
        keep the result outside the ledger and check it later with `lifecycle verify --expect-head`."""
        from lifecycle_fsm.seals import seal

        return seal(self.store, self._private_key("seal"), actor=self.actor, clock=self._clock, event_id=event_id)

    def attest(self, candidate_id: str) -> JSON:
        """The candidate's hand-off as a signed DSSE envelope (in-toto Statement v1); appends nothing."""
        from lifecycle_fsm.attestation import attest

        return attest(self.store, candidate_id, self._private_key("attest"))

    def _private_key(self, what: str) -> Any:
        from lifecycle_fsm.keys import private_key_from

        _require_open(self.store)  # a closed ledger says so before a missing key is
        if self.signing_key is None:
            raise InputError(f"{what} needs a signing key: Ledger.open(..., signing_key=PATH_OR_PEM)")
        return private_key_from(self.signing_key, what)

    def close(self) -> None:
        """Close the store; using the ledger afterwards raises `LedgerClosedError`. Idempotent. From another
        thread: a blocked `follow()` or `wait_for()` ends within a quarter of a second, and the opening
        thread closes the connection then, or at its next call."""
        if self._closed:
            return
        store, here, self._closed = self.store, threading.get_ident() == self._opener, True
        self.store = cast(EventStore, _ClosedStore(None if here else store, self._opener))
        self._reader.store = self._path.store = self.store
        if here:
            store.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Ledger:
        if self._closed:  # as a closed file: refused here, not at the block's first read or write
            raise LedgerClosedError(f"{_CLOSED} (with-statement)")
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queries ---------------------------------------------------------------

    def settings(self) -> LedgerSettings:
        """The ledger's settings now."""
        return self._reader.settings()

    def candidate(self, candidate_id: str) -> CandidateState:
        """One candidate now (a query: it may start from the latest checkpoint's copy)."""
        return self._reader.query(candidate_id)

    def history(self, candidate_id: str) -> list[tuple[StoredEvent, Event]]:
        """Every event of one candidate, oldest first, with its decoded domain event."""
        events = self.store.read_stream(stream_of(candidate_id))
        if not events:
            self._reader.existing(candidate_id)  # raises NotFoundError
        decoded = [(e, decoded_event(e)) for e in dense_versions(events)]  # a hole in the stream is refused
        for e, event in decoded:  # each move read strictly: a re-hashed row of the wrong shape is corruption here
            if isinstance(event, CandidateEvent):
                with reading_stored(e.seq, e.type):
                    type(event).trigger_for(event.to_payload())
        return decoded

    def explain(self, candidate_id: str, as_of: int | str | None = None) -> Explanation:
        """Why the candidate is where it is (as of a seq or an ISO time): the decisive event, the evidence
        behind it, what it claimed, each trusted state a recovery considered; what `lifecycle explain` prints."""
        from lifecycle_fsm.replay.explain import explanation
        from lifecycle_fsm.replay.log import parse_as_of

        return explanation(self.store, candidate_id, as_of=None if as_of is None else parse_as_of(str(as_of)))

    def candidate_ids(self) -> list[str]:
        ids = (candidate_id_of(h.stream_id) for h in self.store.streams())
        return [i for i in ids if i is not None]

    def recovery_plan(self, candidate_id: str) -> RecoveryPlan | None:
        """The candidate's latest recovery plan (what a restarted supervisor resumes), None if never failed."""
        plan = self.candidate(candidate_id).last_recovery
        return None if plan is None else self._plan(stream_of(candidate_id), plan, plan["seq"])

    # --- reading the log as it grows (lifecycle_fsm/feed.py) -------------------------

    def events(self, after: int = 0, stream: str | None = None) -> Iterator[FeedEvent]:
        """Stored events after seq `after`, in seq order; `stream`: a candidate id, `ledger` or `seals`."""
        return read_events(self.store, after=after, stream=stream)

    def follow(
        self, after: int = 0, poll: float = 0.2, *, stream: str | None = None, stop: threading.Event | None = None
    ) -> Iterator[FeedEvent]:
        """New events as they are appended; ends when `stop` is set or the ledger is closed (from any thread)."""
        _require_open(self.store)
        events = follow_events(
            self.store, after=after, poll=poll, stream=stream, stop=stop, is_closed=lambda: self._closed
        )
        return self._closing_after(events)

    def _closing_after(self, events: Iterator[FeedEvent]) -> Iterator[FeedEvent]:
        """When `follow()`'s events end because the ledger was closed (from another thread), the connection
        that close left to this thread is closed here."""
        try:
            yield from events
        finally:
            if self._closed:
                self.store.close()

    def wait_for(
        self, candidate_id: str, states: State | str | Iterable[State | str], timeout: float, *, poll: float = 0.2
    ) -> State:
        """Block until the candidate is in one of `states` (a `State`, its name, or an iterable of them);
        `WaitTimeout` after `timeout` seconds, or at once when it is rejected and reject is not wanted
        (`lifecycle_fsm.feed.wait_for_state`). A bad state, timeout or poll is an `InputError`."""
        return wait_for_state(
            lambda: self.store,
            lambda: self._reader.existing(candidate_id).state,
            is_closed=lambda: self._closed,
            candidate_id=candidate_id,
            states=states,
            timeout=timeout,
            poll=poll,
        )

    # --- ledger settings ---------------------------------------------------------

    def _on_settings(self, decide: Decide, **how: Any) -> SettingsResult:
        result = self._path.run(Command(LEDGER_STREAM, decide, **how))
        assert isinstance(result, SettingsResult)
        return result

    def init(
        self,
        max_window_age: int = DEFAULT_MAX_WINDOW_AGE,
        active_window: int = DEFAULT_ACTIVE_WINDOW,
        *,
        event_id: str | None = None,
    ) -> SettingsResult:
        """Fix the freshness settings; re-running with today's values, or the ones the ledger was initialised
        with (however far the window advanced since), is a no-op."""
        check_int("max window age", max_window_age)
        check_int("active window", active_window)
        ledger_id = self._path.new_id()  # kept only if this init is the ledger's first event

        def decide(_: CandidateState | None, settings: LedgerSettings) -> Decision:
            changed = (settings.max_window_age, settings.active_window) != (max_window_age, active_window)
            first = _initialized_with(self.store) if settings.initialized and changed else None
            return decisions.init(settings, max_window_age, active_window, ledger_id, initialized_with=first)

        return self._on_settings(
            decide,
            command="init",
            event_id=event_id,
            first_type=LedgerInitialized.TYPE,
            inputs={"max_window_age": max_window_age, "active_window": active_window},
        )

    def activate_baseline(
        self, manifest_path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> SettingsResult:
        """Make an SFT baseline active; decided candidates must be checked again."""
        path = path_argument("manifest path", manifest_path)
        try:
            manifest = load_baseline_manifest(path, self.artifact_root)
        except InputError:
            retried = retried_unread(self._path, event_id, BaselineActivated.TYPE, path)
            if retried is None:
                raise
            assert isinstance(retried, SettingsResult)
            return retried
        actual = verify_artifact(manifest.adapter_path, manifest.adapter_sha256, self.artifact_root)
        event = BaselineActivated(
            policy_version=manifest.adapter_sha256,
            previous_policy_version=None,
            manifest_path=manifest.path,
            manifest_sha256=manifest.sha256,
            adapter_path=manifest.adapter_path,
            adapter_sha256=manifest.adapter_sha256,
            adapter_actual_sha256=actual.actual,
            adapter_error=actual.error,
            adapter_tree=actual.tree,
        )
        return self._on_settings(
            lambda _, settings: decisions.activate_baseline(settings, event),
            command="baseline activate",
            event_id=event_id,
            first_type=BaselineActivated.TYPE,
            inputs={"policy_version": event.policy_version, "adapter_path": event.adapter_path},
        )

    def advance_window(self, active_window: int, *, event_id: str | None = None) -> SettingsResult:
        """Move the active rollout window forward; online candidates' evidence ages."""
        check_int("window", active_window)
        return self._on_settings(
            lambda _, settings: decisions.advance_window(settings, active_window),
            command="window",
            event_id=event_id,
            first_type=WindowAdvanced.TYPE,
            inputs={"active_window": active_window},
        )

    def activate_evaluation(self, evaluation_version: str, *, event_id: str | None = None) -> SettingsResult:
        """Require candidates to name this evaluation version from now on."""
        if isinstance(evaluation_version, str):
            text_or_error("evaluation version", evaluation_version)  # not UTF-8 (a CLI argument): said so
        check_version_text("evaluation version", evaluation_version)
        return self._on_settings(
            lambda _, settings: decisions.activate_evaluation(settings, evaluation_version),
            command="evaluation activate",
            event_id=event_id,
            first_type=EvaluationActivated.TYPE,
            inputs={"evaluation_version": evaluation_version},
        )


def _initialized_with(store: EventStore) -> tuple[int, int] | None:
    """The `(max_window_age, active_window)` the ledger's `LedgerInitialized` (its stream's first event) fixed."""
    first = next(iter(select_events(store, EventFilter(stream_id=LEDGER_STREAM, limit=1))), None)
    if first is None or first.type != LedgerInitialized.TYPE:
        return None
    payload = decoded_payload(first)
    return payload["max_window_age"], payload["active_window"]
