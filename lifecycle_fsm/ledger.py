"""The Ledger: the embedding API a training supervisor imports.

Each command validates its input, says which streams it depends on, gathers its
evidence (hashing happens here, before any lock) and lets a pure function in
`decisions.py` choose the events; `command_path.py` folds, asserts every version it
read, appends and re-decides on a lost race. Queries read the folds `streams.py`
keeps. One Ledger per process; many processes may share one ledger file.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Iterable, Iterator
from typing import Any

import attrs

from lifecycle_fsm import decisions
from lifecycle_fsm.artifacts import DigestCache, hash_directory
from lifecycle_fsm.checks import gather_checks, trusted_state_evidence, verify_artifact
from lifecycle_fsm.closed import closed_store
from lifecycle_fsm.command_inputs import (
    default_actor,
    default_id,
    non_negative,
    path_argument,
    require_baseline,
    require_kind,
    utc_now,
)
from lifecycle_fsm.command_path import CommandPath, Decide, Outcome
from lifecycle_fsm.decisions import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE, Decision
from lifecycle_fsm.errors import DuplicateEventError, InputError, LedgerClosedError, StoreError
from lifecycle_fsm.event_base import text_or_error
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    BaselineActivated,
    CandidateEvent,
    CandidateReceived,
    CandidateRegistered,
    ChecksRecorded,
    EvaluationActivated,
    Event,
    HandoffDecided,
    LedgerInitialized,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
    WindowAdvanced,
    candidate_id_of,
    stream_of,
)
from lifecycle_fsm.feed import FeedEvent, follow_events, read_events, wait_for_state
from lifecycle_fsm.limits import check_candidate_id, check_version_text
from lifecycle_fsm.machine import State
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.recovery import RecoveryPlan, invalidated_kinds, plan_from_payload
from lifecycle_fsm.results import CandidateResult, CommandResult, RecoveryResult, SettingsResult
from lifecycle_fsm.retry import DEFAULT_RETRY, RetryPolicy
from lifecycle_fsm.rules import CANDIDATE_KINDS, STAGES
from lifecycle_fsm.state import CandidateState, LedgerSettings, reading_stored
from lifecycle_fsm.store.base import EventStore
from lifecycle_fsm.store.chain import canonical_json
from lifecycle_fsm.store.records import EventFilter, StoredEvent
from lifecycle_fsm.streams import CACHED_CANDIDATES, StreamReader, check_cache_size, fold_candidate, fold_settings
from lifecycle_fsm.upcasting import decoded_event, decoded_payload, dense_versions

__all__ = [
    "DEFAULT_ACTIVE_WINDOW",
    "DEFAULT_MAX_WINDOW_AGE",
    "CandidateResult",
    "CommandResult",
    "Ledger",
    "RecoveryResult",
    "SettingsResult",
    "fold_candidate",
    "fold_settings",
    "utc_now",
]

JSON = dict[str, Any]
SigningKey = str | os.PathLike[str] | bytes


class Ledger:
    """The embedding API: one object per process, safe with many processes on one file."""

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
        root = _checked_options(actor, artifact_root, retry, cached_candidates)
        self.store = store
        self.actor = actor or default_actor()
        self.artifact_root = root
        self.signing_key = signing_key  # the key seals are signed with (SPEC §8), kept for the commands that sign
        self._clock = clock
        # The folds of the candidates this Ledger last read or wrote (at most `cached_candidates`, least
        # recently used evicted first): a command on one of them decides without reading its stream.
        self._reader = StreamReader(store, max_candidates=cached_candidates)
        self._path = CommandPath(self._reader, actor=self.actor, clock=clock, retry=retry, new_id=new_id)
        # Artifact digests this Ledger read, re-used by `check`/`hand_off` while no file changed;
        # stamped with the wall clock (the event clock is not consumed by a read).
        self._digests = DigestCache(utc_now, max_entries=2 * cached_candidates)  # bounded, as the folds are
        self._closed = False
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
        """A ledger on a SQLite file or a `postgresql://` URL (created if missing, unless `create=False`).

        `busy_timeout` (seconds) is how long a write waits for another writer's lock
        (SQLite's busy timeout, PostgreSQL's lock_timeout) before `StoreError`;
        `create=False` opens only a ledger that exists (a missing file or schema is an
        `InputError`, never a new empty ledger: a waiter with a mistyped path fails at once),
        and reads a SQLite ledger in a folder this process may not write (its writes are
        refused with `StoreError`); the rest are the constructor's (`clock`, `artifact_root`,
        `retry`, `new_id`, `cached_candidates`: how many candidates' folds it keeps, default 1024,
        least recently used evicted first).
        """
        from lifecycle_fsm.store.open import open_store

        path_or_url = path_argument("the ledger's path or URL", path_or_url)
        # Before the store is opened: a refused call must not create a ledger or leave a connection open.
        _checked_options(actor, artifact_root, retry, cached_candidates)
        try:
            store = open_store(path_or_url, synchronous=synchronous, busy_timeout=busy_timeout, create=create)
        except StoreError as e:
            read_only = _read_only_folder(path_or_url)
            if read_only is None:
                raise
            raise read_only from e
        try:
            ledger = cls(store, actor=actor, clock=clock, artifact_root=artifact_root, retry=retry,
                         signing_key=signing_key, new_id=new_id, cached_candidates=cached_candidates)  # fmt: skip
        except BaseException:
            store.close()  # nobody else holds it: its connection is not left to the garbage collector
            raise
        ledger.location = os.fspath(path_or_url)
        return ledger

    def seal(self) -> JSON:
        """Sign the head and append `HeadSealed` to the `seals` stream; the signed head (SPEC §8).

        Needs `signing_key` (InputError without one). Keep the result outside the ledger
        and check it later with `lifecycle verify --expect-head`.
        """
        from lifecycle_fsm.seals import seal

        return seal(self.store, self._private_key("seal"), actor=self.actor, clock=self._clock)

    def attest(self, candidate_id: str) -> JSON:
        """The candidate's hand-off as a signed DSSE envelope (in-toto Statement v1); appends nothing."""
        from lifecycle_fsm.attestation import attest

        return attest(self.store, candidate_id, self._private_key("attest"))

    def _private_key(self, what: str) -> Any:
        from lifecycle_fsm.keys import private_key_from

        if self.signing_key is None:
            raise InputError(f"{what} needs a signing key: Ledger.open(..., signing_key=PATH_OR_PEM)")
        return private_key_from(self.signing_key, what)

    def close(self) -> None:
        """Close the store; using the ledger afterwards raises `LedgerClosedError`. Idempotent."""
        if self._closed:
            return
        self.store.close()  # first: from a thread that did not open it, refused and still open
        self._closed = True
        self.store = closed_store()
        self._reader.store = self._path.store = self.store

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self) -> Ledger:
        if self._closed:  # as a closed file: refused here, not at the block's first read or write
            raise LedgerClosedError("this ledger is closed: open it again to use it (with-statement)")
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
        """New events as they are appended; ends when `stop` is set or the ledger is closed."""
        return follow_events(self.store, after=after, poll=poll, stream=stream, stop=stop,
                             is_closed=lambda: self._closed)  # fmt: skip

    def wait_for(
        self, candidate_id: str, states: State | str | Iterable[State | str], timeout: float, *, poll: float = 0.2
    ) -> State:
        """Block until the candidate is in one of `states`; `WaitTimeout` after `timeout` seconds.

        `states`: one state (a `State` or its name, `"ready"`) or an iterable of them; a name
        that is no state, an empty list or a bad `timeout` / `poll` is an `InputError`.
        """
        return wait_for_state(lambda: self._reader.existing(candidate_id).state, candidate_id=candidate_id,
                              states=states, timeout=timeout, poll=poll)  # fmt: skip

    # --- typed results -------------------------------------------------------------

    def _plan(self, stream_id: str, payload: JSON, seq: int) -> RecoveryPlan:
        """A stored plan, typed; a state invalidated before it is told from one never recorded.

        Only a state the plan saw unrecorded needs that history: otherwise the stream is not read.
        """
        plan = plan_from_payload(payload, seq=seq)
        if all(reason != "not_recorded" for _, reason in plan.skipped):
            return plan
        history = ((e.seq, e.type, decoded_payload(e)) for e in self.store.read_stream(stream_id)
                   if e.type in ("TrustedStateRecorded", "TrustedStateInvalidated"))  # fmt: skip
        return plan_from_payload(payload, seq=seq, invalidated=invalidated_kinds(history, before=seq))

    def _retried_unread(
        self, event_id: str | None, type_name: str, manifest_path: str, candidate_id: str | None = None
    ) -> Outcome | None:
        """A keyed receive or baseline activation retried once its manifest is gone: the stored answer
        when that key recorded this manifest path (and id), else None. Only a retry is helped."""
        if event_id is None or not isinstance(event_id, str):
            return None
        match: dict[str, Any] = {"manifest_path": os.path.normpath(os.path.abspath(manifest_path))}
        if candidate_id is not None:
            match["candidate_id"] = candidate_id
        return self._path.retried_unread(event_id, type_name, match)

    def _on_candidate(self, stream_id: str, decide: Decide, **how: Any) -> CandidateResult:
        _check_key(how["event_id"])
        outcome = self._path.run(stream_id, decide, **how)
        assert outcome.candidate is not None  # a candidate command always leaves (or finds) a candidate
        return CandidateResult(candidate=outcome.candidate, events=outcome.events, duplicate=outcome.duplicate)

    def _on_settings(self, stream_id: str, decide: Decide, **how: Any) -> SettingsResult:
        _check_key(how["event_id"])
        outcome = self._path.run(stream_id, decide, **how)
        assert outcome.settings is not None
        return SettingsResult(settings=outcome.settings, events=outcome.events, duplicate=outcome.duplicate,
                              invalidated=outcome.invalidated)  # fmt: skip

    # --- ledger settings ---------------------------------------------------------

    def init(
        self,
        max_window_age: int = DEFAULT_MAX_WINDOW_AGE,
        active_window: int = DEFAULT_ACTIVE_WINDOW,
        *,
        event_id: str | None = None,
    ) -> SettingsResult:
        """Fix the freshness settings; re-running with the same values is a no-op.

        The same values are today's or the ones the ledger was initialised with (so each
        supervisor run may start with `init()`, however far the window advanced since).
        """
        non_negative("max window age", max_window_age)
        non_negative("active window", active_window)
        ledger_id = self._path.new_id()  # kept only if this init is the ledger's first event

        def decide(_: CandidateState | None, settings: LedgerSettings) -> Decision:
            first = None
            if settings.initialized and (settings.max_window_age, settings.active_window) != (
                max_window_age, active_window,
            ):  # fmt: skip
                first = _initialized_with(self.store)  # only then: the window may have moved since
            return decisions.init(settings, max_window_age, active_window, ledger_id, initialized_with=first)

        return self._on_settings(
            LEDGER_STREAM, decide,
            command="init", event_id=event_id, first_type=LedgerInitialized.TYPE,
            inputs={"max_window_age": max_window_age, "active_window": active_window},
        )  # fmt: skip

    def activate_baseline(
        self, manifest_path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> SettingsResult:
        """Make an SFT baseline active; decided candidates must be checked again."""
        path = path_argument("manifest path", manifest_path)
        try:
            manifest = load_baseline_manifest(path)
        except InputError:
            retried = self._retried_unread(event_id, BaselineActivated.TYPE, path)
            if retried is None:
                raise
            assert retried.settings is not None
            return SettingsResult(settings=retried.settings, events=retried.events, duplicate=True,
                                  invalidated=retried.invalidated)  # fmt: skip
        actual = verify_artifact(manifest.adapter_path, manifest.adapter_sha256, self.artifact_root)
        event = BaselineActivated(
            policy_version=manifest.adapter_sha256,
            previous_policy_version=None,
            manifest_path=manifest.path,
            manifest_sha256=manifest.sha256,
            adapter_path=manifest.adapter_path,
            adapter_sha256=manifest.adapter_sha256,
            adapter_actual_sha256=actual["actual"],
            adapter_error=actual["error"],
            adapter_tree=actual["tree"],
        )
        return self._on_settings(
            LEDGER_STREAM, lambda _, settings: decisions.activate_baseline(settings, event),
            command="baseline activate", event_id=event_id, first_type=BaselineActivated.TYPE,
            inputs={"policy_version": event.policy_version, "adapter_path": event.adapter_path},
        )  # fmt: skip

    def advance_window(self, active_window: int, *, event_id: str | None = None) -> SettingsResult:
        """Move the active rollout window forward; online candidates' evidence ages."""
        non_negative("window", active_window)
        return self._on_settings(
            LEDGER_STREAM, lambda _, settings: decisions.advance_window(settings, active_window),
            command="window", event_id=event_id, first_type=WindowAdvanced.TYPE,
            inputs={"active_window": active_window},
        )  # fmt: skip

    def activate_evaluation(self, evaluation_version: str, *, event_id: str | None = None) -> SettingsResult:
        """Require candidates to name this evaluation version from now on."""
        if isinstance(evaluation_version, str):
            text_or_error("evaluation version", evaluation_version)  # not UTF-8 (a CLI argument): said so
        check_version_text("evaluation version", evaluation_version)
        return self._on_settings(
            LEDGER_STREAM, lambda _, settings: decisions.activate_evaluation(settings, evaluation_version),
            command="evaluation activate", event_id=event_id, first_type=EvaluationActivated.TYPE,
            inputs={"evaluation_version": evaluation_version},
        )  # fmt: skip

    # --- candidate commands ------------------------------------------------------

    def receive(
        self, manifest_path: str | os.PathLike[str], *, candidate_id: str | None = None, event_id: str | None = None
    ) -> CandidateResult:
        """Receive a candidate manifest; identical re-receipt is a no-op, `tune` may be revised."""
        manifest_path = path_argument("manifest path", manifest_path)
        try:
            manifest = load_candidate_manifest(manifest_path)
        except InputError:
            retried = self._retried_unread(event_id, CandidateReceived.TYPE, manifest_path, candidate_id)
            if retried is None:
                raise
            assert retried.candidate is not None
            return CandidateResult(candidate=retried.candidate, events=retried.events, duplicate=True)
        cid = candidate_id if candidate_id is not None else default_id(manifest.fields, manifest_path)
        try:
            check_candidate_id(cid)  # printable, at most 256 characters, no reserved name (lifecycle_fsm.limits)
        except InputError:
            # An id an older release let in keeps working for its own candidate (a retry, a revision).
            if not isinstance(cid, str) or not cid or self.store.stream_version(stream_of(cid)) == 0:
                raise

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            decision = decisions.receive(current, cid, manifest)
            if not decision.events:
                return decision
            # Hashed only for a new receipt (a retry reads nothing): what a later check is compared with.
            fields = manifest.fields
            at_receipt = verify_artifact(fields["adapter_resolved_path"], fields["adapter_sha256"], self.artifact_root)
            first = decision.events[0]
            assert isinstance(first, CandidateReceived)
            return Decision((attrs.evolve(first, artifact_at_receipt=at_receipt),))

        return self._on_candidate(
            stream_of(cid), decide,
            command="receive", event_id=event_id, reads_settings=False, first_type=CandidateReceived.TYPE,
            inputs={"candidate": manifest.fields},
        )  # fmt: skip

    def register(
        self,
        candidate_id: str,
        *,
        kind: str,
        source_policy_version: str | None = None,
        provenance: dict[str, Any] | None = None,
        event_id: str | None = None,
    ) -> CandidateResult:
        """A candidate that exists before its adapter (a training run), so its trusted states, failures
        and recovery plans can be recorded while it trains; `receive` of the finished adapter's
        manifest completes it. Until then `check` and `hand_off` are refused.

        `source_policy_version` defaults to the active baseline's; `provenance` (JSON) records what
        produced the candidate (data, code, base model, trainer, library versions).
        """
        check_candidate_id(candidate_id)
        if kind not in CANDIDATE_KINDS:
            raise InputError(f"unknown candidate kind {kind!r} (expected one of {', '.join(CANDIDATE_KINDS)})")
        if source_policy_version is not None:
            check_version_text("source policy version", source_policy_version)
        card: dict[str, Any] = {} if provenance is None else provenance
        if not isinstance(card, dict):
            raise InputError(f"provenance must be a dict, not {type(card).__name__}")
        canonical_json(card)  # JSON or InputError, before anything is decided

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            source = source_policy_version or settings.active_policy_version
            if source is None:
                raise InputError("no active baseline to register against: activate one, or pass source_policy_version")
            return decisions.register(current, candidate_id, kind, source, card)

        return self._on_candidate(
            stream_of(candidate_id), decide, command="register", event_id=event_id,
            first_type=CandidateRegistered.TYPE, inputs={"candidate_id": candidate_id, "kind": kind},
        )  # fmt: skip

    def check(self, candidate_id: str, *, event_id: str | None = None, rehash: bool = False) -> CandidateResult:
        """Run every check now: verified (or unchanged on a re-check) or reject.

        An artifact this Ledger already read and whose files are unchanged on disk (device,
        inode, size, mtime, ctime) is not read again (the event says `reused_from`);
        `rehash=True` reads every byte.
        """
        cache = None if rehash else self._digests

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            decisions.require_adapter(current, "check")
            require_baseline(settings)
            return decisions.check(gather_checks(current.candidate, settings, root=self.artifact_root, cache=cache))

        return self._on_candidate(
            stream_of(candidate_id), decide, command="check", event_id=event_id, first_type=ChecksRecorded.TYPE
        )

    def record_trusted_state(
        self, candidate_id: str, kind: str, path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> CandidateResult:
        """Record a state a stage saved, hashed on disk now, for recovery to resume from.

        Hashed under the Ledger's `artifact_root` like every other artifact (symlinks may lead
        anywhere inside it, a Hugging Face snapshot into its `blobs`); a path outside it is an
        `ArtifactError`. Without a root, the path is its own.
        """
        require_kind(kind)
        absolute = os.path.abspath(path_argument("trusted-state path", path))
        root = self.artifact_root
        self._refuse_rewritten(event_id, kind, absolute)

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            # Looked at only once the move was found legal and the key is no retry: a refused command
            # reads nothing, and a retry answers even after the file was rotated away.
            if not os.path.lexists(absolute):
                raise InputError(f"no such trusted-state path: {absolute}")
            return decisions.record_trusted_state(kind, absolute, hash_directory(absolute, root))

        return self._on_candidate(
            stream_of(candidate_id), decide,
            command="trusted", event_id=event_id, reads_settings=False, first_type=TrustedStateRecorded.TYPE,
            inputs={"kind": kind, "path": absolute},
        )  # fmt: skip

    def _refuse_rewritten(self, event_id: str | None, kind: str, path: str) -> None:
        """A key already used to record this state, while the file now holds other bytes, is refused: a
        re-saved checkpoint (a restarted run) answered as a duplicate would leave the old hash recorded.
        A retry whose file is gone still answers with what was recorded."""
        if event_id is None or not isinstance(event_id, str):
            return
        stored = self.store.event_by_id(event_id)
        if stored is None or stored.type != TrustedStateRecorded.TYPE or not os.path.lexists(path):
            return
        recorded = decoded_payload(stored)
        if (recorded["kind"], recorded["path"]) != (kind, path):
            return  # another command's key: the command path says so
        now = hash_directory(path, self.artifact_root)
        if now != recorded["sha256"]:
            raise DuplicateEventError(
                f"event id {event_id!r} already recorded {kind} {path} with sha256 {recorded['sha256']} "
                f"(seq {stored.seq}); the file now hashes to {now}: record the new bytes under a new key",
                event_id=event_id,
                seq=stored.seq,
            )

    def invalidate_trusted_state(
        self, candidate_id: str, kind: str, reason: str = "invalidated by operator", *, event_id: str | None = None
    ) -> CandidateResult:
        """Stop trusting a recorded state (it stays in history); `reason` is recorded for the auditor."""
        require_kind(kind)
        if not isinstance(reason, str):
            raise InputError(f"the invalidation reason must be a string, not {type(reason).__name__} ({reason!r})")
        text_or_error("reason", reason)

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.invalidate_trusted_state(current, kind, reason)

        return self._on_candidate(
            stream_of(candidate_id), decide, command="untrust", event_id=event_id, reads_settings=False,
            first_type=TrustedStateInvalidated.TYPE, inputs={"kind": kind},
        )  # fmt: skip

    def fail_stage(self, candidate_id: str, stage: str, *, event_id: str | None = None) -> RecoveryResult:
        """A stage failed: plan recovery from the nearest trusted state the log proves intact."""
        if stage not in STAGES:
            raise InputError(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})")

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            evidence = trusted_state_evidence(current, settings, stage, self.artifact_root)
            return decisions.fail_stage(current, stage, evidence)

        done = self._on_candidate(
            stream_of(candidate_id), decide, command="fail", event_id=event_id, first_type=StageFailed.TYPE,
            then_types=(RecoveryPlanned.TYPE,), inputs={"stage": stage},
        )  # fmt: skip
        # The plan this command recorded (a retried event_id returns the original one, not a later plan).
        planned = next(e for e in done.events if e.type == RecoveryPlanned.TYPE)
        recorded = done.candidate.last_recovery
        if done.duplicate or recorded is None or recorded.get("seq") != planned.seq:
            recorded = decoded_payload(planned)  # read back from the log: hash-checked, upcast
        # else: just appended and folded into the state returned, from this very payload
        plan = self._plan(planned.stream_id, recorded, planned.seq)
        return RecoveryResult(candidate=done.candidate, events=done.events, duplicate=done.duplicate, plan=plan)

    def complete_recovery(self, candidate_id: str, *, event_id: str | None = None) -> CandidateResult:
        """The planned recovery is done; the candidate goes back to be checked again."""

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.complete_recovery(current)

        return self._on_candidate(
            stream_of(candidate_id), decide, command="recovered", event_id=event_id, reads_settings=False,
            first_type=RecoveryCompleted.TYPE,
        )  # fmt: skip

    def hand_off(self, candidate_id: str, *, event_id: str | None = None, rehash: bool = False) -> CandidateResult:
        """Re-run the checks now and decide: ready (for evaluation), tune or reject (`rehash`: as `check`)."""
        cache = None if rehash else self._digests

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            decisions.require_adapter(current, "handoff")
            require_baseline(settings)
            evidence = gather_checks(current.candidate, settings, root=self.artifact_root, cache=cache)
            return decisions.hand_off(current, evidence)

        return self._on_candidate(
            stream_of(candidate_id), decide, command="handoff", event_id=event_id, first_type=HandoffDecided.TYPE
        )


def _checked_options(actor: object, artifact_root: object, retry: object, cached_candidates: object) -> str | None:
    """The constructor's argument checks (InputError); the artifact root made absolute."""
    if actor is not None and not isinstance(actor, str):
        raise InputError(f"actor must be a string, not {type(actor).__name__}")
    if actor is not None:
        text_or_error("actor", actor)
    if not isinstance(retry, RetryPolicy):  # else every command would fail on `retry.deadline`
        raise InputError(f"retry must be a RetryPolicy, not {type(retry).__name__} ({retry!r})")
    check_cache_size(cached_candidates)
    return None if artifact_root is None else os.path.abspath(path_argument("artifact_root", artifact_root))


def _read_only_folder(target: str | os.PathLike[str]) -> StoreError | None:
    """Why an existing ledger file could not be opened to write, when its folder may not be
    written (SQLite keeps the `-wal` and `-shm` beside the file); None for anything else."""
    from lifecycle_fsm.store.open import is_postgres_url

    if is_postgres_url(target):
        return None
    path = os.fspath(target)
    real = os.path.realpath(path)
    folder = os.path.dirname(real)
    if not os.path.isfile(real) or os.access(folder, os.W_OK):
        return None
    return StoreError(
        f"{path}: cannot open the ledger to write: its folder {folder} is read-only for this process (a Ledger "
        "writes, and SQLite keeps the ledger's -wal and -shm files beside it); to read it, use "
        "Ledger.open(path, create=False) (reads work, writes are refused) or the CLI's read commands "
        "(status, log, explain, verify)"
    )


def _initialized_with(store: EventStore) -> tuple[int, int] | None:
    """The `(max_window_age, active_window)` the ledger's `LedgerInitialized` (its stream's first event) fixed."""
    first = next(iter(store.select_matching(EventFilter(stream_id=LEDGER_STREAM, limit=1))), None)
    if first is None or first.type != LedgerInitialized.TYPE:
        return None
    payload = decoded_payload(first)
    return payload["max_window_age"], payload["active_window"]


def _check_key(event_id: object) -> None:
    """An idempotency key is a string (or None): anything else is refused before it is looked up."""
    if event_id is not None and not isinstance(event_id, str):
        raise InputError(f"event_id must be a string, not {type(event_id).__name__} ({event_id!r})")
    if event_id is not None:
        text_or_error("event_id", event_id)
