"""Hostile input, generated: manifests, scenario files and CLI arguments never end in a traceback.

Hypothesis writes manifests (wrong types, huge strings, NUL bytes, deep nesting,
non-UTF-8 bytes), scenario files (random YAML and random structures) and command
arguments (control characters, huge numbers, odd ids). Every outcome must be a
documented exit code with one `Error:` line, and a refused command appends nothing.
Special files (FIFO, device, symlink loop, folder, sparse 10 GB) are tried wherever
a command takes a path, as real processes with a timeout: none may hang.
"""

from __future__ import annotations

import json
import os
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from lifecycle_fsm.errors import ScenarioError
from lifecycle_fsm.replay.drills.loader import load_scenario
from reliability.damage import invoke, run
from reliability.workload import make_artifacts

DOCUMENTED = {0, 2, 3, 4, 5}  # a hostile input may be refused in any of these ways, never 1, 6 or 7


def _settings(examples: int) -> settings:
    """Seeded (derandomized) and without a saved-example database: a campaign is reproducible."""
    return settings(
        max_examples=examples, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True, database=None
    )


_scalars = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(),
    st.floats(allow_nan=False),
    st.text(max_size=30),
    st.text(alphabet=st.characters(codec="utf-8"), max_size=5).map(lambda s: s + "\x00\x1b[2J"),
    st.integers(min_value=10_000, max_value=200_000).map(lambda n: "x" * n),
)
_json = st.recursive(
    _scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20,
)
_manifest_keys = st.sampled_from(
    [
        "artifacts",
        "policy_version",
        "source_policy_version",
        "candidate_kind",
        "semantic_id",
        "evaluation_version",
        "evidence_window_index",
        "trajectory_identity",
        "source_evidence",
        "decision",
    ]
)


@st.composite
def manifests(draw: st.DrawFn) -> bytes:
    """Mostly manifest-shaped JSON with hostile values; sometimes raw bytes or a deep nest."""
    choice = draw(st.integers(0, 9))
    if choice == 0:
        return draw(st.binary(max_size=200))
    if choice == 1:
        depth = draw(st.integers(100, 5000))
        return b'{"artifacts":' * depth + b"1" + b"}" * depth
    doc: dict[str, Any] = draw(st.dictionaries(_manifest_keys, _json, max_size=6))
    if draw(st.booleans()):
        adapter = {
            "path": draw(st.one_of(st.just("adapter"), st.text(max_size=20), _json)),
            "sha256": draw(st.one_of(st.text(max_size=70), _json)),
        }
        doc["artifacts"] = {"adapter": adapter}
    return json.dumps(doc).encode()  # json, not orjson: integers beyond 64 bits are hostile input too


def _events(db: Path) -> int:
    if not db.exists():
        return 0
    with sqlite3.connect(db) as conn:
        return int(conn.execute("SELECT count(*) FROM events").fetchone()[0])


def _assert_clean(result: Any, db: Path, before: int) -> None:
    assert "Traceback" not in result.stderr, result.stderr
    assert result.returncode in DOCUMENTED, (result.returncode, result.stderr)
    if result.returncode != 0:
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), result.stderr
        assert _events(db) == before, "a refused command appended"


@pytest.fixture(scope="module")
def ledger_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("hostile")
    art = make_artifacts(root / "art")
    db = root / "ledger.db"
    assert invoke(db, "init").returncode == 0
    assert invoke(db, "baseline", "activate", art.baselines["sft"]).returncode == 0
    assert invoke(db, "receive", art.candidates["dpo-a"]).returncode == 0
    return root


@pytest.mark.slow
def test_generated_manifests(ledger_dir: Path, campaign: Any, tally: list[dict[str, Any]]) -> None:
    db, path = ledger_dir / "ledger.db", ledger_dir / "hostile.json"
    seen: dict[int, int] = {}

    @_settings(campaign.hypothesis_examples)
    @given(data=manifests(), command=st.sampled_from(["receive", "baseline"]))
    def check(data: bytes, command: str) -> None:
        path.write_bytes(data)
        before = _events(db)
        result = invoke(db, *(["receive"] if command == "receive" else ["baseline", "activate"]), str(path))
        _assert_clean(result, db, before)
        seen[result.returncode] = seen.get(result.returncode, 0) + 1

    check()
    tally.append(
        {
            "campaign": "hostile input: manifests",
            "runs": sum(seen.values()),
            "faults": sum(seen.values()),
            "exit_codes": dict(sorted(seen.items())),
            "lost": 0,
            "wrong": 0,
            "result": "pass",
        }
    )


_yaml_text = st.one_of(
    st.text(max_size=300),
    _json.map(yaml.safe_dump),
    st.builds(
        lambda seed, steps: yaml.safe_dump(
            {"name": "fuzz", "seed": seed, "artifacts": {"sft": {"type": "baseline"}}, "steps": steps}
        ),
        st.one_of(st.integers(), _json),
        st.lists(
            st.dictionaries(
                st.sampled_from(
                    ["activate_baseline", "receive", "check", "expect", "refused", "crash_during_append", "note"]
                ),
                _json,
                max_size=2,
            ),
            max_size=4,
        ),
    ),
    st.integers(2, 12).map(lambda n: "a: &a [x]\n" + "".join(f"b{i}: &b{i} [*a, *a]\n" for i in range(n))),
)


def test_generated_scenario_files(tmp_path: Path, campaign: Any, tally: list[dict[str, Any]]) -> None:
    path = tmp_path / "fuzz.yaml"
    counts = {"valid": 0, "refused": 0}

    @_settings(campaign.hypothesis_examples)
    @given(text=_yaml_text, raw=st.booleans(), junk=st.binary(max_size=50))
    def check(text: str, raw: bool, junk: bytes) -> None:
        path.write_bytes(junk if raw and junk else text.encode("utf-8", "surrogatepass"))
        try:
            load_scenario(path)
            counts["valid"] += 1
        except ScenarioError:
            counts["refused"] += 1

    check()
    row = {"campaign": "hostile input: scenario files", "runs": sum(counts.values()), "faults": counts["refused"]}
    tally.append(row | {"outcomes": counts, "lost": 0, "wrong": 0, "result": "pass"})


_arg = st.one_of(
    st.text(max_size=40),
    st.text(max_size=3).map(lambda s: s + "\x1b]0;pwned\x07"),
    st.just("[/bold]"),
    st.integers().map(str),
    st.just(str(10**30)),
    st.just("-1"),
    st.just("x" * 5000),
)
_commands = st.sampled_from(
    [
        ["status", "{a}"],
        ["history", "{a}"],
        ["explain", "{a}"],
        ["check", "{a}"],
        ["handoff", "{a}"],
        ["fail", "{a}", "--stage", "{b}"],
        ["fail", "dpo-a", "--stage", "{a}"],
        ["recovered", "{a}"],
        ["trusted", "dpo-a", "{a}", "{b}"],
        ["untrust", "{a}", "{b}"],
        ["window", "{a}"],
        ["evaluation", "activate", "{a}"],
        ["status", "--as-of", "{a}"],
        ["replay", "--to", "{a}"],
        ["log", "--after", "{a}"],
        ["log", "--candidate", "{a}"],
        ["receive", "{a}"],
        ["receive", "{a}", "--id", "{b}"],
        ["hash", "{a}"],
        ["init", "--active-window", "{a}"],
    ]
)


def test_generated_cli_arguments(ledger_dir: Path, campaign: Any, tally: list[dict[str, Any]]) -> None:
    db = ledger_dir / "ledger.db"
    seen: dict[int, int] = {}

    @_settings(campaign.hypothesis_examples)
    @given(template=_commands, a=_arg, b=_arg)
    def check(template: list[str], a: str, b: str) -> None:
        args = [part.replace("{a}", a).replace("{b}", b) for part in template]
        before = _events(db)
        result = invoke(db, *args)
        _assert_clean(result, db, before)
        assert "\x1b" not in result.stderr, "an escape reached the terminal"
        seen[result.returncode] = seen.get(result.returncode, 0) + 1

    check()
    tally.append(
        {
            "campaign": "hostile input: CLI arguments",
            "runs": sum(seen.values()),
            "faults": sum(seen.values()),
            "exit_codes": dict(sorted(seen.items())),
            "lost": 0,
            "wrong": 0,
            "result": "pass",
        }
    )


def _special_files(root: Path) -> dict[str, str]:
    fifo = root / "fifo"
    if not fifo.exists():
        os.mkfifo(fifo)
        (root / "loop-a").symlink_to(root / "loop-b")
        (root / "loop-b").symlink_to(root / "loop-a")
        (root / "folder").mkdir()
        with (root / "sparse").open("wb") as fh:
            fh.truncate(10 * 1024**3)
    return {
        "fifo": str(fifo),
        "/dev/zero": "/dev/zero",
        "symlink loop": str(root / "loop-a"),
        "folder": str(root / "folder"),
        "sparse 10 GB": str(root / "sparse"),
    }


PATH_COMMANDS = {
    "receive": ["receive", "{p}"],
    "baseline activate": ["baseline", "activate", "{p}"],
    "trusted": ["trusted", "dpo-a", "prompt_queue", "{p}"],
    "drill": ["drill", "{p}"],
    "audit": ["audit", "--baseline", "{p}", "--candidates", "{p}", "--label", "x"],
}


@pytest.mark.parametrize("command", PATH_COMMANDS)
def test_special_files_wherever_a_path_is_taken(ledger_dir: Path, command: str, tally: list[dict[str, Any]]) -> None:
    """Real processes with a timeout (`run` fails the test after 120 s): refused fast, exit 3, nothing appended."""
    db = ledger_dir / "ledger.db"
    results = {}
    for name, special in _special_files(ledger_dir).items():
        if command == "trusted" and name in ("folder", "sparse 10 GB"):
            continue  # a trusted state is a folder or a big file by nature: hashed, not refused
        before = _events(db)
        result = run(db, *[part.replace("{p}", special) for part in PATH_COMMANDS[command]])
        _assert_clean(result, db, before)
        assert result.returncode in (2, 3), (name, result.returncode, result.stderr)
        results[name] = result.returncode
    tally.append(
        {
            "campaign": f"hostile input: special files ({command})",
            "runs": len(results),
            "faults": len(results),
            "exit_codes": results,
            "lost": 0,
            "wrong": 0,
            "result": "pass",
        }
    )
