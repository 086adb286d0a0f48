"""Reading drill scenarios: YAML in, a validated `Scenario` out, or one `ScenarioError` line. Types are
`convert.py`'s; this module checks what a type cannot say (references between sections)."""

from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping, Sequence
from datetime import date
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm.errors import InputError, ScenarioError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import MAX_SCENARIO_BYTES, read_regular_file
from lifecycle_fsm.replay.drills.convert import Where, from_file, structure, unknown
from lifecycle_fsm.replay.drills.schema import (
    NAME,
    STEP_EXTRAS,
    ArtifactSpec,
    DrillConfig,
    Refusal,
    Scenario,
    ScenarioFile,
    Step,
    StepExtras,
    unknown_error,
)
from lifecycle_fsm.replay.drills.steps import (
    ACTIONS,
    CANDIDATE_EXPECTATIONS,
    COMMAND_ACTIONS,
    NAMES,
    Expect,
    ExplainExpectation,
    RecoveryExpectation,
)
from lifecycle_fsm.rules import CANDIDATE_KINDS

MAX_WRITERS = 32  # `concurrently`: each writer is a Python process, all started together
MAX_ARTIFACT_BYTES = 256 * 1024 * 1024  # all of a scenario's artifacts: 16 MiB each, but never 30,000 of them
ARTIFACT_KINDS = {"baseline": ("baseline",), "candidate": CANDIDATE_KINDS, "adapter": ("baseline", *CANDIDATE_KINDS)}


class _DuplicateKey(Exception):
    pass


class _Loader(yaml.SafeLoader):
    """YAML without aliases ("billion laughs"), without a key given twice (YAML keeps the last and
    silently drops the first), and with plain decimal digits as the only integers."""

    def compose_node(self, parent: Any, index: Any) -> Any:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark  # type: ignore[no-untyped-call]
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in a scenario", mark)
        return super().compose_node(parent, index)

    def construct_mapping(self, node: Any, deep: bool = False) -> Any:
        seen: set[Any] = set()
        for key_node, _ in node.value:
            if isinstance(key_node, yaml.ScalarNode) and key_node.tag != "tag:yaml.org,2002:merge":
                key = self.construct_object(key_node, deep=True)
                if key in seen:
                    raise _DuplicateKey(f"key {str(key)!r}: given twice (line {key_node.start_mark.line + 1})")
                seen.add(key)
        return super().construct_mapping(node, deep)


# YAML 1.1 reads `010` as 8, `0x10` as 16, `1_0` as 10 and `1:30` as 90: a number the author never wrote.
# Anything but plain decimal digits stays text, which a key wanting an integer refuses.
_INT = "tag:yaml.org,2002:int"
_Loader.yaml_implicit_resolvers = {
    first: [(tag, regexp) for tag, regexp in resolvers if tag != _INT]
    for first, resolvers in yaml.SafeLoader.yaml_implicit_resolvers.items()
}
_Loader.add_implicit_resolver(_INT, re.compile(r"^[-+]?(?:0|[1-9][0-9]*)$"), list("-+0123456789"))


def _read(path: Path) -> Any:
    try:
        return yaml.load(read_regular_file(path, what="scenario file", limit=MAX_SCENARIO_BYTES).decode(), _Loader)
    except InputError as e:
        raise ScenarioError(str(e)) from None
    except UnicodeDecodeError as e:
        raise ScenarioError(f"{path}: cannot read the scenario ({e})") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid YAML (nested too deeply)") from None
    except _DuplicateKey as e:
        raise ScenarioError(f"{path}: {e}") from None
    except yaml.YAMLError as e:
        raise ScenarioError(f"{path}: not valid YAML ({' '.join(str(e).split())})") from None


def parse_artifacts(where: Where, raw: Any) -> dict[str, ArtifactSpec]:
    """Each artifact in file order: a candidate's `source` must be a baseline declared before it."""
    artifacts: dict[str, ArtifactSpec] = {}
    total = 0
    for name, body in structure(where.at("artifacts"), raw or {}, JSON).items():
        here = where.at(f"artifacts.{name}")
        if not NAME.match(name):
            raise here.error(None, "an artifact name is letters, digits, '.', '_' or '-'")
        spec = structure(here, body or {}, ArtifactSpec)
        baselines = [n for n, a in artifacts.items() if a.type == "baseline"]
        if spec.source is not None and spec.source not in baselines:
            raise here.error("source", f"no baseline artifact named {spec.source!r} declared before it")
        if spec.type in CANDIDATE_KINDS and not (spec.source or baselines or "source_policy_version" in spec.manifest):
            raise here.error("source", "a candidate needs a baseline declared before it, or source_policy_version")
        _json_values(here.at(f"{here.place}: manifest"), spec.manifest)
        total += spec.size
        if total > MAX_ARTIFACT_BYTES:
            raise here.error("size", f"the artifacts total {total} bytes, over the {MAX_ARTIFACT_BYTES}-byte limit")
        artifacts[name] = spec
    return artifacts


def _json_values(here: Where, values: Mapping[Any, Any]) -> None:
    """Manifest fields are written into a JSON manifest: each must be a JSON value."""
    for key, value in values.items():
        if (bad := _not_json(value)) is not None:
            shown = repr(bad[0]) if isinstance(bad[0], (float, bytes, date)) else type(bad[0]).__name__
            shown = shown if len(shown) <= 60 else type(bad[0]).__name__
            kinds = "null, true or false, a finite number, text, a list or a mapping"
            raise here.error(key, f"must be a JSON value ({kinds}), not {shown}")


def _not_json(value: Any) -> tuple[Any] | None:
    """The first part of `value` JSON cannot hold (a YAML date, binary, set, NaN), or None."""
    if value is None or isinstance(value, (bool, int, str)):
        return None
    if isinstance(value, float):
        return None if math.isfinite(value) else (value,)
    if isinstance(value, dict) and not all(isinstance(k, str) for k in value):
        return (value,)
    if isinstance(value, (list, dict)):
        items = value.values() if isinstance(value, dict) else value
        return next((bad for v in items if (bad := _not_json(v)) is not None), None)
    return (value,)


def _action(here: Where, body: JSON) -> tuple[str, JSON]:
    """The step's one action, as the file named it, and its arguments (a shorthand's scalar filled in)."""
    words = [k for k in body if k not in STEP_EXTRAS]
    if not words:
        raise here.error(None, f"no action (expected one of {', '.join(ACTIONS)})")
    for word in words:
        if word not in NAMES:
            raise here.error(word, unknown(word, "step", [*NAMES, *STEP_EXTRAS], ACTIONS))
    if len(words) > 1:
        raise here.error(words[1], f"a step has one action, this one has {', '.join(words)}")
    word, value = words[0], body[words[0]]
    cls = ACTIONS[NAMES[word]]
    if value is None or isinstance(value, dict):
        return word, value or {}
    if cls.shorthand is None:
        keys = ", ".join(from_file(cls)) or "nothing"
        raise here.at(f"{here.place} ({word})").error(word, f"must be a mapping of {keys}, not {value!r}")
    return word, {cls.shorthand: value}


def parse_step(where: Where, number: int, raw: Any, artifacts: Mapping[str, ArtifactSpec], prefix: str = "") -> Step:
    """One step, validated (the simulator parses its operations with it too)."""
    prefix = prefix or f"step {number}"
    body = structure(where.at(prefix), raw, JSON)
    word, args = _action(where.at(prefix), body)
    here = where.at(f"{prefix} ({word})")
    action = NAMES[word]
    spec = structure(here, args, ACTIONS[action])
    extras = structure(here, {k: body[k] for k in STEP_EXTRAS if k in body}, StepExtras)
    _check_references(here, spec, args, artifacts)
    if isinstance(spec, Expect):
        _check_expect(here, args)
    inner = _inner(where, number, here, args, artifacts) if action in ("crash", "concurrently") else ()
    return Step(number, action, word, spec, args, _refusal(here, action, extras.refused, inner), extras.note, inner)


def _inner(where: Where, number: int, here: Where, args: Mapping[str, Any], artifacts: Any) -> tuple[Step, ...]:
    """The command steps a `crash` or `concurrently` step runs (reported as `step 3: writers[1] (check)`)."""
    if "run" in args:
        nested = {"run": args["run"]}
    else:
        writers = args["writers"]
        if not isinstance(writers, list) or not 2 <= len(writers) <= MAX_WRITERS:
            shown = f", not {len(writers)}" if isinstance(writers, list) else ""
            raise here.error("writers", f"must be a list of 2 to {MAX_WRITERS} command steps{shown}")
        nested = {f"writers[{i}]": w for i, w in enumerate(writers)}
    inner = []
    for key, raw in nested.items():
        step = parse_step(where, number, raw, artifacts, prefix=f"step {number}: {key}")
        if not ACTIONS[step.action].command:
            raise where.at(f"step {number}").error(key, f"must be a ledger command ({', '.join(COMMAND_ACTIONS)})")
        inner.append(step)
    return tuple(inner)


def _refusal(here: Where, action: str, raw: Any, inner: tuple[Step, ...]) -> Refusal | None:
    """`refused: ClassName` or a mapping (error, exact, message or contains; count on `concurrently`)."""
    if raw is None:
        return None
    if not ACTIONS[action].command and action != "concurrently":
        raise here.error("refused", f"only ledger commands can be refused ({', '.join(COMMAND_ACTIONS)}, concurrently)")
    if isinstance(raw, str) and (problem := unknown_error(raw)) is not None:
        raise here.error("refused", problem)
    if not isinstance(raw, str | dict):
        keys = ", ".join(from_file(Refusal))
        raise here.error("refused", f"must be an error class name or a mapping of {keys}, not {raw!r}")
    refusal = structure(here.at(f"{here.place}: refused"), {"error": raw} if isinstance(raw, str) else raw, Refusal)
    if action != "concurrently" and refusal.count is not None:
        raise here.error("refused", "`count` is for a concurrently step (how many of its writers are refused)")
    if action == "concurrently":
        if any(step.refused for step in inner):
            raise here.error("refused", "give it on the step or on its writers, not both")
        return refusal if refusal.count is not None else attrs.evolve(refusal, count=1)
    return refusal


def _check_references(here: Where, spec: Any, args: Mapping[str, Any], artifacts: Mapping[str, ArtifactSpec]) -> None:
    """Every artifact a step names is declared in the file, of the kind the step needs."""
    for field in attrs.fields(type(spec)):
        key, kind, names = field.name, field.metadata.get("refers"), getattr(spec, field.name)
        if kind is None:
            continue
        for name in [names] if isinstance(names, str) else names:
            if name not in artifacts:
                raise here.error(key, f"no artifact named {name!r} (declared: {', '.join(artifacts) or 'none'})")
            found = artifacts[name].type
            if kind != "any" and found not in ARTIFACT_KINDS[kind]:
                raise here.error(key, f"{name!r} is a {found} artifact, not a{'n' if kind == 'adapter' else ''} {kind}")
    if "set" in args:
        _json_values(here.at(f"{here.place}: set"), args["set"])


def _check_expect(here: Where, args: Mapping[str, Any]) -> None:
    """An expectation checks something, and says which candidate its candidate keys are about."""
    if not set(args) - {"candidate"}:
        raise here.error(None, "an expect step must check something")
    for key in CANDIDATE_EXPECTATIONS:
        if key in args and "candidate" not in args:
            raise here.error(key, "needs `candidate:` to say which candidate")
    for key, fields in (("recovery", from_file(RecoveryExpectation)), ("explain", from_file(ExplainExpectation))):
        if key in args and not args[key]:
            raise here.error(key, "must name at least one of " + ", ".join(fields))
    if "as_of" in args and set(args) - {"candidate", "as_of", "state", "reason_codes", "explain", "trusted_states"}:
        raise here.error("as_of", "applies to state, reason_codes, trusted_states and explain only")
    events = args.get("events", 0)
    count = isinstance(events, int) and not isinstance(events, bool) and events >= 0
    if not (count or events == "unchanged" or (isinstance(events, str) and re.fullmatch(r"\+\d+", events))):
        raise here.error("events", f'must be a count, "+N" or "unchanged", not {events!r}')


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate one scenario file."""
    p = Path(path)
    where = Where(p)
    top = structure(where, _read(p), ScenarioFile)
    config = structure(where.at("config"), top.config or {}, DrillConfig)
    artifacts = parse_artifacts(where, top.artifacts)
    if not isinstance(top.steps, list) or not top.steps:
        raise where.error("steps", "must be a non-empty list of steps")
    steps = tuple(parse_step(where, i, s, artifacts) for i, s in enumerate(top.steps, start=1))
    return Scenario(p, top.name, top.description, top.seed, config, artifacts, steps)


def find_scenarios(paths: Sequence[str | Path]) -> list[Path]:
    """Scenario files: each file given, and the `*.yaml` directly inside each folder (sorted), each once."""
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
    unique: dict[str, Path] = {}  # a file named twice (or through a link) runs once
    for f in found:
        unique.setdefault(os.path.realpath(f), f)
    return list(unique.values())


def load_scenarios(paths: Sequence[str | Path]) -> list[Scenario]:
    """Find and validate every scenario before any runs; names must be unique (they name kept ledgers)."""
    scenarios = [load_scenario(p) for p in find_scenarios(paths)]
    seen: dict[str, Path] = {}
    for s in scenarios:
        if s.name in seen:
            raise ScenarioError(f"{s.path}: key 'name': {s.name!r} is also the name of {seen[s.name]}")
        seen[s.name] = s.path
    return scenarios
