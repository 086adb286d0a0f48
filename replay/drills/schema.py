"""The drill scenario format: the file's sections, `refused:`, and what loading returns (steps are in
`steps.py`; `scenarios/README.md` documents the format for people)."""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

import attrs

from lifecycle_fsm import errors as errors_module
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.limits import MAX_INT64, check_version_text
from lifecycle_fsm.replay.drills.convert import NULLABLE, Problem, from_file, unknown

if TYPE_CHECKING:
    from lifecycle_fsm.replay.drills.steps import Action

ArtifactType = Literal["baseline", "dpo", "grpo", "rlvr", "trusted_state"]
# Manifest fields a scenario may override or drop (a typo would silently build the wrong manifest).
ManifestField = Literal[
    "adapter_sha256",
    "candidate_kind",
    "decision",
    "evaluation_version",
    "evidence_window_index",
    "policy_version",
    "preference_evidence_version",
    "semantic_id",
    "source_evidence",
    "source_policy_version",
    "trajectory_identity",
    "verifier_version",
]
NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
# The project's error classes, and the builtin ones they also are (an InputError is a ValueError, ...).
ERROR_CLASSES: dict[str, type[Exception]] = {
    **{cls.__name__: cls for cls in (ValueError, LookupError, RuntimeError, OSError, TimeoutError)},
    **{
        name: cls
        for name in errors_module.__all__
        if isinstance(cls := getattr(errors_module, name), type) and issubclass(cls, Exception)
    },
}


def between(low: int, high: int, shown: str | None = None) -> Any:
    """A validator: the integer is within [low, high] (`shown`: how to write `high`)."""

    def check(_instance: Any, attribute: attrs.Attribute[int], value: int) -> None:
        if not low <= value <= high:
            raise Problem(f"must be between {low} and {shown or high}, not {value}", key=attribute.name)

    return check


def _version_text(_instance: Any, attribute: attrs.Attribute[str], value: str) -> None:
    try:
        check_version_text("evaluation version", value)
    except InputError as e:
        raise Problem(str(e), key=attribute.name) from None


def _scenario_name(_instance: Any, _attribute: attrs.Attribute[str], value: str) -> None:
    if not NAME.match(value):
        raise Problem("a scenario name is letters, digits, '.', '_' or '-' (it names the kept ledger)", key="name")


# `config`, `artifacts` and each step are structured on their own: a problem is reported at its place.


@attrs.frozen(kw_only=True)
class ScenarioFile:
    name: str = attrs.field(validator=_scenario_name)
    description: str = ""
    seed: int = attrs.field(validator=between(0, MAX_INT64))
    config: Any = None  # a DrillConfig mapping (null: the defaults)
    artifacts: Any = None  # artifact name -> an ArtifactSpec mapping
    steps: Any  # a non-empty list of steps


@attrs.frozen(kw_only=True)
class DrillConfig:
    """How the fresh ledger is initialised before the first step."""

    max_window_age: int = attrs.field(default=2, validator=between(0, MAX_INT64))
    active_window: int = attrs.field(default=1, validator=between(0, MAX_INT64))
    evaluation_version: str | None = attrs.field(default=None, validator=attrs.validators.optional(_version_text))


@attrs.frozen(kw_only=True)
class ArtifactSpec:
    """An adapter (with its manifest) or a trusted-state folder the drill writes."""

    type: ArtifactType
    manifest: Mapping[ManifestField, Any] = attrs.Factory(dict)
    drop: tuple[ManifestField, ...] = ()
    source: str | None = None  # the baseline whose adapter sha256 is the candidate's source policy
    size: int = attrs.field(default=4096, validator=between(1, 16 * 1024 * 1024, "16 MiB"))

    def __attrs_post_init__(self) -> None:
        if self.type == "trusted_state" and (self.manifest or self.drop):
            raise Problem("a trusted state has no manifest", key="manifest")


def unknown_error(value: str) -> str | None:
    """Why `value` names no error class `refused:` can match, or None."""
    return None if value in ERROR_CLASSES else unknown(value, f"error class {value!r}", ERROR_CLASSES)


def _error_class(_instance: Any, _attribute: attrs.Attribute[str], value: str) -> None:
    if (problem := unknown_error(value)) is not None:
        raise Problem(problem, key="error")


@attrs.frozen(kw_only=True)
class Refusal:
    """`refused:` — the error class (or a subclass, unless `exact`), its message, and on a `concurrently`
    step how many of the writers' commands are refused (the others must succeed)."""

    error: str = attrs.field(validator=_error_class)
    exact: bool = False
    message: str | None = None  # the whole message, temporary folder shown as <workspace>
    contains: str | None = None  # a part of it
    count: int | None = attrs.field(default=None, validator=attrs.validators.optional(between(1, 3200)))

    def __attrs_post_init__(self) -> None:
        if self.message is not None and self.contains is not None:
            raise Problem("give `message` (the whole text) or `contains` (a part), not both", key="contains")

    def accepts(self, classes: list[str], message: str) -> bool:
        """Whether an error (its class's names, most derived first, and its message) is this refusal."""
        if (classes[0] != self.error) if self.exact else (self.error not in classes):
            return False
        return (self.message is None or message == self.message) and (self.contains is None or self.contains in message)

    def describe(self) -> str:
        text = f"refused with {self.error}{' exactly' if self.exact else ''}"
        if self.message is not None:
            return f"{text}: {self.message}"
        return text if self.contains is None else f"{text} (message containing {self.contains!r})"


@attrs.frozen(kw_only=True)
class StepExtras:
    """What a step may carry beside its one action."""

    refused: Any = None  # a class name or a Refusal mapping
    note: str | None = attrs.field(default=None, metadata=NULLABLE)


STEP_EXTRAS = from_file(StepExtras)


@attrs.frozen
class Step:
    """One numbered step (1-based, as the file lists them): its action, typed and as given."""

    number: int
    action: str  # the step's name
    word: str  # what the file called it (the name or the CLI's): every message uses it
    spec: Action
    args: Mapping[str, Any]  # the keys the file gave, in its order (what `expect` compares)
    refused: Refusal | None = None
    note: str | None = None
    inner: tuple[Step, ...] = ()  # the commands a `crash` or `concurrently` step runs


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
