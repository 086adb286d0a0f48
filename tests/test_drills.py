"""Drills: shipped scenarios, scenario validation, fault injection, the report and `lifecycle drill`."""

from __future__ import annotations

import json
import random
import re
import stat
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import yaml
from click.testing import Result
from conftest import REPO, Workspace, count_events, invoke

from lifecycle_fsm.errors import InputError, ScenarioError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.drills import find_scenarios, load_scenario, run_scenario
from lifecycle_fsm.replay.drills.steps import ACTIONS
from lifecycle_fsm.replay.drills.writers import crash_during_append

SCENARIOS = REPO / "scenarios"
SHIPPED = sorted(SCENARIOS.glob("*.yaml"))
INVALID = sorted((SCENARIOS / "invalid").glob("*.yaml"))
FAULTS = ("crash_during_append", "corrupt_checkpoint", "tamper_event", "tamper_artifact", "delete_artifact")

SMALL = """\
name: small
seed: 3
artifacts:
  sft: {type: baseline}
  dpo-v5: {type: dpo}
steps:
  - activate_baseline: sft
  - receive: dpo-v5
  - check: dpo-v5
  - expect: {candidate: dpo-v5, state: STATE}
"""


def _write(folder: Path, name: str, text: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.yaml"
    path.write_text(text)
    return path


def _drill(tmp_path: Path, *args: str) -> Result:
    return invoke(tmp_path / "unused.db", "--log-level", "error", "drill", *args)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.stem)
def test_shipped_scenario_passes(path: Path) -> None:
    """Every shipped scenario runs against a fresh ledger and every expectation holds."""
    result = run_scenario(load_scenario(path))
    assert result.ok, "\n".join(f.message() for f in result.failures)
    assert len(result.steps) == result.steps_total


def test_shipped_scenarios_cover_the_issue() -> None:
    """At least 20 scenarios ship, every fault is exercised, and names match file names."""
    scenarios = [load_scenario(p) for p in SHIPPED]
    assert len(scenarios) >= 20
    used = {step.action for s in scenarios for step in s.steps}
    assert set(FAULTS) <= used
    assert set(ACTIONS) <= used
    assert all(s.name == s.path.stem for s in scenarios)


def test_readme_example_runs(tmp_path: Path) -> None:
    """The annotated example in scenarios/README.md is a valid scenario that passes."""
    readme = (SCENARIOS / "README.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", readme, re.S)
    assert block is not None
    result = run_scenario(load_scenario(_write(tmp_path, "example", block.group(1))))
    assert result.ok, [f.message() for f in result.failures]


@pytest.mark.parametrize("path", INVALID, ids=lambda p: p.stem)
def test_malformed_scenario_is_refused(path: Path) -> None:
    """A malformed file is a ScenarioError naming the file, the step number and the key."""
    fragments = path.read_text().splitlines()[0].removeprefix("# error:").split("|")
    with pytest.raises(ScenarioError) as info:
        load_scenario(path)
    message = str(info.value)
    assert str(path) in message
    for fragment in fragments:
        assert fragment.strip() in message


def test_malformed_scenario_cli_exits_3_before_running_anything(tmp_path: Path) -> None:
    """The CLI validates every file first: one bad file means exit 3 and no scenario runs."""
    good = _write(tmp_path / "s", "small", SMALL.replace("STATE", "verified"))
    result = _drill(
        tmp_path, str(good), str(SCENARIOS / "invalid" / "unknown-step.yaml"), "--keep", str(tmp_path / "k")
    )
    assert result.exit_code == 3
    assert "Error: " in result.output and "step 3" in result.output and "'chek'" in result.output
    assert not (tmp_path / "k").exists()


def test_default_paths_skip_the_invalid_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PATHS the drill runs ./scenarios/*.yaml and never its invalid/ subfolder."""
    _write(tmp_path / "scenarios", "small", SMALL.replace("STATE", "verified"))
    _write(tmp_path / "scenarios" / "invalid", "broken", "name: [")
    monkeypatch.chdir(tmp_path)
    result = _drill(tmp_path, "--json")
    assert result.exit_code == 0, result.output
    assert [s["name"] for s in json.loads(result.output)["scenarios"]] == ["small"]
    assert all("invalid" not in p.parts for p in find_scenarios([SCENARIOS]))


def test_no_scenarios_is_an_input_error(tmp_path: Path) -> None:
    """An empty folder or a missing path is refused (exit 3), not a vacuous pass."""
    (tmp_path / "empty").mkdir()
    assert _drill(tmp_path, str(tmp_path / "empty")).exit_code == 3
    assert _drill(tmp_path, str(tmp_path / "missing")).exit_code == 3


def test_duplicate_scenario_names_are_refused(tmp_path: Path) -> None:
    """Two files with one name would overwrite each other's kept ledger: refused."""
    a = _write(tmp_path / "a", "small", SMALL.replace("STATE", "verified"))
    b = _write(tmp_path / "b", "small", SMALL.replace("STATE", "verified"))
    result = _drill(tmp_path, str(a), str(b))
    assert result.exit_code == 3 and "'small'" in result.output


def test_wrong_expectation_fails_with_step_expected_actual(tmp_path: Path) -> None:
    """A wrong expectation fails the drill naming the step, the expected and the actual value; exit 8."""
    path = _write(tmp_path, "small", SMALL.replace("STATE", "ready"))
    result = run_scenario(load_scenario(path))
    assert not result.ok
    [failure] = result.failures
    assert (failure.step, failure.key, failure.expected, failure.actual) == (4, "dpo-v5 state", "ready", "verified")
    assert failure.message() == 'step 4 (expect): dpo-v5 state: expected "ready", actual "verified"'
    cli = _drill(tmp_path, str(path))
    assert cli.exit_code == 8
    assert 'step 4 (expect): dpo-v5 state: expected "ready", actual "verified"' in cli.output
    report = json.loads(_drill(tmp_path, str(path), "--json").output)
    assert report["ok"] is False and report["scenarios"][0]["failures"][0]["step"] == 4


def test_unmet_refusal_and_unexpected_error_fail_the_drill(tmp_path: Path) -> None:
    """A command expected to be refused that succeeds, or one that fails unexpectedly, fails the drill."""
    text = SMALL.replace("  - expect: {candidate: dpo-v5, state: STATE}\n", "")
    refused = _write(tmp_path / "a", "refused", text.replace("check: dpo-v5", "check: dpo-v5\n    refused: InputError"))
    [failure] = run_scenario(load_scenario(refused)).failures
    assert (failure.step, failure.expected, failure.actual) == (3, "refused with InputError", "success (appended 1)")
    unexpected = _write(tmp_path / "b", "unexpected", text.replace("check: dpo-v5", "complete_recovery: dpo-v5"))
    result = run_scenario(load_scenario(unexpected))
    [failure] = result.failures
    assert failure.step == 3 and failure.expected == "success"
    assert failure.actual.startswith("IllegalCommandError: ")
    assert result.events == 3  # init, baseline, receive: the refused command appended nothing


@pytest.mark.parametrize("rng_seed", [1, 5], ids=["first-command", "last-command"])
def test_crash_really_kills_a_process_mid_append(ws: Workspace, rng_seed: int) -> None:
    """The child dies by SIGKILL inside command K: committed events stay, the killed one leaves nothing."""
    commands = 3
    planned = random.Random(rng_seed).randint(1, commands)  # 1 and 3
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.grpo())
        before = count_events(ws.db)
        outcome = crash_during_append(
            ledger.store,
            ws.db,
            candidate="grpo-v7",
            stage="sampling",
            commands=commands,
            rng=random.Random(rng_seed),
            actor="test",
        )
    after = count_events(ws.db)
    assert outcome.detail["returncode"] == -9
    assert outcome.detail["killed_in_command"] == planned
    assert before <= after < before + 2 * commands  # fail_stage appends 2 events per command
    assert after == before + 2 * (planned - 1)
    assert outcome.problems == ()


@pytest.mark.slow
def test_report_files_and_determinism(tmp_path: Path) -> None:
    """--report writes drill-report.json and .md; two runs are identical apart from timings."""
    paths = [str(SCENARIOS)]
    first = _drill(tmp_path, *paths, "--report", str(tmp_path / "r1"))
    second = _drill(tmp_path, *paths, "--report", str(tmp_path / "r2"), "--json")
    assert first.exit_code == 0, first.output
    assert second.exit_code == 0
    one = json.loads((tmp_path / "r1" / "drill-report.json").read_text())
    two = json.loads((tmp_path / "r2" / "drill-report.json").read_text())
    assert json.loads(second.output) == two
    assert set(one["timings"]["scenarios"]) == {p.stem for p in SHIPPED}
    one.pop("timings"), two.pop("timings")
    assert one == two
    assert one["summary"] == {"scenarios": len(SHIPPED), "passed": len(SHIPPED), "failed": 0, "inconclusive": 0}
    md = [(tmp_path / r / "drill-report.md").read_text().split("## Timings")[0] for r in ("r1", "r2")]
    assert md[0] == md[1]
    assert "| handoff-ready | handoff-ready.yaml | 11 | 7/7 | 5 | pass |" in md[0]
    assert str(Path(tempfile.gettempdir()) / "drill-") not in json.dumps(one)  # temp paths are hidden


def test_seed_override_changes_randomness_not_the_verdict(tmp_path: Path) -> None:
    """--seed replaces every scenario's seed; the fault scenarios hold under other seeds too."""
    files = [str(SCENARIOS / f"{n}.yaml") for n in ("fault-crash-during-append", "fault-tamper-event")]
    reports = [json.loads(_drill(tmp_path, *files, "--seed", str(seed), "--json").output) for seed in (2, 8)]
    for seed, report in zip((2, 8), reports, strict=True):
        assert report["ok"], report
        assert {s["seed"] for s in report["scenarios"]} == {seed}
    details = [r["scenarios"][1]["step_results"][4]["detail"]["seq"] for r in reports]
    assert details[0] != details[1]  # the tampered seq follows the seed


def test_keep_leaves_an_inspectable_ledger(tmp_path: Path) -> None:
    """--keep DIR leaves DIR/<name>.db that status, history and verify can read."""
    keep = tmp_path / "kept"
    result = _drill(tmp_path, str(SCENARIOS / "handoff-ready.yaml"), "--keep", str(keep), "--json")
    assert result.exit_code == 0
    assert json.loads(result.output)["scenarios"][0]["kept"] == "handoff-ready.db"
    db = keep / "handoff-ready.db"
    status = invoke(db, "status", "--json")
    assert status.exit_code == 0
    assert [(c["id"], c["state"]) for c in json.loads(status.output)] == [("dpo-v5", "ready")]
    history = json.loads(invoke(db, "history", "dpo-v5", "--json").output)
    assert [e["type"] for e in history] == ["CandidateReceived", "ChecksRecorded", "HandoffDecided"]
    assert {e["actor"] for e in history} == {"drill:handoff-ready"}
    assert json.loads(invoke(db, "verify", "--json").output)["ok"] is True


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--steps", "5"], "--steps applies only with --simulate"),
        (["--candidates=3"], "--candidates applies only with --simulate"),
        (["--runs", "1"], "--runs applies only with --simulate"),  # given, even at its default value
        (["--simulate"], "--simulate takes no scenario paths"),
    ],
    ids=["steps", "candidates", "runs", "simulate-with-paths"],
)
def test_simulate_options_go_with_simulate_only(tmp_path: Path, args: list[str], message: str) -> None:
    """A simulation's option without --simulate is a usage error (exit 2), not a drill that ignores it;
    scenario paths with --simulate likewise. Nothing runs, nothing is written."""
    report = tmp_path / "report"
    result = _drill(tmp_path, str(SCENARIOS / "handoff-ready.yaml"), *args, "--report", str(report))
    assert (result.exit_code, result.stdout) == (2, "")
    assert result.stderr.startswith(f"Error: {message} (see `") and result.stderr.count("\n") == 1
    assert not report.exists()


def test_kept_ledgers_are_private_and_never_overwritten(tmp_path: Path) -> None:
    """A kept ledger is made 0600 like every ledger file; a second --keep into the same folder is
    refused (exit 3, one line, nothing run) and the kept file is left as it was."""
    keep = tmp_path / "kept"
    path = str(SCENARIOS / "handoff-ready.yaml")
    assert _drill(tmp_path, path, "--keep", str(keep)).exit_code == 0
    db = keep / "handoff-ready.db"
    assert stat.S_IMODE(db.stat().st_mode) == 0o600
    kept = db.read_bytes()
    again = _drill(tmp_path, path, "--keep", str(keep), "--json")
    assert (again.exit_code, again.stdout) == (3, "")
    assert again.stderr == (
        f"Error: {db} exists: --keep never overwrites a kept ledger (move it away, or --keep another folder)\n"
    )
    assert db.read_bytes() == kept


def test_keep_refuses_a_file_that_appeared_while_the_drill_ran(tmp_path: Path) -> None:
    """The copy goes into a file the keep itself creates (O_EXCL): one made meanwhile is refused, not replaced."""
    from lifecycle_fsm.replay.drills.workspace import Workspace

    (tmp_path / "ws").mkdir()
    ws = Workspace(tmp_path / "ws", 1)
    with Ledger.open(ws.db) as led:
        led.init()
    keep = tmp_path / "kept"
    keep.mkdir()
    (keep / "late.db").write_bytes(b"someone else's")
    with pytest.raises(InputError, match=r"late\.db exists: --keep never overwrites"):
        ws.keep(keep, "late")
    assert (keep / "late.db").read_bytes() == b"someone else's"
    assert ws.keep(keep, "fresh") == "fresh.db" and stat.S_IMODE((keep / "fresh.db").stat().st_mode) == 0o600


def test_terminal_table_and_root_json_flag(tmp_path: Path) -> None:
    """Without --json a table shows scenario, steps, result and time; `--json` before `drill` works too."""
    path = str(SCENARIOS / "handoff-ready.yaml")
    table = _drill(tmp_path, path)
    assert table.exit_code == 0
    for word in ("scenario", "steps", "result", "time", "handoff-ready", "7/7", "pass"):
        assert word in table.output
    root = invoke(tmp_path / "unused.db", "--json", "drill", path)
    assert json.loads(root.output)["ok"] is True


def test_scenario_yaml_files_are_plain_yaml() -> None:
    """Every shipped file parses with yaml.safe_load alone (no tags, no custom loaders)."""
    for path in SHIPPED:
        assert isinstance(yaml.safe_load(path.read_text()), dict)


def test_drills_package_surface() -> None:
    """`replay.drills` re-exports what the CLI and tests import (sorted __all__); `import replay` does not load it."""
    from lifecycle_fsm.replay import drills

    assert list(drills.__all__) == sorted(drills.__all__)
    assert [n for n in drills.__all__ if not hasattr(drills, n)] == []
    assert {"build_report", "load_scenarios", "report_markdown", "run_drills", "run_scenario"} <= set(drills.__all__)
    code = "import sys, replay; print(any(m.startswith(('replay.drills', 'cattrs', 'yaml')) for m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=REPO)
    assert out.stdout.strip() == "False"


@pytest.mark.parametrize(
    ("to", "actual"),
    [
        (99, "--to 99 is past the head of the log (seq 4)"),
        (-1, "--to -1: a seq is never negative"),
    ],
)
def test_a_replay_step_to_a_seq_that_does_not_exist_fails(tmp_path: Path, to: int, actual: str) -> None:
    """`replay: {to: 99}` on a 4-event log replayed to the head and passed (`lifecycle replay --to 99`
    exits 3): the step proved nothing about seq 99. It fails naming the seq, as `expect: {as_of: 99}` does."""
    text = SMALL.replace("  - expect: {candidate: dpo-v5, state: STATE}\n", f"  - replay: {{to: {to}}}\n")
    result = run_scenario(load_scenario(_write(tmp_path, "replay", text)))
    [failure] = result.failures
    assert (failure.step, failure.key, failure.actual) == (4, "to", actual)
    good = text.replace(f"to: {to}", "to: 4")
    assert run_scenario(load_scenario(_write(tmp_path / "good", "replay", good))).ok


TAMPER_AGAIN = """\
name: tamper-again
seed: SEED
artifacts:
  sft: {type: baseline}
  grpo-v7: {type: grpo}
  trajectories: {type: trusted_state, size: SIZE}
steps:
  - activate_baseline: sft
  - receive: grpo-v7
  - tamper_artifact: trajectories
  - record_trusted_state: {candidate: grpo-v7, kind: trajectories, artifact: trajectories}
  - restore_artifact: trajectories
  - tamper_artifact: trajectories
  - fail_stage: {candidate: grpo-v7, stage: reward}
  - expect: {candidate: grpo-v7, recovery: {reused_state: false}}
"""


@pytest.mark.parametrize(("size", "seed"), [(1, 1), (2, 1), (2, 2), (2, 3), (2, 4), (256, 1)])
def test_a_second_tamper_never_writes_bytes_the_file_already_had(tmp_path: Path, size: int, seed: int) -> None:
    """Tamper, record, restore, tamper: the second flip must not write the recorded bytes back (the same
    offset, always for a 1-byte file), or the ledger would rightly reuse a state the drill "damaged"."""
    text = TAMPER_AGAIN.replace("SEED", str(seed)).replace("SIZE", str(size))
    result = run_scenario(load_scenario(_write(tmp_path, "tamper-again", text)))
    assert result.ok, [f.message() for f in result.failures]


def test_a_dangling_link_in_the_report_folder_is_an_existing_report_not_a_way_out(tmp_path: Path) -> None:
    """A dangling `drill-report.json` link is an existing report: refused without `--replace`, moved aside
    with it; the link's target is never written."""
    scenario = _write(tmp_path, "small", SMALL.replace("STATE", "verified"))
    report = tmp_path / "report"
    report.mkdir()
    victim = tmp_path / "victim.json"
    (report / "drill-report.json").symlink_to(victim)
    refused = _drill(tmp_path, str(scenario), "--report", str(report))
    assert refused.exit_code == 3 and "drill-report.json exists" in refused.output
    assert not victim.exists() and not (report / "drill-report.md").exists()
    replaced = _drill(tmp_path, str(scenario), "--report", str(report), "--replace")
    assert replaced.exit_code == 0, replaced.output
    assert not victim.exists()
    assert (report / "drill-report.json.previous").is_symlink()
    assert not (report / "drill-report.json").is_symlink() and json.loads((report / "drill-report.json").read_text())


def test_threaded_writers_do_not_hang_when_one_cannot_open_its_ledger(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`concurrently` in threads mode starts its writers at a barrier: one whose `Ledger.open` failed never
    reached it, and every other waited there for ever. A failed writer breaks the barrier and its error
    is the step's (an injected open failure: the others open the real ledger)."""
    import threading

    from lifecycle_fsm import Ledger, StoreError
    from lifecycle_fsm.replay.drills import writers

    real_open = Ledger.open

    class OneFails(Ledger):
        @classmethod
        def open(cls, target: object, **kwargs: object) -> Ledger:  # type: ignore[override]
            if str(kwargs.get("actor", "")).endswith(":w1"):
                raise StoreError("injected: writer 1 cannot open its ledger")
            return real_open(target, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(writers, "Ledger", OneFails)
    with Ledger.open(tmp_path / "l.db", synchronous="NORMAL") as ledger:
        ledger.init()
    raised: list[BaseException] = []

    def run() -> None:
        try:
            writers._threads(str(tmp_path / "l.db"), [[], [], []], "drill")
        except BaseException as e:
            raised.append(e)

    runner = threading.Thread(target=run, daemon=True)
    runner.start()
    runner.join(timeout=60)
    assert not runner.is_alive(), "the other writers still wait at the barrier"
    assert len(raised) == 1 and "injected: writer 1" in str(raised[0])
