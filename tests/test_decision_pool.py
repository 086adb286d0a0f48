"""The decision pool: export every recorded decision, round-trip the files exactly, refuse unknown
or missing keys (exit 3, naming file and key), re-decide with today's rules (exit 8 on a change).
CI re-decides the pool exported from every shipped drill."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO, invoke, run_cli

from lifecycle_fsm import checks, decision_pool
from lifecycle_fsm.decision_pool import DecisionPoolError, DecisionState, read_pool
from lifecycle_fsm.replay.drills import load_scenarios, run_drills


@pytest.fixture(scope="module")
def kept(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Every shipped drill's ledger, kept."""
    folder = tmp_path_factory.mktemp("kept")
    results = run_drills(load_scenarios([REPO / "scenarios"]), keep_dir=folder)
    assert all(r.ok for r in results)
    return folder


def _export(db: Path, pool: Path) -> Path:
    """Export `db` into `pool`: its files in that folder itself."""
    result = invoke(db, "decisions", "export", str(pool), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout)["folder"] == str(pool)
    assert sorted(pool.iterdir()) == sorted(pool.glob("*.json"))
    return pool


@pytest.mark.slow
def test_the_shipped_drills_pool_re_decides_unchanged(kept: Path, tmp_path: Path) -> None:
    """The CI gate: every decision the shipped drills record, each ledger exported into a folder of its own
    in one pool, is re-decided identically by today's rules."""
    pool = tmp_path / "pool"
    for db in sorted(kept.glob("*.db")):
        if json.loads(invoke(db, "verify", "--json").stdout)["checkpoints"] is None:  # the chain or replay broke
            assert invoke(db, "decisions", "export", str(pool / db.stem)).exit_code == 6  # fail-closed read
            continue  # a drill that edited an event on purpose
        _export(db, pool / db.stem)
    files = list(pool.rglob("*.json"))
    assert {f.stem.split("-")[1] for f in files} == {"check", "handoff", "recovery"} and len(files) > 50
    result = invoke(tmp_path / "none.db", "decisions", "replay", str(pool), "--json")
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"ok": True, "decisions": len(files), "changed": []}


def test_an_export_goes_into_a_new_or_empty_folder(kept: Path, tmp_path: Path) -> None:
    """A folder holding anything (another export, a stray file) is refused; an empty one is written into."""
    pool = tmp_path / "pool"
    pool.mkdir()
    files = _export(kept / "handoff-ready.db", pool).glob("*.json")
    assert {f.stem.split("-")[1] for f in files} == {"check", "handoff"}
    for db in ("handoff-ready.db", "handoff-tune.db"):
        again = invoke(kept / db, "decisions", "export", str(pool))
        assert again.exit_code == 3 and "not an empty folder" in again.stderr


def test_a_ledger_that_decided_nothing_exports_an_empty_pool_that_replays(tmp_path: Path) -> None:
    db = tmp_path / "quiet.db"
    assert invoke(db, "init").exit_code == 0
    assert json.loads(invoke(db, "decisions", "export", str(tmp_path / "pool"), "--json").stdout)["files"] == 0
    result = invoke(tmp_path / "none.db", "decisions", "replay", str(tmp_path / "pool"), "--json")
    assert (result.exit_code, json.loads(result.stdout)) == (0, {"ok": True, "decisions": 0, "changed": []})


def test_files_round_trip_exactly(kept: Path, tmp_path: Path) -> None:
    folder = _export(kept / "explain-reject-handoff-causes.db", tmp_path / "pool")
    files = sorted(folder.glob("*.json"))
    assert {f.stem.split("-")[1] for f in files} == {"check", "handoff", "recovery"}
    for f in files:
        text = f.read_text()
        state = DecisionState.from_json(text)
        assert state.to_json() == text
        assert DecisionState.from_json(state.to_json()) == state


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (lambda d: d.update(colour="red"), "unknown key 'colour'"),
        (lambda d: d.pop("seq"), "missing key 'seq'"),
        (lambda d: d["inputs"].pop("stage", None) or d["inputs"].pop("settings", None), "missing key inputs."),
        (lambda d: d["decided"].update(extra=1), "unknown key decided.'extra'"),
        (lambda d: d.update(schema="other/v9"), "key 'schema': 'other/v9'"),
    ],
)
def test_unknown_or_missing_keys_are_bad_input(kept: Path, tmp_path: Path, edit: Any, expected: str) -> None:
    pool = tmp_path / "pool"
    victim = sorted(_export(kept / "explain-reject-handoff-causes.db", pool).glob("*.json"))[1]
    doc = json.loads(victim.read_text())
    edit(doc)
    victim.write_text(json.dumps(doc))
    result = invoke(tmp_path / "none.db", "decisions", "replay", str(pool))
    assert result.exit_code == 3
    assert str(victim) in result.output and expected in result.output
    with pytest.raises(DecisionPoolError):
        read_pool(pool)


def test_export_to_a_folder_that_cannot_be_made_is_one_error_line(
    kept: Path, tmp_path: Path, read_only_folder: Path
) -> None:
    """A file in the way (or a read-only place) was a NotADirectoryError traceback; now exit 3, as every writer."""
    (tmp_path / "afile").write_text("x")
    for target in [tmp_path / "afile" / "sub", read_only_folder / "pool"]:
        done = invoke(kept / "handoff-ready.db", "decisions", "export", str(target))
        assert (done.exit_code, done.stdout) == (3, ""), done.stderr
        assert done.stderr.startswith(f"Error: cannot create decision pool folder {target}")
        assert done.stderr.count("\n") == 1


def test_a_changed_rule_is_listed_and_exits_8(kept: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A rules change that lets `tune` through as ready is flagged: candidate id, seq, recorded vs now."""
    pool = tmp_path / "pool"
    folder = _export(kept / "handoff-tune.db", pool)
    original = checks.decide_lifecycle_handoff  # the hand-off rule the check applies, and the pool re-applies

    def tune_is_ready(upstream: Any, freshness: Any, evidence: Any) -> Any:
        decided = original(upstream, freshness, evidence)
        return decided | {"handoff_status": "ready_for_evaluation"} if decided["handoff_status"] == "tune" else decided

    monkeypatch.setattr(checks, "decide_lifecycle_handoff", tune_is_ready)
    result = invoke(tmp_path / "none.db", "decisions", "replay", str(pool))
    assert result.exit_code == 8
    [line] = [line for line in result.output.splitlines() if line.startswith("changed: ")]
    decisions = [json.loads(f.read_text()) for f in sorted(folder.glob("*-handoff.json"))]
    [handoff] = [d for d in decisions if d["decided"]["handoff_status"] == "tune"]  # the one the change flips
    assert line.startswith(f"changed: {handoff['candidate_id']} seq {handoff['seq']} (handoff): ")
    assert '"tune"' in line and '"ready_for_evaluation"' in line
    doc = json.loads(invoke(tmp_path / "none.db", "decisions", "replay", str(pool), "--json").stdout)
    assert doc["ok"] is False and doc["changed"][0]["seq"] == handoff["seq"]


@pytest.mark.parametrize("special", ["fifo", "zero"])
def test_replay_of_a_pool_holding_a_special_file_is_refused_not_hung(kept: Path, tmp_path: Path, special: str) -> None:
    """A FIFO named *.json hung `decisions replay`; a link to /dev/zero read until memory ran out."""
    pool = tmp_path / "pool"
    bad = _export(kept / "handoff-ready.db", pool) / "zz.json"
    if special == "fifo":
        os.mkfifo(bad)
    else:
        bad.symlink_to("/dev/zero")
    done = run_cli(kept / "handoff-ready.db", "decisions", "replay", str(pool))  # run_cli times out at 120 s
    assert done.returncode == 3 and "zz.json" in done.stderr and done.stderr.count("\n") == 1, done.stderr


def _decision_file(kind: str) -> dict[str, Any]:
    """A well-formed pool file, written by hand (no ledger needed)."""
    if kind == "recovery":
        inputs: dict[str, Any] = {"stage": "reward", "available": {"trajectories": True, "prompt_queue": False}}
        decided: dict[str, Any] = {
            "action": "resume_reward_from_saved_trajectories",
            "recovery_state": "trajectories",
            "reused_state": True,
        }
    else:
        candidate = {
            "candidate_kind": "grpo",
            "source_policy_version": "p0",
            "policy_version": "g1",
            "evaluation_version": "e1",
            "preference_evidence_version": None,
            "verifier_version": "v1",
            "evidence_window_index": 1,
        }
        settings = {"active_policy_version": "p0", "active_window": 1, "max_window_age": 2, "evaluation_version": None}
        inputs = {
            "candidate": candidate,
            "settings": settings,
            "artifact_verified": True,
            "rollback_verified": True,
            "path_escapes_root": False,
        }
        decided = {"passed": True, "reason_codes": []}
    return {
        "schema": decision_pool.SCHEMA,
        "decision": kind,
        "candidate_id": "g1",
        "seq": 7,
        "event_type": "RecoveryPlanned" if kind == "recovery" else "ChecksRecorded",
        "inputs": inputs,
        "decided": decided,
    }


@pytest.mark.parametrize(
    ("kind", "edit", "key"),
    [
        ("recovery", lambda i: i.update(stage="bogus"), "inputs.stage"),
        ("recovery", lambda i: i.update(stage=["reward"]), "inputs.stage"),
        ("recovery", lambda i: i.update(available=None), "inputs.available"),
        ("recovery", lambda i: i.update(available=["trajectories"]), "inputs.available"),
        ("recovery", lambda i: i["available"].update(trajectories="yes"), "inputs.available"),
        ("check", lambda i: i["settings"].update(max_window_age="x"), "inputs.settings.max_window_age"),
        ("check", lambda i: i["settings"].update(active_window="x"), "inputs.settings.active_window"),
        ("check", lambda i: i["settings"].update(active_window=True), "inputs.settings.active_window"),
        ("check", lambda i: i["settings"].update(max_window_age=-5), "inputs.settings.max_window_age"),
        ("check", lambda i: i["settings"].update(active_policy_version=[1]), "inputs.settings.active_policy_version"),
        ("check", lambda i: i.update(artifact_verified="no"), "inputs.artifact_verified"),
    ],
)
def test_a_value_the_deciders_cannot_take_is_bad_input_not_a_traceback(
    tmp_path: Path, kind: str, edit: Any, key: str
) -> None:
    """`decisions replay` of a file whose stage was not a stage, or whose window was a string, died with a
    ValueError / AttributeError / TypeError traceback (exit 1); it is bad input naming the file and the key."""
    pool = tmp_path / "pool"
    pool.mkdir()
    good = _decision_file(kind)
    (pool / "a.json").write_text(json.dumps(good))
    assert invoke(tmp_path / "none.db", "decisions", "replay", str(pool)).exit_code == 0
    edit(good["inputs"])
    (pool / "a.json").write_text(json.dumps(good))
    _refused_naming(tmp_path, pool, key)


@pytest.mark.parametrize(
    ("text", "key"),
    [
        ("[" * 100_000 + "]" * 100_000, "depth limit exceeded"),
        ('{"a": ' * 50_000 + "1" + "}" * 50_000, "depth limit exceeded"),
    ],
)
def test_a_deeply_nested_decision_file_is_bad_input_not_a_traceback(tmp_path: Path, text: str, key: str) -> None:
    """A file of 100,000 nested brackets (well under the size limit) died in json's RecursionError (exit 1)."""
    pool = tmp_path / "pool"
    pool.mkdir()
    (pool / "a.json").write_text(text)
    _refused_naming(tmp_path, pool, key)


@pytest.mark.parametrize(
    ("edit", "key"),
    [
        (lambda d: d.update(seq=True), "'seq'"),
        (lambda d: d.update(seq=False), "'seq'"),
        (lambda d: d.update(event_type=5), "'event_type'"),
        (lambda d: d.update(event_type=None), "'event_type'"),
    ],
)
def test_a_top_level_value_of_the_wrong_type_is_bad_input(tmp_path: Path, edit: Any, key: str) -> None:
    """`"seq": true` was taken for seq 1 (a bool is an int in Python) and `event_type` was never checked."""
    pool = tmp_path / "pool"
    pool.mkdir()
    doc = _decision_file("check")
    edit(doc)
    (pool / "a.json").write_text(json.dumps(doc))
    _refused_naming(tmp_path, pool, key)


def test_a_key_given_twice_is_bad_input_not_the_last_one_wins(tmp_path: Path) -> None:
    """`"passed": false, "passed": true` kept the last value silently: the file said two things."""
    pool = tmp_path / "pool"
    pool.mkdir()
    text = json.dumps(_decision_file("check")).replace('"passed": true', '"passed": false, "passed": true')
    assert '"passed": false, "passed": true' in text
    (pool / "a.json").write_text(text)
    _refused_naming(tmp_path, pool, "'passed'")


def _refused_naming(tmp_path: Path, pool: Path, key: str) -> None:
    """`decisions replay` of `pool` is bad input (exit 3): one line naming `pool/a.json` and `key`."""
    done = invoke(tmp_path / "none.db", "decisions", "replay", str(pool))
    assert (done.exit_code, done.stdout) == (3, ""), done.stderr
    assert done.stderr.count("\n") == 1
    assert str(pool / "a.json") in done.stderr and key in done.stderr
