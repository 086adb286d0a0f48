"""Reading drill scenarios: YAML in, a validated `Scenario` out, or one `ScenarioError` line.

A scenario is validated completely before anything runs. An unknown step, an unknown
key, a value of the wrong type, a missing required key or a reference to an
undeclared artifact is a `ScenarioError` naming the file, the step number and the
key: a typo in an expectation must never be ignored, or the drill would pass
vacuously. Types and keys are declared in `schema.py` and enforced by `convert.py`;
this module walks the file's sections in order and checks what a type cannot say
(references between sections, which candidate an expectation is about).

Types are checked here (`advance_window: two` is not an integer); domain values
within a type (an unknown stage or trusted-state kind, a negative window) are *not*:
refusing them is the ledger's job, and a drill may want to prove exactly that
(`refused:`). The format is documented in `scenarios/README.md`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm.errors import InputError, ScenarioError
from lifecycle_fsm.limits import MAX_SCENARIO_BYTES, read_regular_file
from lifecycle_fsm.replay.drills.convert import Where, from_file, structure
from lifecycle_fsm.replay.drills.schema import (
    ACTIONS,
    CANDIDATE_EXPECTATIONS,
    COMMAND_ACTIONS,
    ERROR_CLASSES,
    MANIFEST_FIELDS,
    NAME,
    RECOVERY_KEYS,
    STEP_EXTRAS,
    ArtifactSpec,
    DrillConfig,
    Refusal,
    Scenario,
    ScenarioFile,
    Step,
    StepExtras,
)
from lifecycle_fsm.rules import CANDIDATE_KINDS

__all__ = ["find_scenarios", "load_scenario", "load_scenarios", "parse_artifacts", "parse_step"]


MAX_SEED = 2**63 - 1  # seeds are reported in JSON, whose integers stop at 64 bits
MAX_WRITERS = 32  # `concurrently`: each writer is a Python process, all started together
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024  # all of a scenario's artifacts: 16 MiB each, but never 30,000 of them


class _NoAliasLoader(yaml.SafeLoader):
    """YAML without aliases: `*name` is refused before anything is expanded ("billion laughs")."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a scenario", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        """A key given twice is refused: YAML would keep the last one and silently drop the first."""
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise _DuplicateKey(key, key_node.start_mark.line + 1)
                seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.1 reads `010` as 8, `0x10` as 16, `1_0` as 10 and `1:30` as 90 (base 60): a window or seed the author
# never wrote. Only plain decimal digits are an integer here; anything else stays text (and a key wanting an
# integer refuses it, naming the key).
_INT = "tag:yaml.org,2002:int"
_NoAliasLoader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_NoAliasLoader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


class _DuplicateKey(Exception):
    def __init__(self, key: Any, line: int) -> None:
        super().__init__(key, line)
        self.key = key
        self.line = line


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
    except _DuplicateKey as e:
        raise ScenarioError(f"{path}: key {str(e.key)!r}: given twice (line {e.line})") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def _artifacts(where: Where, raw: Any) -> dict[str, ArtifactSpec]:
    """Each artifact in file order: a candidate's `source` must be a baseline declared before it."""
    section = where.at("artifacts")
    declared = structure(section, raw if raw is not None else {}, dict[str, Any])
    artifacts: dict[str, ArtifactSpec] = {}
    total = 0
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
        _json_values(here, "manifest", spec.manifest)
        total += spec.size
        if total > MAX_ARTIFACT_BYTES:
            raise here.error("size", f"the artifacts total {total} bytes, over the {MAX_ARTIFACT_BYTES}-byte limit")
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
    inner: tuple[Step, ...] = ()
    if action == "crash":
        inner = (_inner(where, number, "run", args["run"], artifacts),)
    elif action == "concurrently":
        writers = args["writers"]
        if not isinstance(writers, list) or len(writers) < 2:
            raise here.error("writers", "must be a list of at least two command steps")
        if len(writers) > MAX_WRITERS:  # each one a process started at once
            raise here.error("writers", f"must be a list of 2 to {MAX_WRITERS} command steps, not {len(writers)}")
        inner = tuple(_inner(where, number, f"writers[{i}]", w, artifacts) for i, w in enumerate(writers))
    return Step(number, action, spec, args, _refusal(here, extras.refused), extras.note, inner)


def _inner(where: Where, number: int, key: str, raw: Any, artifacts: Mapping[str, ArtifactSpec]) -> Step:
    """A command step nested in `crash` or `concurrently` (reported as `step 3 (crash): run: …`)."""
    step = _step(Where(where.path, f"step {number}: {key}"), number, raw, artifacts)
    if step.action not in COMMAND_ACTIONS:
        raise where.at(f"step {number}").error(key, f"must be a ledger command ({', '.join(COMMAND_ACTIONS)})")
    return step


def _refusal(here: Where, raw: Any) -> Refusal | None:
    """`refused: ClassName` or `refused: {error: ClassName, message: text}` (or `contains: part`)."""
    if raw is None:
        return None
    if isinstance(raw, str):
        if raw not in ERROR_CLASSES:
            raise here.error("refused", f"unknown error class {raw!r} (expected one of {', '.join(ERROR_CLASSES)})")
        return Refusal(error=raw)
    if not isinstance(raw, dict):
        raise here.error(
            "refused", f"must be an error class name or a mapping of error, message, contains, not {raw!r}"
        )
    refusal = structure(here.at(f"{here.place}: refused"), raw, Refusal)
    if refusal.message is not None and refusal.contains is not None:
        raise here.error("refused", "give `message` (the whole text) or `contains` (a part), not both")
    return refusal


def _check_references(here: Where, action: str, args: Mapping[str, Any], artifacts: Mapping[str, Any]) -> None:
    """Every artifact a step names is declared in the file, of the kind the step needs."""
    for key, name in [("artifact", args.get("artifact")), ("baseline", args.get("baseline"))]:
        if name is None:
            continue
        if name not in artifacts:
            raise here.error(key, f"no artifact named {name!r} (declared: {', '.join(artifacts) or 'none'})")
        kind = artifacts[name].type
        if action in ("activate_baseline", "audit") and kind != "baseline":
            raise here.error(key, f"{name!r} is a {kind} artifact, not a baseline")
        if action == "receive" and kind not in CANDIDATE_KINDS:
            raise here.error(key, f"{name!r} is a {kind} artifact, not a candidate")
        if action == "edit_manifest" and kind == "trusted_state":
            raise here.error(key, f"{name!r} is a trusted state: it has no manifest")
    for name in args.get("candidates", ()) if action == "audit" else ():
        if name not in artifacts or artifacts[name].type not in CANDIDATE_KINDS:
            raise here.error("candidates", f"{name!r} is not a declared candidate artifact")
    if action == "edit_manifest":
        for key in [*args.get("set", {}), *args.get("drop", ())]:
            if key not in MANIFEST_FIELDS:
                raise here.error(key, f"not a manifest field (expected one of {', '.join(MANIFEST_FIELDS)})")
        _json_values(here, "set", args.get("set", {}))


def _not_json(value: Any) -> tuple[Any] | None:
    """The first part of `value` JSON cannot hold (a YAML date, binary, set, NaN), or None."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (value,)
    if isinstance(value, list):
        return next((bad for v in value if (bad := _not_json(v)) is not None), None)
    if isinstance(value, dict):
        if not all(isinstance(k, str) for k in value):
            return (value,)
        return next((bad for v in value.values() if (bad := _not_json(v)) is not None), None)
    return (value,)


def _json_values(here: Where, section: str, values: Mapping[Any, Any]) -> None:
    """Manifest fields are written into a JSON manifest: each must be a JSON value."""
    for key, value in values.items():
        if (bad := _not_json(value)) is not None:
            shown = repr(bad[0]) if isinstance(bad[0], (float, bytes, date)) else type(bad[0]).__name__
            shown = shown if len(shown) <= 60 else type(bad[0]).__name__
            raise here.at(f"{here.place}: {section}").error(
                key,
                f"must be a JSON value (null, true or false, a finite number, text, a list or a mapping), not {shown}",
            )


def _check_expect(here: Where, args: Mapping[str, Any]) -> None:
    """An expectation checks something, and says which candidate its candidate keys are about."""
    if not set(args) - {"candidate"}:
        raise here.error(None, "an expect step must check something")
    for key in CANDIDATE_EXPECTATIONS:
        if key in args and "candidate" not in args:
            raise here.error(key, "needs `candidate:` to say which candidate")
    if "recovery" in args and not args["recovery"]:
        raise here.error("recovery", "must name at least one of " + ", ".join(RECOVERY_KEYS))
    if "explain" in args and not args["explain"]:
        raise here.error("explain", "must name at least one of seq, type, reason_codes, evidence")
    if "as_of" in args and set(args) - {"candidate", "as_of", "state", "reason_codes", "explain", "trusted_states"}:
        raise here.error("as_of", "applies to state, reason_codes, trusted_states and explain only")
    events = args.get("events", 0)
    if not (_is_count(events) or events == "unchanged" or (isinstance(events, str) and re.fullmatch(r"\+\d+", events))):
        raise here.error("events", f'must be a count, "+N" or "unchanged", not {events!r}')


def _is_count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


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


def parse_artifacts(path: Path, raw: Any) -> dict[str, ArtifactSpec]:
    """An `artifacts:` section on its own (the simulator builds scenarios in memory)."""
    return _artifacts(Where(path), raw)


def parse_step(path: Path, number: int, raw: Any, artifacts: Mapping[str, ArtifactSpec]) -> Step:
    """One step on its own, validated exactly as in a file."""
    return _step(Where(path), number, raw, artifacts)
