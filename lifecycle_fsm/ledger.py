"""The Ledger: commands in, events out, through the store.

Each command folds only the streams it touches (its candidate and, when a decision
reads them, the ledger's settings), decides with the pure rules, and appends the
resulting events in one transaction that asserts the version of every stream it
read. If another writer got there first the command is re-folded and re-decided
(a few times, then `ConcurrencyError`), so no candidate is ever verified against
a baseline that changed underneath it. Expensive work (hashing artifacts) happens
before the write lock is taken.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.checks import gather_checks, handoff_reason_codes, trusted_state_evidence, verify_artifact
from lifecycle_fsm.errors import (
    ConcurrencyError,
    ConflictError,
    DuplicateEventError,
    IllegalCommandError,
    InputError,
    NotFoundError,
)
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    BaselineActivated,
    CandidateReceived,
    ChecksRecorded,
    EvaluationActivated,
    Event,
    EvidenceInvalidated,
    HandoffDecided,
    LedgerInitialized,
    RecoveryCompleted,
    RecoveryPlanned,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
    WindowAdvanced,
    candidate_id_of,
    event_from_payload,
    stream_of,
)
from lifecycle_fsm.guards import label_after, require_baseline, require_kind, require_move
from lifecycle_fsm.logs import get_logger
from lifecycle_fsm.machine import MACHINE
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.rules import (
    BLOCKING_ACTIONS,
    ONLINE_KINDS,
    STAGES,
    choose_recovery_action,
)
from lifecycle_fsm.state import CandidateState, LedgerSettings, apply_candidate, apply_settings
from lifecycle_fsm.streams import decoded_payload, fold_candidate, fold_settings, state_from_checkpoint
from store.base import EventStore, StoreTransaction
from store.chain import canonical_json
from store.records import NewEvent, StoredEvent

__all__ = [
    "DEFAULT_ACTIVE_WINDOW",
    "DEFAULT_MAX_WINDOW_AGE",
    "CommandResult",
    "Ledger",
    "fold_candidate",
    "fold_settings",
    "utc_now",
]

log = get_logger(__name__)

DEFAULT_MAX_WINDOW_AGE = 2
DEFAULT_ACTIVE_WINDOW = 1
_RETRIES = 5
_DECIDED = ("verified", "ready", "tune")

JSON = dict[str, Any]


@attrs.frozen
class CommandResult:
    """What a command did: the events it appended (none for a no-op) and where it left things."""

    events: tuple[StoredEvent, ...]
    candidate: CandidateState | None = None
    settings: LedgerSettings | None = None
    invalidated: tuple[str, ...] = ()
    duplicate: bool = False

    @property
    def state(self) -> str | None:
        return None if self.candidate is None else self.candidate.state


def utc_now() -> str:
    """The clock events are stamped with (UTC, microseconds); never read on replay."""
    return dt.datetime.now(dt.UTC).isoformat(timespec="microseconds").replace("+00:00", "Z")


def _default_actor() -> str:
    try:
        user = getpass.getuser()
    except (KeyError, OSError):
        user = "unknown"
    return f"{user}@{socket.gethostname()}:{os.getpid()}"


def _default_id(fields: JSON, manifest_path: str | os.PathLike[str]) -> str:
    """The manifest's policy_version; without a usable one, the manifest's path as given.

    An empty version is a semantic problem, not an input error: the candidate is
    received under its path and its check rejects it (`candidate_identity`).
    """
    version = fields.get("policy_version")
    if isinstance(version, str) and version.strip() and not any(ch in version for ch in "\n\r\t\0"):
        return version
    return Path(os.path.normpath(manifest_path)).as_posix()


class Ledger:
    """The embedding API: one object per process, safe with many processes on one file."""

    def __init__(
        self,
        store: EventStore,
        *,
        actor: str | None = None,
        clock: Callable[[], str] = utc_now,
        artifact_root: str | os.PathLike[str] | None = None,
    ) -> None:
        self.store = store
        self.actor = actor or _default_actor()
        self._clock = clock
        self.artifact_root = None if artifact_root is None else os.path.abspath(artifact_root)
        # Folds of the streams this process touched, topped up from the store on every
        # read; a stale entry can only cost a ConcurrencyError retry, never a wrong append.
        self._settings = LedgerSettings()
        self._candidates: dict[str, CandidateState] = {}

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, synchronous: str = "FULL", **kwargs: Any) -> Ledger:
        """A ledger on a SQLite file (created if missing)."""
        from store.sqlite import SQLiteEventStore

        return cls(SQLiteEventStore(path, synchronous=synchronous), **kwargs)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- queries ---------------------------------------------------------------

    def settings(self) -> LedgerSettings:
        """The ledger's settings now: the cached fold plus any events appended since."""
        cached = self._settings
        new = self.store.read_stream(LEDGER_STREAM, after_version=cached.version)
        if new:
            self._settings = fold_settings(new, start=cached)
        return self._settings

    def candidate(self, candidate_id: str) -> CandidateState:
        """One candidate now (a query: it may start from the latest checkpoint's copy)."""
        stream_id = stream_of(candidate_id)
        state = self._candidates.get(stream_id)
        if state is None:
            start = state_from_checkpoint(self.store, stream_id)
            if start is not None:
                # Not cached: a copy is good enough to answer a query, but commands
                # decide only from states folded from the log itself.
                tail = self.store.read_stream(stream_id, after_version=start.version)
                state = fold_candidate(tail, start=start)
                assert state is not None
                return state
        return self._decidable(candidate_id)

    def _decidable(self, candidate_id: str) -> CandidateState:
        """The state a command decides from: folded from the log only, never from a checkpoint."""
        state = self._current(stream_of(candidate_id))
        if state is None:
            raise NotFoundError(f"unknown candidate: {candidate_id!r}")
        return state

    def _current(self, stream_id: str) -> CandidateState | None:
        cached = self._candidates.get(stream_id)
        new = self.store.read_stream(stream_id, after_version=0 if cached is None else cached.version)
        state = fold_candidate(new, start=cached)
        if state is not None:
            self._candidates[stream_id] = state
        return state

    def history(self, candidate_id: str) -> list[tuple[StoredEvent, Event]]:
        events = self.store.read_stream(stream_of(candidate_id))
        if not events:
            raise NotFoundError(f"unknown candidate: {candidate_id!r}")
        return [(e, event_from_payload(e.type, e.schema_version, decoded_payload(e), seq=e.seq)) for e in events]

    def candidate_ids(self) -> list[str]:
        ids = (candidate_id_of(h.stream_id) for h in self.store.streams())
        return [i for i in ids if i is not None]

    # --- the write path --------------------------------------------------------

    def _new(self, event: Event, payload: JSON, stream_id: str, event_id: str | None, index: int) -> NewEvent:
        if event_id is None:
            eid = uuid.uuid4().hex
        else:
            eid = event_id if index == 0 else f"{event_id}/{index}"
        return NewEvent(stream_id, event.TYPE, event.SCHEMA_VERSION, payload, eid, self._clock(), self.actor)

    def _replayed(
        self, event_id: str | None, stream_id: str, type_name: str, inputs: JSON | None = None
    ) -> CommandResult | None:
        """A retried command (same event_id, same inputs) returns what it did the first time.

        The same id for another stream, event type or inputs is `DuplicateEventError`.
        """
        if event_id is None:
            return None
        first = self.store.event_by_id(event_id)
        if first is None:
            return None
        payload = orjson.loads(first.payload)
        same_inputs = all(payload.get(key) == value for key, value in (inputs or {}).items())
        if first.stream_id != stream_id or first.type != type_name or not same_inputs:
            raise DuplicateEventError(
                f"event id {event_id!r} is already used at seq {first.seq} by {first.type} on {first.stream_id}",
                event_id=event_id,
                seq=first.seq,
            )
        events = [first]
        while (nxt := self.store.event_by_id(f"{event_id}/{len(events)}")) is not None:
            events.append(nxt)
        candidate = self._current(stream_id) if stream_id != LEDGER_STREAM else None
        return CommandResult(tuple(events), candidate=candidate, duplicate=True)

    def _candidate_command(
        self,
        candidate_id: str,
        required_trigger: str,
        decide: Callable[[CandidateState, LedgerSettings], list[Event]],
        *,
        event_id: str | None,
        first_type: str,
        reads_settings: bool = True,
        inputs: JSON | None = None,
    ) -> CommandResult:
        stream_id = stream_of(candidate_id)
        replayed = self._replayed(event_id, stream_id, first_type, inputs)
        if replayed is not None:
            return replayed
        for attempt in range(_RETRIES):
            current = self._decidable(candidate_id)
            require_move(current, required_trigger)
            settings = self.settings() if reads_settings else LedgerSettings()
            events = decide(current, settings)
            payloads = [e.to_payload() for e in events]
            label = label_after(current, events, payloads)
            try:
                with self.store.transaction() as tx:
                    if reads_settings:
                        tx.expect_version(LEDGER_STREAM, settings.version)
                    result = tx.append(
                        stream_id,
                        current.version,
                        [
                            self._new(e, p, stream_id, event_id, i)
                            for i, (e, p) in enumerate(zip(events, payloads, strict=True))
                        ],
                        status=label,
                        category=current.kind if isinstance(current.kind, str) else None,
                        fresh_ids=event_id is None,
                    )
            except ConcurrencyError:
                if attempt == _RETRIES - 1:
                    raise
                log.info("command_retried", candidate_id=candidate_id, trigger=required_trigger, attempt=attempt + 1)
                continue
            if result.duplicate:
                final = self._current(stream_id)
            else:
                final = self._fold_new(current, result.events, payloads)
            self._log_appended(result.events, final)
            return CommandResult(
                result.events,
                candidate=final,
                settings=settings if reads_settings else None,
                duplicate=result.duplicate,
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _fold_new(
        self, current: CandidateState | None, stored: Sequence[StoredEvent], payloads: Sequence[JSON]
    ) -> CandidateState | None:
        """The candidate after its append: what we decided, folded at the positions it got."""
        state = current
        for event, payload in zip(stored, payloads, strict=True):
            state = apply_candidate(
                state, event.type, payload, seq=event.seq, stream_id=event.stream_id, version=event.version
            )
        if state is not None:
            self._candidates[stored[0].stream_id] = state
        return state

    def _log_appended(self, events: Sequence[StoredEvent], candidate: CandidateState | None) -> None:
        for e in events:
            log.info("event_appended", seq=e.seq, stream_id=e.stream_id, type=e.type, actor=e.actor)
        if candidate is not None and events:
            log.info(
                "decision_recorded",
                candidate_id=candidate.candidate_id,
                state=candidate.state,
                reason_codes=list(candidate.reason_codes),
                seq=events[-1].seq,
            )

    # --- ledger settings ---------------------------------------------------------

    def _settings_command(
        self,
        decide: Callable[[LedgerSettings], list[Event]],
        invalidates: Callable[[LedgerSettings, LedgerSettings], EvidenceInvalidated | None],
        kinds: Sequence[str] | None,
        event_id: str | None,
    ) -> CommandResult:
        for attempt in range(_RETRIES):
            settings = self.settings()
            events = decide(settings)
            if not events:
                return CommandResult((), settings=settings)
            new_settings = settings
            for e in events:
                new_settings = apply_settings(new_settings, e.TYPE, e.to_payload(), -1)
            invalidation = invalidates(settings, new_settings)
            try:
                with self.store.transaction() as tx:
                    if not settings.initialized:
                        defaults = LedgerInitialized(DEFAULT_MAX_WINDOW_AGE, DEFAULT_ACTIVE_WINDOW)
                        events = [defaults, *events] if events[0].TYPE != LedgerInitialized.TYPE else events
                    stored = list(
                        tx.append(
                            LEDGER_STREAM,
                            settings.version,
                            [self._new(e, e.to_payload(), LEDGER_STREAM, event_id, i) for i, e in enumerate(events)],
                        ).events
                    )
                    invalidated = self._invalidate(tx, invalidation, kinds) if invalidation else []
                    stored.extend(ev for _, evs in invalidated for ev in evs)
            except ConcurrencyError:
                if attempt == _RETRIES - 1:
                    raise
                continue
            self._log_appended(stored, None)
            return CommandResult(
                tuple(stored), settings=self.settings(), invalidated=tuple(cid for cid, _ in invalidated)
            )
        raise AssertionError("unreachable")  # pragma: no cover

    def _invalidate(
        self, tx: StoreTransaction, event: EvidenceInvalidated, kinds: Sequence[str] | None
    ) -> list[tuple[str, tuple[StoredEvent, ...]]]:
        """Append one EvidenceInvalidated per decided candidate, inside the setting's transaction."""
        done = []
        for head in tx.streams(statuses=_DECIDED):
            candidate_id = candidate_id_of(head.stream_id)
            if candidate_id is None or (kinds is not None and head.category not in kinds):
                continue
            new = self._new(event, event.to_payload(), head.stream_id, None, 0)
            done.append((candidate_id, tx.append(head.stream_id, head.version, [new], status="received").events))
        return done

    def init(
        self, max_window_age: int = DEFAULT_MAX_WINDOW_AGE, active_window: int = DEFAULT_ACTIVE_WINDOW
    ) -> CommandResult:
        """Fix the freshness settings; re-running with the same values is a no-op."""
        for name, value in (("max window age", max_window_age), ("active window", active_window)):
            if not isinstance(value, int) or isinstance(value, bool) or value < 0:
                raise InputError(f"{name} must be a non-negative integer, not {value!r}")

        def decide(settings: LedgerSettings) -> list[Event]:
            if not settings.initialized:
                return [LedgerInitialized(max_window_age, active_window)]
            if (settings.max_window_age, settings.active_window) == (max_window_age, active_window):
                return []
            raise ConflictError(
                f"ledger already initialized (max window age {settings.max_window_age}, active window "
                f"{settings.active_window}); use `window N` to advance the window"
            )

        return self._settings_command(decide, lambda old, new: None, None, None)

    def activate_baseline(self, manifest_path: str | os.PathLike[str], *, event_id: str | None = None) -> CommandResult:
        """Make an SFT baseline active; decided candidates must be checked again."""
        manifest = load_baseline_manifest(manifest_path)
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
        )

        def decide(settings: LedgerSettings) -> list[Event]:
            old = settings.baseline
            if old is not None and (old["policy_version"], old["adapter_path"]) == (
                event.policy_version,
                event.adapter_path,
            ):
                return []
            return [attrs.evolve(event, previous_policy_version=settings.active_policy_version)]

        def invalidates(old: LedgerSettings, new: LedgerSettings) -> EvidenceInvalidated | None:
            if old.active_policy_version == new.active_policy_version:
                return None
            return EvidenceInvalidated("baseline", old.active_policy_version, new.active_policy_version)

        return self._settings_command(decide, invalidates, None, event_id)

    def advance_window(self, active_window: int, *, event_id: str | None = None) -> CommandResult:
        """Move the active rollout window forward; online candidates' evidence ages."""
        if not isinstance(active_window, int) or isinstance(active_window, bool) or active_window < 0:
            raise InputError(f"window must be a non-negative integer, not {active_window!r}")

        def decide(settings: LedgerSettings) -> list[Event]:
            current = settings.active_window if settings.initialized else DEFAULT_ACTIVE_WINDOW
            assert current is not None
            if active_window == current:
                return []
            if active_window < current:
                raise InputError(f"the window only advances: it is {current}, not going back to {active_window}")
            return [WindowAdvanced(active_window, current)]

        def invalidates(old: LedgerSettings, new: LedgerSettings) -> EvidenceInvalidated:
            return EvidenceInvalidated("window", old.active_window or DEFAULT_ACTIVE_WINDOW, new.active_window)

        return self._settings_command(decide, invalidates, ONLINE_KINDS, event_id)

    def activate_evaluation(self, evaluation_version: str, *, event_id: str | None = None) -> CommandResult:
        """Require candidates to name this evaluation version from now on."""
        if not isinstance(evaluation_version, str) or not evaluation_version.strip():
            raise InputError("evaluation version must be a non-empty string")

        def decide(settings: LedgerSettings) -> list[Event]:
            if settings.evaluation_version == evaluation_version:
                return []
            return [EvaluationActivated(evaluation_version, settings.evaluation_version)]

        def invalidates(old: LedgerSettings, new: LedgerSettings) -> EvidenceInvalidated:
            return EvidenceInvalidated("evaluation", old.evaluation_version, new.evaluation_version)

        return self._settings_command(decide, invalidates, None, event_id)

    # --- candidate commands ------------------------------------------------------

    def receive(
        self, manifest_path: str | os.PathLike[str], *, candidate_id: str | None = None, event_id: str | None = None
    ) -> CommandResult:
        """Receive a candidate manifest; identical re-receipt is a no-op, `tune` may be revised."""
        manifest = load_candidate_manifest(manifest_path)
        cid = candidate_id if candidate_id is not None else _default_id(manifest.fields, manifest_path)
        if not cid.strip() or any(ch in cid for ch in "\n\r\t\0"):
            raise InputError(f"candidate id {cid!r} is empty or contains control characters")
        stream_id = stream_of(cid)
        replayed = self._replayed(event_id, stream_id, CandidateReceived.TYPE, {"candidate": manifest.fields})
        if replayed is not None:
            return replayed
        for attempt in range(_RETRIES):
            current = self._current(stream_id)
            identical = (
                current is not None
                and current.manifest_sha256 == manifest.sha256
                and canonical_json(current.candidate) == canonical_json(manifest.fields)
            )
            if identical:  # the same file at the same place: a retry after a lost acknowledgement
                return CommandResult((), candidate=current)
            if current is not None and not MACHINE.get_transitions("revise", source=current.state):
                raise IllegalCommandError(
                    f"candidate {cid!r} already exists in state {current.state} with a different manifest; "
                    "only a candidate in tune can be revised",
                    state=current.state,
                    trigger="revise",
                )
            revision = 0 if current is None else current.revision + 1
            event = CandidateReceived(cid, revision, manifest.path, manifest.sha256, manifest.fields)
            payload = event.to_payload()
            kind = manifest.fields.get("candidate_kind")
            try:
                result = self.store.append(
                    stream_id,
                    0 if current is None else current.version,
                    [self._new(event, payload, stream_id, event_id, 0)],
                    status="received",
                    category=kind if isinstance(kind, str) else None,
                    fresh_ids=event_id is None,
                )
            except ConcurrencyError:
                if attempt == _RETRIES - 1:
                    raise
                continue
            if result.duplicate:
                final = self._current(stream_id)
            else:
                final = self._fold_new(current, result.events, [payload])
            self._log_appended(result.events, final)
            return CommandResult(result.events, candidate=final, duplicate=result.duplicate)
        raise AssertionError("unreachable")  # pragma: no cover

    def check(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """Run every check now: verified (or unchanged on a re-check) or reject."""

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            require_baseline(settings)
            evidence = gather_checks(current.candidate, settings, root=self.artifact_root)
            return [ChecksRecorded(**evidence)]

        return self._candidate_command(
            candidate_id, "fail_checks", decide, event_id=event_id, first_type=ChecksRecorded.TYPE
        )

    def record_trusted_state(
        self, candidate_id: str, kind: str, path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> CommandResult:
        """Record a state a stage saved, hashed on disk now, for recovery to resume from."""
        require_kind(kind)
        absolute = os.path.abspath(path)
        if not os.path.lexists(absolute):
            raise InputError(f"no such trusted-state path: {absolute}")

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            # Hashed here, after the move was found legal: a refused command reads nothing.
            return [TrustedStateRecorded(kind, absolute, hash_directory(absolute))]

        return self._candidate_command(
            candidate_id, "record_trusted_state", decide, event_id=event_id,
            first_type=TrustedStateRecorded.TYPE, reads_settings=False, inputs={"kind": kind, "path": absolute},
        )  # fmt: skip

    def invalidate_trusted_state(
        self, candidate_id: str, kind: str, reason: str = "invalidated by operator", *, event_id: str | None = None
    ) -> CommandResult:
        """Stop trusting a recorded state (it stays in history)."""
        require_kind(kind)

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            if kind not in current.trusted_states:
                raise ConflictError(f"candidate {candidate_id!r} has no trusted {kind} recorded")
            return [TrustedStateInvalidated(kind, reason)]

        return self._candidate_command(
            candidate_id, "invalidate_trusted_state", decide, event_id=event_id,
            first_type=TrustedStateInvalidated.TYPE, reads_settings=False, inputs={"kind": kind},
        )  # fmt: skip

    def fail_stage(self, candidate_id: str, stage: str, *, event_id: str | None = None) -> CommandResult:
        """A stage failed: plan recovery from the nearest trusted state the log proves intact."""
        if stage not in STAGES:
            raise InputError(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})")

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            evidence = trusted_state_evidence(current, settings, stage, self.artifact_root)
            available = {kind: bool(e["available"]) for kind, e in evidence.items()}
            plan = choose_recovery_action({"stage": stage, "available": available})
            blocking = plan["action"] in BLOCKING_ACTIONS
            return [StageFailed(stage), RecoveryPlanned(**plan, blocking=blocking, trusted_states=evidence)]

        return self._candidate_command(
            candidate_id, "fail_stage", decide, event_id=event_id, first_type=StageFailed.TYPE, inputs={"stage": stage}
        )

    def complete_recovery(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """The planned recovery is done; the candidate goes back to be checked again."""

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            plan = current.last_recovery or {}
            return [RecoveryCompleted(str(plan.get("stage")), str(plan.get("action")))]

        return self._candidate_command(
            candidate_id, "complete_recovery", decide, event_id=event_id,
            first_type=RecoveryCompleted.TYPE, reads_settings=False,
        )  # fmt: skip

    def hand_off(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """Re-run the checks now and decide: ready (for evaluation), tune or reject."""

        def decide(current: CandidateState, settings: LedgerSettings) -> list[Event]:
            require_baseline(settings)
            evidence = gather_checks(current.candidate, settings, root=self.artifact_root)
            decision, reasons = handoff_reason_codes(evidence, current.candidate.get("decision"))
            return [
                HandoffDecided(
                    handoff_status=decision["handoff_status"],
                    upstream_decision=decision["upstream_decision"],
                    hard_failures=decision["hard_failures"],
                    reason_codes=reasons,
                    freshness=evidence["freshness"],
                    artifact=evidence["artifact"],
                    rollback=evidence["rollback"],
                    settings=evidence["settings"],
                )
            ]

        return self._candidate_command(
            candidate_id, "hand_off_ready", decide, event_id=event_id, first_type=HandoffDecided.TYPE
        )
