"""The drill steps: one attrs class per step, naming its key in the file, listing its keys, types and
defaults; `loader.py` reads the class variables (names, shorthands, references)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar, Literal

import attrs

from lifecycle_fsm.limits import MAX_INT64
from lifecycle_fsm.replay.drills.convert import NULLABLE
from lifecycle_fsm.replay.drills.schema import ManifestField, between

ACTIONS: dict[str, type[Action]] = {}


def refers(kind: str) -> Any:
    """A field naming a declared artifact of `kind` (baseline, candidate, adapter or any)."""
    return attrs.field(metadata={"refers": kind})


@attrs.frozen(kw_only=True)
class Action:
    """One kind of step: `name` is its key in the file and `alias` the CLI command's name, accepted
    too; `shorthand` is the key a scalar fills (`check: dpo-v5` means `check: {candidate: dpo-v5}`);
    `command` marks `Ledger.<name>` commands, the only steps that may carry `refused:` or run inside
    `crash` and `concurrently`; `needs_store` marks the faults that reach the ledger's rows or run other writers."""

    name: ClassVar[str]
    alias: ClassVar[str | None] = None
    shorthand: ClassVar[str | None] = None
    command: ClassVar[bool] = False
    needs_store: ClassVar[bool] = False

    def __init_subclass__(cls) -> None:
        """Every step class is in `ACTIONS`, in the order declared here (the order messages list them);
        attrs' slotted copy of a class replaces the original under the same name."""
        ACTIONS[cls.name] = cls


@attrs.frozen(kw_only=True)
class ActivateBaseline(Action):
    name, alias, shorthand, command = "activate_baseline", "baseline activate", "artifact", True
    artifact: str = refers("baseline")


@attrs.frozen(kw_only=True)
class Receive(Action):
    name, shorthand, command = "receive", "artifact", True
    artifact: str = refers("candidate")
    id: str | None = None  # a revision under another artifact


@attrs.frozen(kw_only=True)
class Register(Action):
    name, command = "register", True
    candidate: str
    kind: str


@attrs.frozen(kw_only=True)
class Check(Action):
    name, shorthand, command = "check", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class RecordTrustedState(Action):
    name, alias, command = "record_trusted_state", "trusted", True
    candidate: str
    kind: str
    artifact: str = refers("any")  # its folder


@attrs.frozen(kw_only=True)
class InvalidateTrustedState(Action):
    name, alias, command = "invalidate_trusted_state", "untrust", True
    candidate: str
    kind: str
    reason: str = "invalidated by drill"


@attrs.frozen(kw_only=True)
class FailStage(Action):
    name, alias, command = "fail_stage", "fail", True
    candidate: str
    stage: str


@attrs.frozen(kw_only=True)
class CompleteRecovery(Action):
    name, alias, shorthand, command = "complete_recovery", "recovered", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class HandOff(Action):
    name, alias, shorthand, command = "hand_off", "handoff", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class AdvanceWindow(Action):
    name, alias, shorthand, command = "advance_window", "window", "window", True
    window: int  # the ledger judges the window, not the loader


@attrs.frozen(kw_only=True)
class ActivateEvaluation(Action):
    name, alias, shorthand, command = "activate_evaluation", "evaluation activate", "version", True
    version: str


@attrs.frozen(kw_only=True)
class Checkpoint(Action):
    name = "checkpoint"


@attrs.frozen(kw_only=True)
class Replay(Action):
    name = "replay"
    to: int | None = None


@attrs.frozen(kw_only=True)
class RecoveryExpectation:
    """The parts of a candidate's last recovery plan an `expect` step compares."""

    stage: str | None = None
    recovery_state: str | None = attrs.field(default=None, metadata=NULLABLE)
    reused_state: bool | None = None
    action: str | None = None


@attrs.frozen(kw_only=True)
class ExplainExpectation:
    """What `expect: {explain: …}` compares with `lifecycle explain ID --json`."""

    seq: int | None = None  # the decisive event's
    type: str | None = None
    reason_codes: list[str] | None = None
    evidence: Mapping[str, Any] | None = None  # dotted paths into the explain document -> value


@attrs.frozen(kw_only=True)
class Expect(Action):
    """Outcomes to compare; which keys were given (and in what order) is `Step.args`."""

    name = "expect"
    candidate: str | None = None
    state: str | None = None
    reason_codes: list[str] | None = None
    recovery: RecoveryExpectation | None = None
    handoff: str | None = attrs.field(default=None, metadata=NULLABLE)
    hard_failures: list[str] | None = None
    trusted_states: list[str] | None = None
    events: Any = None  # a count, "+N" (appended by the step before) or "unchanged"
    explain: ExplainExpectation | None = None
    as_of: int | None = attrs.field(default=None, validator=attrs.validators.optional(between(0, MAX_INT64)))
    audit_handoff: str | None = None
    chain_valid: bool | None = None
    verify_ok: bool | None = None
    bad_seq: int | None = None


@attrs.frozen(kw_only=True)
class Audit(Action):
    name = "audit"
    baseline: str = refers("baseline")
    candidates: tuple[str, ...] = refers("candidate")
    label: str = "drill"


@attrs.frozen(kw_only=True)
class CrashDuringAppend(Action):
    name, needs_store = "crash_during_append", True
    candidate: str
    stage: str = "sampling"
    commands: int = attrs.field(default=3, validator=between(1, 50))


@attrs.frozen(kw_only=True)
class CorruptCheckpoint(Action):
    name, needs_store = "corrupt_checkpoint", True


@attrs.frozen(kw_only=True)
class TamperEvent(Action):
    name, needs_store = "tamper_event", True
    seq: int | None = None  # default: chosen by the seed


@attrs.frozen(kw_only=True)
class TamperArtifact(Action):
    name, shorthand = "tamper_artifact", "artifact"
    artifact: str = refers("any")


@attrs.frozen(kw_only=True)
class DeleteArtifact(Action):
    name, shorthand = "delete_artifact", "artifact"
    artifact: str = refers("any")


@attrs.frozen(kw_only=True)
class RestoreArtifact(Action):
    name, shorthand = "restore_artifact", "artifact"
    artifact: str = refers("any")


@attrs.frozen(kw_only=True)
class EditManifest(Action):
    name = "edit_manifest"
    artifact: str = refers("adapter")
    set: Mapping[ManifestField, Any] = attrs.Factory(dict)
    drop: tuple[ManifestField, ...] = ()


@attrs.frozen(kw_only=True)
class Crash(Action):
    name, needs_store = "crash", True
    at: Literal["before_commit", "after_commit"]
    commit: int = attrs.field(default=1, validator=between(1, 50))
    run: Any  # one command step (a mapping), parsed into `Step.inner`


@attrs.frozen(kw_only=True)
class Concurrently(Action):
    name, needs_store = "concurrently", True
    writers: Any  # a list of command steps, parsed into `Step.inner`
    mode: Literal["processes", "threads"] = "processes"
    repeat: int = attrs.field(default=1, validator=between(1, 100))


NAMES: dict[str, str] = {word: cls.name for cls in ACTIONS.values() for word in (cls.name, cls.alias) if word}
COMMAND_ACTIONS = tuple(name for name, cls in ACTIONS.items() if cls.command)
# `expect` keys about one candidate (they need `candidate:`).
CANDIDATE_EXPECTATIONS = tuple(
    ["state", "reason_codes", "recovery", "handoff", "hard_failures", "trusted_states", "explain", "as_of"]
)
DAMAGE = ("tamper_artifact", "delete_artifact", "restore_artifact")  # the faults an artifact can be restored from
PLAN_KEYS = ("action", "recovery_state", "reused_state")  # what a recovery plan reports and the simulator compares
