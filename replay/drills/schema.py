"""The drill scenario format, declared once: one attrs class per section and per step.

Each class lists the keys a file may give, their types and defaults; `convert.py`
structures YAML into them with a strict cattrs converter (no unknown keys, no loose
conversions) and `loader.py` adds what a type cannot say (references to declared
artifacts, which candidate an expectation is about). `scenarios/README.md` documents
the format for people; `tests/test_drills.py` proves every step is used by a shipped
scenario.

Field metadata: `NULLABLE` lets a key be given as null (otherwise an optional key may
be left out but not set to null); `FROM_KEY` marks a field filled from the mapping key
an object is declared under, never from the file's body.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal, get_args

import attrs

from lifecycle_fsm import errors as errors_module
from lifecycle_fsm.errors import InputError, LifecycleError
from lifecycle_fsm.limits import MAX_INT64, check_version_text
from lifecycle_fsm.replay.drills.action import Action, between, not_negative
from lifecycle_fsm.replay.drills.convert import FROM_KEY, NULLABLE, Problem, from_file
from lifecycle_fsm.replay.drills.steps import (
    Audit,
    Concurrently,
    Crash,
    EditManifest,
    ExplainExpectation,
    RestoreArtifact,
)

__all__ = [
    "ACTIONS",
    "Audit",
    "Concurrently",
    "Crash",
    "EditManifest",
    "ExplainExpectation",
    "RestoreArtifact",
    "Refusal",
    "ARTIFACT_TYPES",
    "CANDIDATE_EXPECTATIONS",
    "COMMAND_ACTIONS",
    "ERROR_CLASSES",
    "MANIFEST_FIELDS",
    "NAME",
    "RECOVERY_KEYS",
    "STEP_EXTRAS",
    "Action",
    "ActivateBaseline",
    "ActivateEvaluation",
    "AdvanceWindow",
    "ArtifactSpec",
    "Check",
    "Checkpoint",
    "CompleteRecovery",
    "CorruptCheckpoint",
    "CrashDuringAppend",
    "DeleteArtifact",
    "DrillConfig",
    "Expect",
    "FailStage",
    "HandOff",
    "InvalidateTrustedState",
    "Receive",
    "RecordTrustedState",
    "RecoveryExpectation",
    "Replay",
    "Scenario",
    "ScenarioFile",
    "Step",
    "StepExtras",
    "TamperArtifact",
    "TamperEvent",
]

ArtifactType = Literal["baseline", "dpo", "grpo", "rlvr", "trusted_state"]
# Manifest fields a scenario may override or drop (a typo would silently build the wrong manifest).
ManifestField = Literal[
    "adapter_sha256", "candidate_kind", "decision", "evaluation_version", "evidence_window_index",
    "policy_version", "preference_evidence_version", "semantic_id", "source_evidence",
    "source_policy_version", "trajectory_identity", "verifier_version",
]  # fmt: skip
ARTIFACT_TYPES: tuple[str, ...] = get_args(ArtifactType)
MANIFEST_FIELDS: tuple[str, ...] = get_args(ManifestField)
NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
ERROR_CLASSES: dict[str, type[LifecycleError]] = {
    name: cls
    for name in errors_module.__all__
    if isinstance(cls := getattr(errors_module, name), type) and issubclass(cls, LifecycleError)
}


def _scenario_name(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    if not NAME.match(value):
        raise Problem("a scenario name is letters, digits, '.', '_' or '-' (it names the kept ledger)", key="name")


# -- the file's sections ----------------------------------------------------------------------------------------


def _settings_int(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
    """What `init` takes: checked with the file, not when the ledger refuses it mid-run (a config is no step)."""
    if value > MAX_INT64:
        raise Problem(f"must be between 0 and {MAX_INT64}, not {value}", key=attribute.name)


def _version_text(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    try:
        check_version_text("evaluation version", value)
    except InputError as e:
        raise Problem(str(e), key=attribute.name) from None


@attrs.frozen(kw_only=True)
class ScenarioFile:
    """The top level of a file. `config`, `artifacts` and each step are structured on their own,
    so a problem inside one is reported at its place (`config`, `artifacts.sft`, `step 3`)."""

    name: str = attrs.field(validator=_scenario_name)
    description: str = ""
    seed: int
    config: Any = None  # a DrillConfig mapping (null: the defaults)
    artifacts: Any = None  # artifact name -> an ArtifactSpec mapping
    steps: Any  # a non-empty list of steps


@attrs.frozen(kw_only=True)
class DrillConfig:
    """How the fresh ledger is initialised before the first step."""

    max_window_age: int = attrs.field(default=2, validator=[not_negative, _settings_int])
    active_window: int = attrs.field(default=1, validator=[not_negative, _settings_int])
    evaluation_version: str | None = attrs.field(default=None, validator=attrs.validators.optional(_version_text))


@attrs.frozen(kw_only=True)
class ArtifactSpec:
    """An adapter (with its manifest) or a trusted-state folder the drill writes."""

    name: str = attrs.field(default="", metadata=FROM_KEY)
    type: ArtifactType
    manifest: Mapping[ManifestField, Any] = attrs.Factory(dict)
    drop: tuple[ManifestField, ...] = ()
    source: str | None = None  # the baseline whose adapter sha256 is the candidate's source policy
    size: int = attrs.field(default=4096, validator=between(1, 16 * 1024 * 1024, "must be between 1 and 16 MiB"))

    def __attrs_post_init__(self) -> None:
        if self.type == "trusted_state" and (self.manifest or self.drop):
            raise Problem("a trusted state has no manifest", key="manifest")


# -- steps ------------------------------------------------------------------------------------------------------


@attrs.frozen(kw_only=True)
class ActivateBaseline(Action):
    """`Ledger.activate_baseline` with a declared baseline's manifest."""

    name, shorthand, command = "activate_baseline", "artifact", True
    artifact: str


@attrs.frozen(kw_only=True)
class Receive(Action):
    """`Ledger.receive` with a declared candidate's manifest (`id`: a revision under another artifact)."""

    name, shorthand, command = "receive", "artifact", True
    artifact: str
    id: str | None = None


@attrs.frozen(kw_only=True)
class Check(Action):
    """`Ledger.check`."""

    name, shorthand, command = "check", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class RecordTrustedState(Action):
    """`Ledger.record_trusted_state` with a declared artifact's folder."""

    name, command = "record_trusted_state", True
    candidate: str
    kind: str
    artifact: str


@attrs.frozen(kw_only=True)
class InvalidateTrustedState(Action):
    """`Ledger.invalidate_trusted_state`."""

    name, command = "invalidate_trusted_state", True
    candidate: str
    kind: str
    reason: str = "invalidated by drill"


@attrs.frozen(kw_only=True)
class FailStage(Action):
    """`Ledger.fail_stage`: the plan comes from the log's trusted states."""

    name, command = "fail_stage", True
    candidate: str
    stage: str


@attrs.frozen(kw_only=True)
class CompleteRecovery(Action):
    """`Ledger.complete_recovery`."""

    name, shorthand, command = "complete_recovery", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class HandOff(Action):
    """`Ledger.hand_off`."""

    name, shorthand, command = "hand_off", "candidate", True
    candidate: str


@attrs.frozen(kw_only=True)
class AdvanceWindow(Action):
    """`Ledger.advance_window` (the window is the ledger's to judge, not the loader's)."""

    name, shorthand, command = "advance_window", "window", True
    window: int


@attrs.frozen(kw_only=True)
class ActivateEvaluation(Action):
    """`Ledger.activate_evaluation`."""

    name, shorthand, command = "activate_evaluation", "version", True
    version: str


@attrs.frozen(kw_only=True)
class Checkpoint(Action):
    """Take a checkpoint at the head."""

    name = "checkpoint"


@attrs.frozen(kw_only=True)
class Replay(Action):
    """Load (latest good checkpoint + tail) up to `to` and prove it equals a full replay."""

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
    as_of: int | None = attrs.field(default=None, validator=attrs.validators.optional(not_negative))
    audit_handoff: str | None = None
    chain_valid: bool | None = None
    verify_ok: bool | None = None
    bad_seq: int | None = None


@attrs.frozen(kw_only=True)
class CrashDuringAppend(Action):
    """A child process SIGKILLed inside its K-th `fail_stage` (K from the seed)."""

    name = "crash_during_append"
    candidate: str
    stage: str = "sampling"
    commands: int = attrs.field(default=3, validator=between(1, 50, "must be between 1 and 50"))


@attrs.frozen(kw_only=True)
class CorruptCheckpoint(Action):
    """Garble the latest checkpoint: the next load must skip it and say why."""

    name = "corrupt_checkpoint"


@attrs.frozen(kw_only=True)
class TamperEvent(Action):
    """Edit one event behind the triggers: `verify` must name its seq."""

    name = "tamper_event"
    seq: int | None = None  # default: chosen by the seed


@attrs.frozen(kw_only=True)
class TamperArtifact(Action):
    """Flip one byte of an artifact's weights or trusted-state file."""

    name, shorthand = "tamper_artifact", "artifact"
    artifact: str


@attrs.frozen(kw_only=True)
class DeleteArtifact(Action):
    """Remove an artifact's folder."""

    name, shorthand = "delete_artifact", "artifact"
    artifact: str


ACTIONS: dict[str, type[Action]] = {
    cls.name: cls
    for cls in (
        ActivateBaseline, Receive, Check, RecordTrustedState, InvalidateTrustedState, FailStage,
        CompleteRecovery, HandOff, AdvanceWindow, ActivateEvaluation, Checkpoint, Replay, Expect,
        CrashDuringAppend, CorruptCheckpoint, TamperEvent, TamperArtifact, DeleteArtifact,
        Crash, Concurrently, RestoreArtifact, EditManifest, Audit,
    )
}  # fmt: skip
COMMAND_ACTIONS = tuple(name for name, cls in ACTIONS.items() if cls.command)
# `expect` keys about one candidate (they need `candidate:`), and the recovery plan's keys.
CANDIDATE_EXPECTATIONS = (
    "state", "reason_codes", "recovery", "handoff", "hard_failures", "trusted_states", "explain", "as_of",
)  # fmt: skip
RECOVERY_KEYS = from_file(RecoveryExpectation)


@attrs.frozen(kw_only=True)
class StepExtras:
    """What a step may carry beside its one action."""

    refused: Any = None  # a class name or a Refusal mapping (loader.py)
    note: str | None = attrs.field(default=None, metadata=NULLABLE)


STEP_EXTRAS = from_file(StepExtras)


# -- what loading returns ---------------------------------------------------------------------------------------


@attrs.frozen
class Step:
    """One numbered step (1-based, as the file lists them): its action, typed and as given."""

    number: int
    action: str
    spec: Action
    args: Mapping[str, Any]  # the keys the file gave, in its order (what `expect` compares)
    refused: Refusal | None = None
    note: str | None = None
    inner: tuple[Step, ...] = ()  # the commands a `crash` or `concurrently` step runs


@attrs.frozen(kw_only=True)
class Refusal:
    """`refused:` — the exact error class (not a subclass) and, optionally, its message."""

    error: str = attrs.field(validator=lambda _i, _a, v: _error_class(v))
    message: str | None = None  # the whole message, temporary folder shown as <workspace>
    contains: str | None = None  # a part of it

    def describe(self) -> str:
        text = f"refused with {self.error}"
        if self.message is not None:
            text += f": {self.message}"
        elif self.contains is not None:
            text += f" (message containing {self.contains!r})"
        return text


def _error_class(value: str) -> None:
    if value not in ERROR_CLASSES:
        raise Problem(f"unknown error class {value!r} (expected one of {', '.join(ERROR_CLASSES)})", key="error")


@attrs.frozen
class Scenario:
    """A validated drill file."""

    path: Path
    name: str
    description: str
    seed: int
    config: DrillConfig
    artifacts: Mapping[str, ArtifactSpec]
    steps: tuple[Step, ...]
