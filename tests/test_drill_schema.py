"""The scenario schema: attrs classes, a strict cattrs converter, and its errors as one-line ScenarioErrors."""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import attrs
import cattrs
import pytest
import yaml
from cattrs.errors import ClassValidationError
from conftest import REPO, examples, run_cli
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_fsm.errors import ScenarioError
from lifecycle_fsm.replay.drills import load_scenario
from lifecycle_fsm.replay.drills.convert import Where, structure
from lifecycle_fsm.replay.drills.steps import (
    ACTIONS,
    COMMAND_ACTIONS,
    AdvanceWindow,
    CrashDuringAppend,
    InvalidateTrustedState,
    RecoveryExpectation,
    TamperEvent,
)

HEAD = "name: s\nseed: 1\nartifacts:\n  sft: {type: baseline}\n  dpo-v5: {type: dpo}\n"


def _load(tmp_path: Path, text: str) -> Any:
    path = tmp_path / "s.yaml"
    path.write_text(text)
    return load_scenario(path)


def _message(tmp_path: Path, text: str) -> str:
    """The error for `text`, without the file name every message starts with."""
    with pytest.raises(ScenarioError) as info:
        _load(tmp_path, text)
    return str(info.value).removeprefix(f"{tmp_path / 's.yaml'}: ")


def _steps(*lines: str) -> str:
    return HEAD + "steps:\n" + "".join(f"  - {line}\n" for line in lines)


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (_steps("advance_window: true"), "step 1 (advance_window): key 'window': must be an integer, not True"),
        (_steps("advance_window: 2.5"), "step 1 (advance_window): key 'window': must be an integer, not 2.5"),
        (_steps("tamper_event: {seq: 7.9}"), "step 1 (tamper_event): key 'seq': must be an integer, not 7.9"),
        (_steps("check: 5"), "step 1 (check): key 'candidate': must be a string, not 5"),
        (_steps("check: true"), "step 1 (check): key 'candidate': must be a string, not True"),
        (_steps("expect: {chain_valid: 1}"), "step 1 (expect): key 'chain_valid': must be true or false, not 1"),
        (
            _steps("expect: {candidate: d, reason_codes: x}"),
            "step 1 (expect): key 'reason_codes': must be a list, not 'x'",
        ),
        (
            _steps("expect: {candidate: d, reason_codes: [1]}"),
            "step 1 (expect): key 'reason_codes': every item must be a string, not 1",
        ),
        (_steps("receive: {artifact: dpo-v5, id: null}"), "step 1 (receive): key 'id': must be a string, not None"),
        (
            _steps("expect: {candidate: d, handoff: 5}"),
            "step 1 (expect): key 'handoff': must be a string or null, not 5",
        ),
        (
            _steps("expect: {candidate: d, recovery: {reused_state: 1}}"),
            "step 1 (expect): key 'recovery.reused_state': must be true or false, not 1",
        ),
        (_steps("expect: {candidate: d, recovery: 5}"), "step 1 (expect): key 'recovery': must be a mapping, not 5"),
        (
            _steps("check: a\n    refused: [InputError]"),
            "step 1 (check): key 'refused': must be an error class name or a mapping of error, exact, message, "
            "contains, count, not ['InputError']",
        ),
        ("name: s\nseed: '7'\nsteps: [checkpoint: null]\n", "key 'seed': must be an integer, not '7'"),
        (
            "name: s\nseed: 1\nconfig: {active_window: '1'}\nsteps: [checkpoint: null]\n",
            "config: key 'active_window': must be an integer, not '1'",
        ),
        (
            "name: s\nseed: 1\nartifacts: {sft: {type: baseline, size: 10.5}}\nsteps: [checkpoint: null]\n",
            "artifacts.sft: key 'size': must be an integer, not 10.5",
        ),
        (
            "name: s\nseed: 1\nartifacts: {sft: {type: sft}}\nsteps: [checkpoint: null]\n",
            "artifacts.sft: key 'type': must be one of baseline, dpo, grpo, rlvr, trusted_state, not 'sft'",
        ),
        (
            "name: s\nseed: 1\nartifacts: {sft: {size: 1}}\nsteps: [checkpoint: null]\n",
            "artifacts.sft: key 'type': is required (one of baseline, dpo, grpo, rlvr, trusted_state)",
        ),
        ("- a\n- b\n", "must be a mapping, not a list"),
        (_steps("null"), "step 1: must be a mapping, not null"),
        ("", "must be a mapping, not null"),
    ],
)
def test_wrong_types_are_refused_not_converted(tmp_path: Path, text: str, expected: str) -> None:
    """A bool, a float or a string is never taken for an int, nor an int for a string; null only where allowed."""
    assert _message(tmp_path, text) == expected


def test_default_cattrs_would_have_converted() -> None:
    """The trap the strict hooks close (LIBRARY_NOTES): plain cattrs turns 7.9 into 7 and 5 into '5'."""
    loose = cattrs.Converter()
    assert loose.structure({"seq": 7.9}, TamperEvent) == TamperEvent(seq=7)
    assert loose.structure({"window": True}, AdvanceWindow) == AdvanceWindow(window=1)
    with pytest.raises(ScenarioError, match=r"must be an integer, not 7\.9"):
        structure(Where(Path("f.yaml")), {"seq": 7.9}, TamperEvent)


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (
            {"stage": "x", "reused": False},
            "f.yaml: step 2: recovery: key 'reused': unknown key, did you mean "
            "'reused_state'? (expected one of stage, recovery_state, reused_state, "
            "action)",
        ),
        ({1: True}, "f.yaml: step 2: recovery: key '1': keys must be strings"),
    ],
)
def test_cattrs_errors_become_one_line(raw: dict[Any, Any], expected: str) -> None:
    """ForbiddenExtraKeysError inside a ClassValidationError becomes one ScenarioError line, cause kept."""
    with pytest.raises(ScenarioError) as info:
        structure(Where(Path("f.yaml"), "step 2"), {"candidate": "c", "recovery": raw}, ACTIONS["expect"])
    assert str(info.value) == expected
    assert "\n" not in str(info.value)
    assert isinstance(info.value.__cause__, ClassValidationError)  # raised `from` the cattrs error


def test_problems_are_reported_unknown_first_then_values_then_missing(tmp_path: Path) -> None:
    """With several problems, a typo'd key is named first (it usually explains the rest), then a wrong value."""
    assert _message(tmp_path, _steps("record_trusted_state: {kind: 5, colour: red}")) == (
        "step 1 (record_trusted_state): key 'colour': unknown key (expected one of candidate, kind, artifact)"
    )
    assert _message(tmp_path, _steps("record_trusted_state: {kind: 5}")) == (
        "step 1 (record_trusted_state): key 'kind': must be a string, not 5"
    )
    assert _message(tmp_path, _steps("record_trusted_state: {kind: k}")) == (
        "step 1 (record_trusted_state): key 'candidate': is required"
    )


def test_defaults_live_in_the_schema(tmp_path: Path) -> None:
    """What a step leaves out is filled from its class; `args` keeps only what the file said, in its order."""
    scenario = _load(
        tmp_path,
        _steps(
            "invalidate_trusted_state: {candidate: d, kind: prompt_queue}",
            "crash_during_append: {candidate: d}",
            "expect: {events: 3, candidate: d, handoff: null}",
        ),
    )
    invalidate, crash, expect = scenario.steps
    assert invalidate.spec == InvalidateTrustedState(candidate="d", kind="prompt_queue", reason="invalidated by drill")
    assert crash.spec == CrashDuringAppend(candidate="d", stage="sampling", commands=3)
    assert list(expect.args) == ["events", "candidate", "handoff"] and expect.args["handoff"] is None
    assert expect.spec.recovery is None


def test_every_action_is_declared_and_documented() -> None:
    """Shorthands name a field; commands are the ones `refused:` accepts; each step is in scenarios/README.md."""
    readme = (REPO / "scenarios" / "README.md").read_text()
    for name, cls in ACTIONS.items():
        assert cls.name == name
        fields = [f.name for f in attrs.fields(cls)]
        assert cls.shorthand is None or cls.shorthand in fields
        assert f"| `{name}`" in readme, name
        assert cls.alias is None or f"(`{cls.alias}`)" in readme, cls.alias
    assert tuple(n for n, c in ACTIONS.items() if c.command) == COMMAND_ACTIONS
    assert [f.name for f in attrs.fields(RecoveryExpectation)] == ["stage", "recovery_state", "reused_state", "action"]


_KEYS = st.sampled_from(["name", "seed", "description", "config", "artifacts", "steps", "colour"])
_SCALARS = (
    st.none()
    | st.booleans()
    | st.integers(-3, 3)
    | st.floats(allow_nan=False)
    | st.sampled_from(["sft", "dpo-v5", "d", "x y", "InputError", "baseline", "dpo", "trusted_state", ""])
)
_VALUES = st.recursive(
    _SCALARS,
    lambda inner: (
        st.lists(inner, max_size=3)
        | st.dictionaries(
            st.sampled_from(
                ["type", "candidate", "artifact", "window", "recovery", "stage", "to", "manifest", "size", "k"]
            ),
            inner,
            max_size=3,
        )
    ),
    max_leaves=8,
)
_STEPS = st.lists(
    st.dictionaries(st.sampled_from([*ACTIONS, "refused", "note", "chek"]), _VALUES, min_size=1, max_size=2),
    max_size=3,
)
_DOCS = st.fixed_dictionaries(
    {"name": st.sampled_from(["s", 5, "a b"]), "seed": st.sampled_from([1, 1.5, True]), "steps": _STEPS},
    optional={"config": _VALUES, "artifacts": _VALUES},
) | st.dictionaries(_KEYS, _VALUES, max_size=4)


@settings(max_examples=examples(80, 300), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(doc=_DOCS)
def test_any_document_loads_or_says_why_in_one_line(doc: dict[str, Any]) -> None:
    """Whatever the file holds, loading gives a Scenario or one ScenarioError line: no cattrs, KeyError or TypeError."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "doc.yaml"
        path.write_text(yaml.safe_dump(doc))
        message = ""
        try:
            load_scenario(path)
        except ScenarioError as e:
            message = str(e)
        assert not message or ("\n" not in message and message.startswith(f"{path}: "))


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        (
            _steps("receive: dpo-v5", "expect: {candidate: dpo-v5, state: reject, state: received}"),
            "key 'state': given twice (line 8)",
        ),
        ("name: s\nseed: 1\nseed: 2\nsteps: [checkpoint: null]\n", "key 'seed': given twice (line 3)"),
        (HEAD + "  dpo-v5: {type: grpo}\nsteps: [checkpoint: null]\n", "key 'dpo-v5': given twice (line 6)"),
    ],
)
def test_a_key_given_twice_is_refused_not_overwritten(tmp_path: Path, text: str, expected: str) -> None:
    """YAML keeps the last of two equal keys: `state: reject, state: received` checked only one of them."""
    message = _message(tmp_path, text)
    assert expected in message
    assert "\n" not in message


@pytest.mark.parametrize(
    ("config", "expected"),
    [
        (
            "{active_window: 99999999999999999999999}",
            "config: key 'active_window': must be between 0 and 9223372036854775807",
        ),
        (
            "{max_window_age: 9223372036854775808}",
            "config: key 'max_window_age': must be between 0 and 9223372036854775807",
        ),
        ("{evaluation_version: ''}", "config: key 'evaluation_version': evaluation version must be a non-empty string"),
        ('{evaluation_version: "a\\nb"}', "config: key 'evaluation_version': evaluation version 'a\\nb' contains"),
        ("{evaluation_version: ' eval-v1'}", "config: key 'evaluation_version': evaluation version ' eval-v1' starts"),
    ],
)
def test_a_config_the_ledger_cannot_take_is_a_file_error(tmp_path: Path, config: str, expected: str) -> None:
    """A config is no step a drill can expect refused: what `init` would refuse is refused with the file."""
    message = _message(tmp_path, f"name: s\nseed: 1\nconfig: {config}\nsteps: [checkpoint: null]\n")
    assert message.startswith(expected), message


def test_a_bad_file_stops_the_drill_before_anything_runs(tmp_path: Path) -> None:
    """`lifecycle drill` validates every file first: one bad config is exit 3, one line, nothing run or kept."""
    first = tmp_path / "a" / "a.yaml"
    first.parent.mkdir()
    first.write_text("name: a\nseed: 1\nsteps: [checkpoint: null]\n")
    bad = tmp_path / "a" / "b.yaml"
    bad.write_text("name: b\nseed: 1\nconfig: {active_window: 99999999999999999999999}\nsteps: [checkpoint: null]\n")
    done = run_cli(tmp_path / "unused.db", "drill", str(first.parent), "--keep", str(tmp_path / "kept"))
    assert done.returncode == 3 and done.stderr.startswith(f"Error: {bad}: config: "), done.stderr
    assert "Traceback" not in done.stderr and done.stderr.count("\n") == 1
    assert not (tmp_path / "kept").exists() or not any((tmp_path / "kept").iterdir())


def test_the_artifacts_a_scenario_writes_are_bounded_in_total(tmp_path: Path) -> None:
    """Each artifact may be 16 MiB and their total 256 MiB: the artifact that passes the cap is named."""
    many = "".join(f"  a{i}: {{type: dpo, size: 16777216}}\n" for i in range(17))
    message = _message(
        tmp_path, f"name: s\nseed: 1\nartifacts:\n  sft: {{type: baseline, size: 1}}\n{many}steps: [checkpoint: null]\n"
    )
    assert message.startswith("artifacts.a15: key 'size': the artifacts total 268435457 bytes"), message
    fits = "".join(f"  a{i}: {{type: dpo, size: 16777216}}\n" for i in range(15))
    _load(tmp_path, f"name: s\nseed: 1\nartifacts:\n  sft: {{type: baseline}}\n{fits}steps: [checkpoint: null]\n")


def test_concurrent_writers_are_bounded(tmp_path: Path) -> None:
    """Each writer is a process started at once: at most 32."""
    many = "[" + ", ".join(["{check: dpo-v5}"] * 33) + "]"
    assert _message(tmp_path, _steps(f"concurrently: {{writers: {many}}}")) == (
        "step 1 (concurrently): key 'writers': must be a list of 2 to 32 command steps, not 33"
    )
    fits = "[" + ", ".join(["{check: dpo-v5}"] * 32) + "]"
    _load(tmp_path, _steps(f"concurrently: {{writers: {fits}}}"))


@pytest.mark.parametrize("written", ["010", "0o10", "0x10", "1_0", "1:30", "0b10"])
def test_an_integer_yaml_11_would_reread_is_refused_not_converted(tmp_path: Path, written: str) -> None:
    """YAML 1.1 reads `010` as 8 and `1:30` as 90: only plain decimal digits are an integer, the rest is text."""
    assert _message(tmp_path, _steps(f"advance_window: {written}")) == (
        f"step 1 (advance_window): key 'window': must be an integer, not '{written}'"
    )


def test_plain_integers_still_load(tmp_path: Path) -> None:
    scenario = _load(tmp_path, _steps("advance_window: 10", "advance_window: 0", "advance_window: -3"))
    assert [s.spec.window for s in scenario.steps] == [10, 0, -3]


@pytest.mark.parametrize(
    ("value", "shown"),
    [
        ("2026-01-01", "datetime.date(2026, 1, 1)"),
        ("!!binary aGVsbG8=", "b'hello'"),
        ("!!set {a, b}", "set"),
        (".nan", "nan"),
        ("-.inf", "-inf"),
        ("{when: 2026-01-01T00:00:00Z}", "datetime"),
    ],
)
def test_a_manifest_value_that_is_not_json_is_a_file_error(tmp_path: Path, value: str, shown: str) -> None:
    """A manifest override is written into a JSON manifest: a value JSON cannot hold is a file error."""
    artifact = f"dpo-v5: {{type: dpo, manifest: {{source_evidence: {value}}}}}"
    declared = _message(tmp_path, HEAD.replace("dpo-v5: {type: dpo}", artifact) + "steps: [checkpoint: null]\n")
    assert declared.startswith("artifacts.dpo-v5: manifest: key 'source_evidence': must be a JSON value"), declared
    assert shown in declared
    edited = _message(tmp_path, _steps(f"edit_manifest: {{artifact: dpo-v5, set: {{source_evidence: {value}}}}}"))
    assert edited.startswith("step 1 (edit_manifest): set: key 'source_evidence': must be a JSON value"), edited
