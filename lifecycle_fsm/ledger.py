"""The Ledger: the embedding API a training supervisor imports.

Each command validates its input, says which streams it depends on, gathers its
evidence (hashing happens here, before any lock) and lets a pure function in
`decisions.py` choose the events; `command_path.py` folds, asserts every version it
read, appends and re-decides on a lost race. Queries read the folds `streams.py`
keeps. One Ledger per process; many processes may share one ledger file.
"""

from __future__ import annotations

import datetime as dt
import getpass
import os
import socket
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm import decisions
from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.checks import gather_checks, trusted_state_evidence, verify_artifact
from lifecycle_fsm.command_path import CommandPath, CommandResult
from lifecycle_fsm.decisions import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE, Decision
from lifecycle_fsm.errors import ConflictError, InputError
from lifecycle_fsm.events import (
    LEDGER_STREAM,
    BaselineActivated,
    CandidateReceived,
    ChecksRecorded,
    EvaluationActivated,
    Event,
    HandoffDecided,
    LedgerInitialized,
    RecoveryCompleted,
    StageFailed,
    TrustedStateInvalidated,
    TrustedStateRecorded,
    WindowAdvanced,
    candidate_id_of,
    stream_of,
)
from lifecycle_fsm.manifests import load_baseline_manifest, load_candidate_manifest
from lifecycle_fsm.rules import STAGES, TRUSTED_STATE_KINDS
from lifecycle_fsm.state import CandidateState, LedgerSettings
from lifecycle_fsm.streams import StreamReader, fold_candidate, fold_settings
from lifecycle_fsm.upcasting import decoded_event
from store.base import EventStore
from store.records import StoredEvent

__all__ = [
    "DEFAULT_ACTIVE_WINDOW",
    "DEFAULT_MAX_WINDOW_AGE",
    "CommandResult",
    "Ledger",
    "fold_candidate",
    "fold_settings",
    "utc_now",
]

JSON = dict[str, Any]


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


def _non_negative(name: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InputError(f"{name} must be a non-negative integer, not {value!r}")
    return value


def _require_kind(kind: str) -> None:
    if kind not in TRUSTED_STATE_KINDS:
        raise InputError(f"unknown trusted-state kind {kind!r} (expected one of {', '.join(TRUSTED_STATE_KINDS)})")


def _require_baseline(settings: LedgerSettings) -> None:
    if settings.baseline is None:
        raise ConflictError("no active baseline: run `lifecycle baseline activate SFT_MANIFEST` first")


class Ledger:
    """The embedding API: one object per process, safe with many processes on one file."""

    def __init__(
        self,
        store: EventStore,
        *,
        actor: str | None = None,
        clock: Callable[[], str] = utc_now,
        artifact_root: str | os.PathLike[str] | None = None,
        new_id: Callable[[], str] | None = None,
    ) -> None:
        self.store = store
        self.actor = actor or _default_actor()
        self.artifact_root = None if artifact_root is None else os.path.abspath(artifact_root)
        self._reader = StreamReader(store)
        self._path = CommandPath(self._reader, actor=self.actor, clock=clock, new_id=new_id)

    @classmethod
    def open(cls, path: str | os.PathLike[str], *, synchronous: str = "FULL", **kwargs: Any) -> Ledger:
        """A ledger on a SQLite file or a `postgresql://` URL (created if missing)."""
        from store.open import open_store

        return cls(open_store(path, synchronous=synchronous), **kwargs)

    def close(self) -> None:
        self.store.close()

    def __enter__(self) -> Ledger:
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
        return [(e, decoded_event(e)) for e in events]

    def candidate_ids(self) -> list[str]:
        ids = (candidate_id_of(h.stream_id) for h in self.store.streams())
        return [i for i in ids if i is not None]

    # --- ledger settings ---------------------------------------------------------

    def init(
        self,
        max_window_age: int = DEFAULT_MAX_WINDOW_AGE,
        active_window: int = DEFAULT_ACTIVE_WINDOW,
        *,
        event_id: str | None = None,
    ) -> CommandResult:
        """Fix the freshness settings; re-running with the same values is a no-op."""
        _non_negative("max window age", max_window_age)
        _non_negative("active window", active_window)
        return self._path.run(
            LEDGER_STREAM, lambda _, settings: decisions.init(settings, max_window_age, active_window),
            command="init", event_id=event_id, first_type=LedgerInitialized.TYPE,
            inputs={"max_window_age": max_window_age, "active_window": active_window},
        )  # fmt: skip

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
            adapter_tree=actual["tree"],
        )
        return self._path.run(
            LEDGER_STREAM, lambda _, settings: decisions.activate_baseline(settings, event),
            command="baseline activate", event_id=event_id, first_type=BaselineActivated.TYPE,
            inputs={"policy_version": event.policy_version, "adapter_path": event.adapter_path},
        )  # fmt: skip

    def advance_window(self, active_window: int, *, event_id: str | None = None) -> CommandResult:
        """Move the active rollout window forward; online candidates' evidence ages."""
        _non_negative("window", active_window)
        return self._path.run(
            LEDGER_STREAM, lambda _, settings: decisions.advance_window(settings, active_window),
            command="window", event_id=event_id, first_type=WindowAdvanced.TYPE,
            inputs={"active_window": active_window},
        )  # fmt: skip

    def activate_evaluation(self, evaluation_version: str, *, event_id: str | None = None) -> CommandResult:
        """Require candidates to name this evaluation version from now on."""
        if not isinstance(evaluation_version, str) or not evaluation_version.strip():
            raise InputError("evaluation version must be a non-empty string")
        return self._path.run(
            LEDGER_STREAM, lambda _, settings: decisions.activate_evaluation(settings, evaluation_version),
            command="evaluation activate", event_id=event_id, first_type=EvaluationActivated.TYPE,
            inputs={"evaluation_version": evaluation_version},
        )  # fmt: skip

    # --- candidate commands ------------------------------------------------------

    def receive(
        self, manifest_path: str | os.PathLike[str], *, candidate_id: str | None = None, event_id: str | None = None
    ) -> CommandResult:
        """Receive a candidate manifest; identical re-receipt is a no-op, `tune` may be revised."""
        manifest = load_candidate_manifest(manifest_path)
        cid = candidate_id if candidate_id is not None else _default_id(manifest.fields, manifest_path)
        if not cid.strip() or any(ch in cid for ch in "\n\r\t\0"):
            raise InputError(f"candidate id {cid!r} is empty or contains control characters")

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            decision = decisions.receive(current, cid, manifest)
            if not decision.events:
                return decision
            # Hashed only for a new receipt (a retry reads nothing): what a later check is compared with.
            fields = manifest.fields
            at_receipt = verify_artifact(fields["adapter_resolved_path"], fields["adapter_sha256"], self.artifact_root)
            first = decision.events[0]
            assert isinstance(first, CandidateReceived)
            return attrs.evolve(decision, events=(attrs.evolve(first, artifact_at_receipt=at_receipt),))

        return self._path.run(
            stream_of(cid), decide,
            command="receive", event_id=event_id, reads_settings=False, first_type=CandidateReceived.TYPE,
            inputs={"candidate": manifest.fields},
        )  # fmt: skip

    def check(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """Run every check now: verified (or unchanged on a re-check) or reject."""

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            _require_baseline(settings)
            return decisions.check(gather_checks(current.candidate, settings, root=self.artifact_root))

        return self._path.run(
            stream_of(candidate_id), decide, command="check", event_id=event_id, first_type=ChecksRecorded.TYPE
        )

    def record_trusted_state(
        self, candidate_id: str, kind: str, path: str | os.PathLike[str], *, event_id: str | None = None
    ) -> CommandResult:
        """Record a state a stage saved, hashed on disk now, for recovery to resume from."""
        _require_kind(kind)
        absolute = os.path.abspath(path)
        if not os.path.lexists(absolute):
            raise InputError(f"no such trusted-state path: {absolute}")
        return self._path.run(
            stream_of(candidate_id),
            # Hashed only once the move was found legal: a refused command reads nothing.
            lambda current, _: decisions.record_trusted_state(kind, absolute, hash_directory(absolute)),
            command="trusted", event_id=event_id, reads_settings=False, first_type=TrustedStateRecorded.TYPE,
            inputs={"kind": kind, "path": absolute},
        )  # fmt: skip

    def invalidate_trusted_state(
        self, candidate_id: str, kind: str, reason: str = "invalidated by operator", *, event_id: str | None = None
    ) -> CommandResult:
        """Stop trusting a recorded state (it stays in history)."""
        _require_kind(kind)

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.invalidate_trusted_state(current, kind, reason)

        return self._path.run(
            stream_of(candidate_id), decide, command="untrust", event_id=event_id, reads_settings=False,
            first_type=TrustedStateInvalidated.TYPE, inputs={"kind": kind},
        )  # fmt: skip

    def fail_stage(self, candidate_id: str, stage: str, *, event_id: str | None = None) -> CommandResult:
        """A stage failed: plan recovery from the nearest trusted state the log proves intact."""
        if stage not in STAGES:
            raise InputError(f"unknown stage {stage!r} (expected one of {', '.join(STAGES)})")

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.fail_stage(stage, trusted_state_evidence(current, settings, stage, self.artifact_root))

        return self._path.run(
            stream_of(candidate_id), decide, command="fail", event_id=event_id, first_type=StageFailed.TYPE,
            inputs={"stage": stage},
        )  # fmt: skip

    def complete_recovery(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """The planned recovery is done; the candidate goes back to be checked again."""

        def decide(current: CandidateState | None, _: LedgerSettings) -> Decision:
            assert current is not None
            return decisions.complete_recovery(current)

        return self._path.run(
            stream_of(candidate_id), decide, command="recovered", event_id=event_id, reads_settings=False,
            first_type=RecoveryCompleted.TYPE,
        )  # fmt: skip

    def hand_off(self, candidate_id: str, *, event_id: str | None = None) -> CommandResult:
        """Re-run the checks now and decide: ready (for evaluation), tune or reject."""

        def decide(current: CandidateState | None, settings: LedgerSettings) -> Decision:
            assert current is not None
            _require_baseline(settings)
            return decisions.hand_off(current, gather_checks(current.candidate, settings, root=self.artifact_root))

        return self._path.run(
            stream_of(candidate_id), decide, command="handoff", event_id=event_id, first_type=HandoffDecided.TYPE
        )
