"""Drill scenarios: YAML files that build a situation, inject faults and state outcomes.

A scenario is validated completely before anything runs. An unknown step, an unknown
key, a value of the wrong type or a reference to an undeclared artifact is a
`ScenarioError` naming the file, the step number and the key: a typo in an
expectation must never be ignored, or the drill would pass vacuously. Domain values
(a stage, a trusted-state kind, a window) are *not* checked here: refusing them is
the ledger's job, and a drill may want to prove exactly that (`refused:`).
The format is documented in `scenarios/README.md`.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm import errors as errors_module
from lifecycle_fsm.errors import LifecycleError, ScenarioError

__all__ = [
    "ACTIONS",
    "ARTIFACT_TYPES",
    "COMMAND_ACTIONS",
    "ERROR_CLASSES",
    "ArtifactSpec",
    "DrillConfig",
    "Scenario",
    "Step",
    "find_scenarios",
    "load_scenario",
    "load_scenarios",
]

ARTIFACT_TYPES = ("baseline", "dpo", "grpo", "rlvr", "trusted_state")
CANDIDATE_TYPES = ("dpo", "grpo", "rlvr")
# Manifest fields a scenario may override (a typo here would silently build the wrong manifest).
MANIFEST_FIELDS = (
    "adapter_sha256", "candidate_kind", "decision", "evaluation_version", "evidence_window_index",
    "policy_version", "preference_evidence_version", "semantic_id", "source_evidence",
    "source_policy_version", "trajectory_identity", "verifier_version",
)  # fmt: skip
NAME = re.compile(r"[A-Za-z0-9._-]+\Z")
ERROR_CLASSES: dict[str, type[LifecycleError]] = {
    name: cls
    for name in errors_module.__all__
    if isinstance(cls := getattr(errors_module, name), type) and issubclass(cls, LifecycleError)
}


@attrs.frozen
class _Field:
    """One key of a step: the accepted types, whether it is required, the type of list items."""

    kinds: tuple[type, ...]
    required: bool = False
    items: type | None = None


_STR, _OPT_STR, _NULLABLE_STR = _Field((str,), True), _Field((str,)), _Field((str, type(None)))
_INT, _OPT_INT, _OPT_BOOL = _Field((int,), True), _Field((int,)), _Field((bool,))
_STR_LIST, _MAPPING = _Field((list,), items=str), _Field((dict,))

# action -> (the key a scalar shorthand fills, e.g. `check: dpo-v5`, and every key it takes)
ACTIONS: dict[str, tuple[str | None, dict[str, _Field]]] = {
    "activate_baseline": ("artifact", {"artifact": _STR}),
    "receive": ("artifact", {"artifact": _STR, "id": _OPT_STR}),
    "check": ("candidate", {"candidate": _STR}),
    "record_trusted_state": (None, {"candidate": _STR, "kind": _STR, "artifact": _STR}),
    "invalidate_trusted_state": (None, {"candidate": _STR, "kind": _STR, "reason": _OPT_STR}),
    "fail_stage": (None, {"candidate": _STR, "stage": _STR}),
    "complete_recovery": ("candidate", {"candidate": _STR}),
    "hand_off": ("candidate", {"candidate": _STR}),
    "advance_window": ("window", {"window": _INT}),
    "activate_evaluation": ("version", {"version": _STR}),
    "checkpoint": (None, {}),
    "replay": (None, {"to": _OPT_INT}),
    "expect": (None, {
        "candidate": _OPT_STR, "state": _OPT_STR, "reason_codes": _STR_LIST, "recovery": _MAPPING,
        "handoff": _NULLABLE_STR, "hard_failures": _STR_LIST, "trusted_states": _STR_LIST,
        "events": _OPT_INT, "chain_valid": _OPT_BOOL, "verify_ok": _OPT_BOOL, "bad_seq": _OPT_INT,
    }),
    "crash_during_append": (None, {"candidate": _STR, "stage": _OPT_STR, "commands": _OPT_INT}),
    "corrupt_checkpoint": (None, {}),
    "tamper_event": (None, {"seq": _OPT_INT}),
    "tamper_artifact": ("artifact", {"artifact": _STR}),
    "delete_artifact": ("artifact", {"artifact": _STR}),
}  # fmt: skip
# The ledger commands: only these may carry `refused: ErrorClass`.
COMMAND_ACTIONS = (
    "activate_baseline", "receive", "check", "record_trusted_state", "invalidate_trusted_state",
    "fail_stage", "complete_recovery", "hand_off", "advance_window", "activate_evaluation",
)  # fmt: skip
CANDIDATE_EXPECTATIONS = ("state", "reason_codes", "recovery", "handoff", "hard_failures", "trusted_states")
LEDGER_EXPECTATIONS = ("events", "chain_valid", "verify_ok", "bad_seq")
RECOVERY_KEYS = {"stage": (str,), "recovery_state": (str, type(None)), "reused_state": (bool,), "action": (str,)}
STEP_EXTRAS = ("refused", "note")
TOP_LEVEL = ("name", "description", "seed", "config", "artifacts", "steps")
CONFIG_KEYS = {"max_window_age": (int,), "active_window": (int,), "evaluation_version": (str,)}
ARTIFACT_KEYS = ("type", "manifest", "drop", "source", "size")


@attrs.frozen
class DrillConfig:
    """How the fresh ledger is initialised before the first step."""

    max_window_age: int = 2
    active_window: int = 1
    evaluation_version: str | None = None


@attrs.frozen
class ArtifactSpec:
    """An adapter (with its manifest) or a trusted-state folder the drill writes."""

    name: str
    type: str
    manifest: Mapping[str, Any] = attrs.Factory(dict)
    drop: tuple[str, ...] = ()
    source: str | None = None  # the baseline whose adapter sha256 is the candidate's source policy
    size: int = 4096


@attrs.frozen
class Step:
    """One numbered step (1-based, as the file lists them) and its validated arguments."""

    number: int
    action: str
    args: Mapping[str, Any]
    refused: str | None = None
    note: str | None = None

    def text(self, key: str) -> str:
        return str(self.args[key])

    def optional(self, key: str) -> Any:
        return self.args.get(key)


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


def _is(value: Any, kinds: tuple[type, ...]) -> bool:
    """isinstance, except that a bool is not an int (YAML `true` is no window number)."""
    if isinstance(value, bool):
        return bool in kinds
    return isinstance(value, kinds)


def _type_names(kinds: tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", bool: "true or false", list: "a list", dict: "a mapping"}
    return " or ".join("null" if k is type(None) else names.get(k, k.__name__) for k in kinds)


class _Where:
    """Builds error messages that name the file, the place and the key."""

    def __init__(self, path: Path, place: str = "") -> None:
        self.path = path
        self.place = place

    def at(self, place: str) -> _Where:
        return _Where(self.path, place)

    def error(self, key: str | None, problem: str) -> ScenarioError:
        parts = [str(self.path)] + ([self.place] if self.place else []) + ([f"key {key!r}"] if key else [])
        return ScenarioError(f"{': '.join(parts)}: {problem}")

    def unknown(self, key: Any, allowed: Sequence[str]) -> ScenarioError:
        return self.error(str(key), f"unknown key (expected one of {', '.join(allowed)})")


def _mapping(where: _Where, key: str | None, value: Any) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise where.error(key, f"must be a mapping, not {type(value).__name__}")
    for k in value:
        if not isinstance(k, str):
            raise where.error(str(k), "keys must be strings")
    return value


def _typed(where: _Where, key: str, value: Any, kinds: tuple[type, ...]) -> Any:
    if not _is(value, kinds):
        raise where.error(key, f"must be {_type_names(kinds)}, not {value!r}")
    return value


def _step(where: _Where, number: int, raw: Any, artifacts: Mapping[str, ArtifactSpec]) -> Step:
    here = where.at(f"step {number}")
    body = _mapping(here, None, raw)
    actions = [k for k in body if k not in STEP_EXTRAS]
    if not actions:
        raise here.error(None, f"no action (expected one of {', '.join(ACTIONS)})")
    for key in actions:
        if key not in ACTIONS:
            raise here.error(key, f"unknown step (expected one of {', '.join(ACTIONS)})")
    if len(actions) > 1:
        raise here.error(actions[1], f"a step has one action, this one has {', '.join(actions)}")
    action = actions[0]
    here = where.at(f"step {number} ({action})")
    shorthand, fields = ACTIONS[action]
    value = body[action]
    if value is None:
        args: dict[str, Any] = {}
    elif isinstance(value, dict):
        args = _mapping(here, action, value)
    elif shorthand is not None:
        args = {shorthand: value}
    else:
        raise here.error(action, f"must be a mapping of {', '.join(fields) or 'nothing'}, not {value!r}")
    for key, val in args.items():
        if key not in fields:
            raise here.unknown(key, list(fields))
        spec = fields[key]
        _typed(here, key, val, spec.kinds)
        if spec.items is not None and not all(_is(v, (spec.items,)) for v in val):
            raise here.error(key, f"every item must be {_type_names((spec.items,))}")
    for key, spec in fields.items():
        if spec.required and key not in args:
            raise here.error(key, "is required")
    refused = body.get("refused")
    if refused is not None:
        if action not in COMMAND_ACTIONS:
            raise here.error("refused", f"only ledger commands can be refused ({', '.join(COMMAND_ACTIONS)})")
        if refused not in ERROR_CLASSES:
            raise here.error("refused", f"unknown error class {refused!r} (expected one of {', '.join(ERROR_CLASSES)})")
    note = body.get("note")
    if note is not None:
        _typed(here, "note", note, (str,))
    _check_step_semantics(here, action, args, artifacts)
    return Step(number, action, args, refused, note)


def _check_step_semantics(here: _Where, action: str, args: Mapping[str, Any], artifacts: Mapping[str, Any]) -> None:
    """References and combinations the type table cannot express."""
    name = args.get("artifact")
    if name is not None:
        if name not in artifacts:
            raise here.error("artifact", f"no artifact named {name!r} (declared: {', '.join(artifacts) or 'none'})")
        kind = artifacts[name].type
        if action == "activate_baseline" and kind != "baseline":
            raise here.error("artifact", f"{name!r} is a {kind} artifact, not a baseline")
        if action == "receive" and kind not in CANDIDATE_TYPES:
            raise here.error("artifact", f"{name!r} is a {kind} artifact, not a candidate")
    if action == "expect":
        if not set(args) - {"candidate"}:
            raise here.error(None, "an expect step must check something")
        for key in CANDIDATE_EXPECTATIONS:
            if key in args and "candidate" not in args:
                raise here.error(key, "needs `candidate:` to say which candidate")
        if "recovery" in args and not args["recovery"]:
            raise here.error("recovery", "must name at least one of " + ", ".join(RECOVERY_KEYS))
        for key, val in args.get("recovery", {}).items():
            if key not in RECOVERY_KEYS:
                raise here.at(f"{here.place}: recovery").unknown(key, list(RECOVERY_KEYS))
            _typed(here, f"recovery.{key}", val, RECOVERY_KEYS[key])
    if action == "crash_during_append" and not 1 <= args.get("commands", 3) <= 50:
        raise here.error("commands", "must be between 1 and 50")


def _artifact(where: _Where, name: str, raw: Any, baselines: Sequence[str]) -> ArtifactSpec:
    here = where.at(f"artifacts.{name}")
    if not NAME.match(name):
        raise here.error(None, "an artifact name is letters, digits, '.', '_' or '-'")
    body = _mapping(here, None, raw if raw is not None else {})
    for key in body:
        if key not in ARTIFACT_KEYS:
            raise here.unknown(key, ARTIFACT_KEYS)
    kind = body.get("type")
    if kind not in ARTIFACT_TYPES:
        raise here.error("type", f"must be one of {', '.join(ARTIFACT_TYPES)}, not {kind!r}")
    manifest = _mapping(here, "manifest", body.get("manifest", {}))
    drop = body.get("drop", [])
    if not isinstance(drop, list):
        raise here.error("drop", "must be a list of manifest fields")
    for key in [*manifest, *drop]:
        if key not in MANIFEST_FIELDS:
            raise here.at(f"{here.place}: manifest").unknown(key, MANIFEST_FIELDS)
    if kind == "trusted_state" and (manifest or drop):
        raise here.error("manifest", "a trusted state has no manifest")
    source = body.get("source")
    if source is not None and source not in baselines:
        raise here.error("source", f"no baseline artifact named {source!r} declared before it")
    if kind in CANDIDATE_TYPES and source is None and not baselines and "source_policy_version" not in manifest:
        raise here.error("source", "a candidate needs a baseline declared before it, or source_policy_version")
    size = _typed(here, "size", body.get("size", 4096), (int,))
    if not 1 <= size <= 16 * 1024 * 1024:
        raise here.error("size", "must be between 1 and 16 MiB")
    return ArtifactSpec(name, kind, dict(manifest), tuple(drop), source, size)


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    p = Path(path)
    where = _Where(p)
    try:
        raw = yaml.safe_load(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ScenarioError(f"{p}: no such scenario file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScenarioError(f"{p}: cannot read the scenario ({e})") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{p}: not valid YAML ({' '.join(str(e).split())})") from None
    top = _mapping(where, None, raw)
    for key in top:
        if key not in TOP_LEVEL:
            raise where.unknown(key, TOP_LEVEL)
    for key in ("name", "seed", "steps"):
        if key not in top:
            raise where.error(key, "is required")
    name = _typed(where, "name", top["name"], (str,))
    if not NAME.match(name):
        raise where.error("name", "a scenario name is letters, digits, '.', '_' or '-' (it names the kept ledger)")
    description = _typed(where, "description", top.get("description", ""), (str,))
    seed = _typed(where, "seed", top["seed"], (int,))
    config_raw = _mapping(where.at("config"), None, top.get("config") or {})
    for key, val in config_raw.items():
        if key not in CONFIG_KEYS:
            raise where.at("config").unknown(key, list(CONFIG_KEYS))
        _typed(where.at("config"), key, val, CONFIG_KEYS[key])
        if isinstance(val, int) and val < 0:
            raise where.at("config").error(key, "must not be negative")
    config = DrillConfig(**config_raw)
    artifacts: dict[str, ArtifactSpec] = {}
    for art_name, art in _mapping(where.at("artifacts"), None, top.get("artifacts") or {}).items():
        baselines = [n for n, a in artifacts.items() if a.type == "baseline"]
        artifacts[art_name] = _artifact(where, art_name, art, baselines)
    steps_raw = top["steps"]
    if not isinstance(steps_raw, list) or not steps_raw:
        raise where.error("steps", "must be a non-empty list of steps")
    steps = tuple(_step(where, i, s, artifacts) for i, s in enumerate(steps_raw, start=1))
    return Scenario(p, name, description, seed, config, artifacts, steps)


def find_scenarios(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files: each file given, and the `*.yaml` directly inside each folder (sorted)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(f for f in p.glob("*.yaml") if f.is_file()))
        elif p.is_file():
            found.append(p)
        else:
            raise ScenarioError(f"{p}: no such scenario file or folder")
    if not found:
        raise ScenarioError(f"no scenario files (*.yaml) in {', '.join(str(p) for p in paths)}")
    return found


def load_scenarios(paths: Sequence[str | Path]) -> list[Scenario]:
    """Find and validate every scenario before any runs; names must be unique (they name kept ledgers)."""
    scenarios = [load_scenario(p) for p in find_scenarios(paths)]
    seen: dict[str, Path] = {}
    for s in scenarios:
        if s.name in seen:
            raise ScenarioError(f"{s.path}: key 'name': {s.name!r} is also the name of {seen[s.name]}")
        seen[s.name] = s.path
    return scenarios
