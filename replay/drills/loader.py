"""Reading drill scenarios: YAML in, a validated `Scenario` out, or one `ScenarioError` line.

A scenario is validated completely before anything runs. An unknown step, an unknown
key, a value of the wrong type, a missing required key or a reference to an
undeclared artifact is a `ScenarioError` naming the file, the step number and the
key: a typo in an expectation must never be ignored, or the drill would pass
vacuously. Types and keys are declared in `schema.py` and enforced by `convert.py`;
this module walks the file's sections in order and checks what a type cannot say
(references between sections, which candidate an expectation is about).

Domain values (a stage, a trusted-state kind, a window) are *not* checked here:
refusing them is the ledger's job, and a drill may want to prove exactly that
(`refused:`). The format is documented in `scenarios/README.md`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm.errors import InputError, ScenarioError
from lifecycle_fsm.limits import MAX_SCENARIO_BYTES, read_regular_file
from lifecycle_fsm.rules import CANDIDATE_KINDS
from replay.drills.convert import Where, from_file, structure
from replay.drills.schema import (
    ACTIONS,
    CANDIDATE_EXPECTATIONS,
    COMMAND_ACTIONS,
    NAME,
    RECOVERY_KEYS,
    STEP_EXTRAS,
    ArtifactSpec,
    DrillConfig,
    Scenario,
    ScenarioFile,
    Step,
    StepExtras,
)

__all__ = ["find_scenarios", "load_scenario", "load_scenarios"]


MAX_SEED = 2**63 - 1  # seeds are reported in JSON, whose integers stop at 64 bits


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: `*name` is refused before anything is expanded ("billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a scenario", mark)
        return super().compose_node(parent, index)


def _read(path: Path) -> Any:
    try:
        data = read_regular_file(path, what="scenario file", limit=MAX_SCENARIO_BYTES)
    except InputError as e:
        raise ScenarioError(str(e)) from None
    try:
        return yaml.load(data.decode("utf-8"), Loader=_NoAliasLoader)  # a SafeLoader subclass
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: cannot read the scenario ({e})") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML (nested too deeply)") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def _artifacts(where: Where, raw: Any) -> dict[str, ArtifactSpec]:
    """Each artifact in file order: a candidate's `source` must be a baseline declared before it."""
    section = where.at("artifacts")
    declared = structure(section, raw if raw is not None else {}, dict[str, Any])
    artifacts: dict[str, ArtifactSpec] = {}
    for name, body in declared.items():
        here = where.at(f"artifacts.{name}")
        if not NAME.match(name):
            raise here.error(None, "an artifact name is letters, digits, '.', '_' or '-'")
        spec = attrs.evolve(structure(here, body if body is not None else {}, ArtifactSpec), name=name)
        baselines = [n for n, a in artifacts.items() if a.type == "baseline"]
        if spec.source is not None and spec.source not in baselines:
            raise here.error("source", f"no baseline artifact named {spec.source!r} declared before it")
        if (spec.type in CANDIDATE_KINDS and spec.source is None and not baselines
                and "source_policy_version" not in spec.manifest):  # fmt: skip
            raise here.error("source", "a candidate needs a baseline declared before it, or source_policy_version")
        artifacts[name] = spec
    return artifacts


def _step(where: Where, number: int, raw: Any, artifacts: Mapping[str, ArtifactSpec]) -> Step:
    here = where.at(f"step {number}")
    body = structure(here, raw, dict[str, Any])
    actions = [k for k in body if k not in STEP_EXTRAS]
    if not actions:
        raise here.error(None, f"no action (expected one of {', '.join(ACTIONS)})")
    for key in actions:
        if key not in ACTIONS:
            raise here.error(key, f"unknown step (expected one of {', '.join(ACTIONS)})")
    if len(actions) > 1:
        raise here.error(actions[1], f"a step has one action, this one has {', '.join(actions)}")
    action = actions[0]
    cls = ACTIONS[action]
    here = where.at(f"step {number} ({action})")
    value = body[action]
    if value is None:
        args: dict[str, Any] = {}
    elif isinstance(value, dict):
        args = value
    elif cls.shorthand is not None:
        args = {cls.shorthand: value}
    else:
        raise here.error(action, f"must be a mapping of {', '.join(from_file(cls)) or 'nothing'}, not {value!r}")
    spec = structure(here, args, cls)
    if body.get("refused") is not None and action not in COMMAND_ACTIONS:
        raise here.error("refused", f"only ledger commands can be refused ({', '.join(COMMAND_ACTIONS)})")
    extras = structure(here, {k: body[k] for k in STEP_EXTRAS if k in body}, StepExtras)
    _check_references(here, action, args, artifacts)
    if action == "expect":
        _check_expect(here, args)
    return Step(number, action, spec, args, extras.refused, extras.note)


def _check_references(here: Where, action: str, args: Mapping[str, Any], artifacts: Mapping[str, Any]) -> None:
    """An `artifact:` names one declared in the file, of the kind the step needs."""
    name = args.get("artifact")
    if name is None:
        return
    if name not in artifacts:
        raise here.error("artifact", f"no artifact named {name!r} (declared: {', '.join(artifacts) or 'none'})")
    kind = artifacts[name].type
    if action == "activate_baseline" and kind != "baseline":
        raise here.error("artifact", f"{name!r} is a {kind} artifact, not a baseline")
    if action == "receive" and kind not in CANDIDATE_KINDS:
        raise here.error("artifact", f"{name!r} is a {kind} artifact, not a candidate")


def _check_expect(here: Where, args: Mapping[str, Any]) -> None:
    """An expectation checks something, and says which candidate its candidate keys are about."""
    if not set(args) - {"candidate"}:
        raise here.error(None, "an expect step must check something")
    for key in CANDIDATE_EXPECTATIONS:
        if key in args and "candidate" not in args:
            raise here.error(key, "needs `candidate:` to say which candidate")
    if "recovery" in args and not args["recovery"]:
        raise here.error("recovery", "must name at least one of " + ", ".join(RECOVERY_KEYS))


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    p = Path(path)
    where = Where(p)
    top = structure(where, _read(p), ScenarioFile)
    if not 0 <= top.seed <= MAX_SEED:
        raise where.error("seed", f"must be between 0 and {MAX_SEED}, not {top.seed}")
    config_raw = top.config if top.config is not None else {}
    config = structure(where.at("config"), config_raw, DrillConfig)
    artifacts = _artifacts(where, top.artifacts)
    if not isinstance(top.steps, list) or not top.steps:
        raise where.error("steps", "must be a non-empty list of steps")
    steps = tuple(_step(where, i, s, artifacts) for i, s in enumerate(top.steps, start=1))
    return Scenario(p, top.name, top.description, top.seed, config, artifacts, steps)


def find_scenarios(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files: each file given, and the `*.yaml` directly inside each folder (sorted)."""
    found: list[Path] = []
    for raw in paths:
        p = Path(raw)
        if p.is_dir():
            found.extend(sorted(f for f in p.glob("*.yaml") if f.is_file()))
        elif p.exists():  # a FIFO or device too: `_read` refuses it with its own message
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
