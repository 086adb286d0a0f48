"""The `lifecycle` CLI as users see it: exit codes, one `Error:` line, `--json` documents, real subprocesses."""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import click
import pytest
from backends import DURABLE, backend_params
from click.testing import CliRunner, Result
from conftest import Workspace, cli, count_events, invoke, run_cli

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.cli import EXIT_CODES, main

HEX64 = re.compile(r"[0-9a-f]{64}")


def flip_byte(path: Path, offset: int = 100) -> None:
    """Change one byte of a file in place (a silent corruption)."""
    data = bytearray(path.read_bytes())
    data[offset] ^= 0xFF
    path.write_bytes(bytes(data))


def as_json(result: Result) -> Any:
    """The single JSON document a successful `--json` command printed on stdout."""
    assert result.exit_code == 0, result.output
    return json.loads(result.stdout)


@pytest.fixture
def populated(ws: Workspace) -> Workspace:
    """A ledger with a baseline, dpo-v5 in received and dpo-x in reject, plus a saved state folder."""
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.dpo())
        led.receive(ws.dpo("dpo-x", source_policy_version="old"))
        assert led.check("dpo-x").state == "reject"
    state = ws.root / "states" / "prompt_queue"
    state.mkdir(parents=True)
    (state / "queue.jsonl").write_text('{"prompt": "2+2"}\n')
    return ws


BAD_MANIFESTS = {
    "missing": None,
    "bad-json": "{not json",
    "not-an-object": "[1, 2]",
    "no-adapter": '{"policy_version": "dpo-v5", "artifacts": {"weights": {"path": "w"}}}',
}


@pytest.mark.parametrize("command", [["receive"], ["baseline", "activate"]], ids=["receive", "baseline"])
@pytest.mark.parametrize("problem", sorted(BAD_MANIFESTS))
def test_bad_manifest_is_one_error_line_exit_3(populated: Workspace, command: list[str], problem: str) -> None:
    """A missing, unparsable, non-object or adapter-less manifest exits 3 with one `Error:` line, appending nothing."""
    path = populated.root / "bad" / "manifest.json"
    if BAD_MANIFESTS[problem] is not None:
        path.parent.mkdir()
        path.write_text(BAD_MANIFESTS[problem])  # type: ignore[arg-type]
    before = count_events(populated.db)
    result = invoke(populated.db, *command, str(path))
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert count_events(populated.db) == before


def _changed_dpo(ws: Workspace) -> list[str]:
    return ["receive", str(ws.dpo(evaluation_version="eval-v9"))]


STATE = "{state}"
BAD_COMMANDS: list[tuple[str, Callable[[Workspace], list[str]] | list[str], int]] = [
    ("check-unknown-id", ["check", "nope"], 4),
    ("trusted-unknown-id", ["trusted", "nope", "prompt_queue", STATE], 4),
    ("untrust-unknown-id", ["untrust", "nope", "prompt_queue"], 4),
    ("fail-unknown-id", ["fail", "nope", "--stage", "update"], 4),
    ("recovered-unknown-id", ["recovered", "nope"], 4),
    ("handoff-unknown-id", ["handoff", "nope"], 4),
    ("status-unknown-id", ["status", "nope"], 4),
    ("history-unknown-id", ["history", "nope"], 4),
    ("explain-unknown-id", ["explain", "nope"], 4),
    ("explain-before-it-existed", ["explain", "dpo-v5", "--as-of", "1"], 4),
    ("fail-unknown-stage", ["fail", "dpo-v5", "--stage", "inference"], 3),
    ("trusted-unknown-kind", ["trusted", "dpo-v5", "optimizer", STATE], 3),
    ("untrust-unknown-kind", ["untrust", "dpo-v5", "optimizer"], 3),
    ("trusted-missing-path", ["trusted", "dpo-v5", "prompt_queue", "/nonexistent/state"], 3),
    ("window-backwards", ["window", "0"], 5),
    ("hash-missing-path", ["hash", "/nonexistent/adapter"], 3),
    ("receive-a-folder", lambda ws: ["receive", str(ws.root / "dpo-v5")], 3),
    ("baseline-a-folder", lambda ws: ["baseline", "activate", str(ws.root / "sft")], 3),
    ("receive-missing-manifest", ["receive", "/nonexistent/manifest.json"], 3),
    ("evaluation-blank", ["evaluation", "activate", " "], 3),
    ("recovered-on-received", ["recovered", "dpo-v5"], 5),
    ("handoff-on-received", ["handoff", "dpo-v5"], 5),
    ("untrust-never-recorded", ["untrust", "dpo-v5", "prompt_queue"], 5),
    ("check-on-reject", ["check", "dpo-x"], 5),
    ("fail-on-reject", ["fail", "dpo-x", "--stage", "sampling"], 5),
    ("trusted-on-reject", ["trusted", "dpo-x", "prompt_queue", STATE], 5),
    ("recovered-on-reject", ["recovered", "dpo-x"], 5),
    ("handoff-on-reject", ["handoff", "dpo-x"], 5),
    ("receive-different-manifest", _changed_dpo, 5),
    ("init-other-settings", ["init", "--max-window-age", "5"], 5),
]


@pytest.mark.parametrize("as_json_flag", [False, True], ids=["text", "json"])
@pytest.mark.parametrize(("args", "code"), [(a, c) for _, a, c in BAD_COMMANDS], ids=[n for n, _, _ in BAD_COMMANDS])
def test_bad_command_is_one_error_line_and_appends_nothing(
    populated: Workspace, args: Callable[[Workspace], list[str]] | list[str], code: int, as_json_flag: bool
) -> None:
    """Unknown id (4), bad stage/kind/path (3), a command the state refuses (5): one `Error:` line, nothing appended."""
    state = str(populated.root / "states" / "prompt_queue")
    argv = args(populated) if callable(args) else [state if a == STATE else a for a in args]
    before = count_events(populated.db)
    result = invoke(populated.db, *(["--json"] if as_json_flag else []), *argv)
    assert (result.exit_code, result.stdout) == (code, ""), result.output
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1, result.stderr
    assert count_events(populated.db) == before


def test_command_on_missing_ledger_is_input_error(tmp_path: Path) -> None:
    """A command that needs a ledger refuses a missing file (exit 3) and does not create it."""
    db = tmp_path / "absent.db"
    result = invoke(db, "check", "dpo-v5")
    assert result.exit_code == 3 and result.stderr.startswith("Error: no ledger") and not db.exists()


READ_ONLY = [
    ["status"],
    ["status", "dpo-v5"],
    ["history", "dpo-v5"],
    ["explain", "dpo-x"],
    ["replay"],
    ["verify"],
    ["diagram"],
    ["hash", "{adapter}"],
]


@pytest.mark.parametrize("args", READ_ONLY, ids=[" ".join(a) for a in READ_ONLY])
def test_json_flag_before_or_after_subcommand(populated: Workspace, args: list[str]) -> None:
    """`--json` before and after the subcommand gives the same single JSON document."""
    argv = [str(populated.root / "dpo-v5" / "adapter") if a == "{adapter}" else a for a in args]
    before = as_json(invoke(populated.db, "--json", *argv))
    after = as_json(invoke(populated.db, *argv, "--json"))
    assert before == after


def test_every_mutating_command_prints_one_json_document(ws: Workspace) -> None:
    """init, baseline, window, evaluation, receive, check, trusted, untrust, fail, recovered, handoff, checkpoint."""
    state = ws.root / "pq"
    state.mkdir()
    (state / "q").write_text("queue")
    steps = [
        ["init"],
        ["baseline", "activate", str(ws.baseline())],
        ["window", "2"],
        ["evaluation", "activate", "eval-v1"],
        ["receive", str(ws.grpo(evidence_window_index=2))],
        ["trusted", "grpo-v7", "prompt_queue", str(state)],
        ["untrust", "grpo-v7", "prompt_queue"],
        ["fail", "grpo-v7", "--stage", "reward"],
        ["recovered", "grpo-v7"],
        ["check", "grpo-v7"],
        ["handoff", "grpo-v7"],
        ["checkpoint"],
    ]
    for i, step in enumerate(steps):
        argv = ["--json", *step] if i % 2 else [*step, "--json"]
        doc = as_json(invoke(ws.db, *argv))
        assert isinstance(doc, dict), step
    assert as_json(invoke(ws.db, "status", "grpo-v7", "--json"))["state"] == "ready"


def test_status_json_shapes(populated: Workspace) -> None:
    """`status --json` is an array of candidate objects; `status ID --json` is one of them."""
    docs = as_json(invoke(populated.db, "status", "--json"))
    assert isinstance(docs, list) and [d["id"] for d in docs] == ["dpo-v5", "dpo-x"]
    for d in docs:
        assert {"id", "kind", "state", "version"} <= d.keys()
    one = as_json(invoke(populated.db, "status", "dpo-x", "--json"))
    assert (one["id"], one["kind"], one["state"], one["version"]) == ("dpo-x", "dpo", "reject", 2)
    assert one == docs[1]


def test_fail_json_is_the_recovery_plan(populated: Workspace) -> None:
    """`fail --json` prints the plan (stage, recovery_state, reused_state, action) and the new state."""
    state = str(populated.root / "states" / "prompt_queue")
    assert invoke(populated.db, "trusted", "dpo-v5", "prompt_queue", state).exit_code == 0
    doc = as_json(invoke(populated.db, "fail", "dpo-v5", "--stage", "reward", "--json"))
    assert {k: doc[k] for k in ("stage", "recovery_state", "reused_state", "action", "state")} == {
        "stage": "reward",
        "recovery_state": "prompt_queue",
        "reused_state": True,
        "action": "restart_sampling_from_prompt_queue",
        "state": "recovering",
    }


def test_hash_json(populated: Workspace) -> None:
    """`hash --json` gives path, the bare sha256 that hash_directory computes, and the algorithm: the tree
    format for a directory, `sha256` for a file."""
    adapter = populated.root / "dpo-v5" / "adapter"
    doc = as_json(invoke(populated.db, "hash", str(adapter), "--json"))
    assert doc == {"path": str(adapter), "sha256": hash_directory(adapter), "algorithm": "lifecycle-fsm/tree-v1"}
    assert HEX64.fullmatch(doc["sha256"])
    text = invoke(populated.db, "hash", str(adapter))
    assert text.stdout.split()[0] == doc["sha256"]
    weights = adapter / "adapter_model.safetensors"  # a single file: the plain sha256 `sha256sum` prints
    doc = as_json(invoke(populated.db, "hash", str(weights), "--json"))
    assert doc == {
        "path": str(weights),
        "sha256": hashlib.sha256(weights.read_bytes()).hexdigest(),
        "algorithm": "sha256",
    }


@pytest.mark.parametrize(("root", "problem"), [("nowhere", "does not exist"), ("a-file", "is not a folder")])
def test_hash_root_that_is_no_folder_says_so(tmp_path: Path, root: str, problem: str) -> None:
    """A missing --root said "path escapes root: PATH" (exit 3); a file as --root was a usage error (exit 2)."""
    (tmp_path / "a-file").write_text("x")
    done = run_cli(tmp_path / "l.db", "hash", str(tmp_path / "a-file"), "--root", str(tmp_path / root))
    assert (done.returncode, done.stdout) == (3, "")
    assert done.stderr == f"Error: --root {tmp_path / root} {problem}\n"
    assert not (tmp_path / "l.db").exists()


def test_verify_json(populated: Workspace) -> None:
    """`verify --json` reports ok, the event count and the head's seq and hash."""
    doc = as_json(invoke(populated.db, "verify", "--json"))
    assert doc["ok"] is True and doc["events"] == count_events(populated.db)
    assert doc["head"]["seq"] == doc["events"] and HEX64.fullmatch(doc["head"]["hash"])


def test_verify_with_worker_processes(populated: Workspace) -> None:
    """`verify --jobs 2` (a real process, spawning its workers) reports what one process reports."""
    done = run_cli(populated.db, "verify", "--jobs", "2", "--json")
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout) == as_json(invoke(populated.db, "verify", "--json"))


def test_explain_json(populated: Workspace) -> None:
    """`explain --json` names the state, the specific reason codes and the decisive event with its evidence."""
    doc = as_json(invoke(populated.db, "explain", "dpo-x", "--json"))
    assert (doc["id"], doc["state"], doc["reason_codes"]) == ("dpo-x", "reject", ["source_policy"])
    event = doc["decisive_event"]
    assert event["type"] == "ChecksRecorded" and isinstance(event["seq"], int)
    assert event["evidence"]["freshness"]["failed_checks"] == ["source_policy"]


def test_replay_json_and_checkpoint(populated: Workspace) -> None:
    """`replay --json` lists states and the checkpoint it started from (null without one or with --full)."""
    first = as_json(invoke(populated.db, "replay", "--json"))
    assert first["checkpoint"] is None
    assert first["states"] == as_json(invoke(populated.db, "status", "--json"))
    position = as_json(invoke(populated.db, "checkpoint", "--json"))["position"]
    again = as_json(invoke(populated.db, "replay", "--json"))
    assert again["checkpoint"] == position and again["states"] == first["states"]
    assert as_json(invoke(populated.db, "replay", "--full", "--json"))["checkpoint"] is None


def test_diagram_prints_mermaid(ws: Workspace) -> None:
    """`diagram` prints a Mermaid state diagram naming every state."""
    result = invoke(ws.db, "diagram")
    assert result.exit_code == 0 and "stateDiagram-v2" in result.stdout
    for state in ("received", "verified", "recovering", "tune", "reject", "ready"):
        assert state in result.stdout


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[str, ...]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        yield (*path, name)
        if isinstance(command := group.get_command(ctx, name), click.Group):
            yield from _commands(command, (*path, name))


ALL_COMMANDS = [(), *_commands(main)]


@pytest.mark.parametrize("path", ALL_COMMANDS, ids=[" ".join(p) or "lifecycle" for p in ALL_COMMANDS])
def test_help_works_for_every_command(path: tuple[str, ...]) -> None:
    """`--help` exits 0 with usage for the group and every command and subcommand."""
    result = CliRunner().invoke(main, [*path, "--help"], catch_exceptions=False)
    assert result.exit_code == 0 and result.stdout.startswith("Usage: ")


def test_help_lists_every_exit_code() -> None:
    """`lifecycle --help` gives every documented exit code and what it means (compared without the
    whitespace click's wrapping adds: it may break a line after a hyphen)."""
    shown = "".join(CliRunner().invoke(main, ["--help"], catch_exceptions=False).stdout.split())
    assert all(f"{code}{''.join(text.split())}" in shown for code, text in EXIT_CODES.items())


def test_the_cli_defaults_are_the_ledgers() -> None:
    """`init` and `audit` offer the seed's window defaults, the ones `Ledger.init` uses."""
    from lifecycle_fsm.decisions import DEFAULT_ACTIVE_WINDOW, DEFAULT_MAX_WINDOW_AGE

    for name in ("init", "audit"):
        command = main.get_command(click.Context(main), name)
        assert command is not None
        options = {p.name: p.default for p in command.params}
        assert (options["max_window_age"], options["active_window"]) == (DEFAULT_MAX_WINDOW_AGE, DEFAULT_ACTIVE_WINDOW)


def test_lifecycle_db_env_var_is_honoured(ws: Workspace, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without --db, LIFECYCLE_DB names the ledger file."""
    monkeypatch.chdir(ws.root)
    db = ws.root / "from-env.db"
    result = CliRunner().invoke(main, ["init"], env={"LIFECYCLE_DB": str(db)}, catch_exceptions=False)
    assert result.exit_code == 0 and count_events(db) == 1
    assert not (ws.root / "lifecycle.db").exists()


@pytest.mark.slow
@pytest.mark.parametrize("backend", backend_params(DURABLE))
def test_end_to_end_through_real_subprocesses(ws: Workspace, backend: str, request: pytest.FixtureRequest) -> None:
    """Two candidates reach ready; one flipped byte rejects the DPO one, and explain shows expected vs actual.

    Once on an SQLite file and once on PostgreSQL (`--db postgresql://…`).
    """
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")

    def ok(*args: str) -> str:
        proc = run_cli(target, *args)
        assert (proc.returncode, proc.stderr) == (0, ""), (args, proc.stderr)
        return proc.stdout

    sft, dpo, grpo = ws.baseline(), ws.dpo(), ws.grpo()
    ok("init")
    ok("baseline", "activate", str(sft))
    ok("receive", str(dpo))
    ok("--json", "receive", str(grpo))
    for cid in ("dpo-v5", "grpo-v7"):
        assert json.loads(ok("check", cid, "--json"))["state"] == "verified"
        assert json.loads(ok("handoff", cid, "--json"))["state"] == "ready"
    assert {d["id"]: d["state"] for d in json.loads(ok("status", "--json"))} == {"dpo-v5": "ready", "grpo-v7": "ready"}

    flip_byte(ws.root / "dpo-v5" / "adapter" / "adapter_model.safetensors")
    assert json.loads(ok("check", "dpo-v5", "--json"))["state"] == "reject"
    doc = json.loads(ok("explain", "dpo-v5", "--json"))
    assert (doc["state"], doc["reason_codes"]) == ("reject", ["artifact"])
    artifact = doc["decisive_event"]["evidence"]["artifact"]
    assert HEX64.fullmatch(artifact["expected"]) and HEX64.fullmatch(artifact["actual"])
    assert artifact["expected"] != artifact["actual"]
    assert artifact["expected"] == json.loads(dpo.read_text())["artifacts"]["adapter"]["sha256"]
    text = ok("explain", "dpo-v5")
    assert "expected" in text and "actual" in text and artifact["actual"] in text
    assert json.loads(ok("status", "grpo-v7", "--json"))["state"] == "ready"
    ok("verify")
    assert "Usage:" in ok("--help")


@pytest.mark.parametrize("level", ["info", "debug"])
def test_log_level_writes_json_lines_on_stderr(tmp_path: Path, level: str) -> None:
    """`--log-level info` (or debug) writes structlog's JSON lines to stderr; the default writes nothing."""
    done = cli(tmp_path / "l.db", "--log-level", level, "init")
    assert done.returncode == 0, done.stderr
    events = [json.loads(line) for line in done.stderr.splitlines() if line.startswith("{")]
    assert [e["event"] for e in events if e["event"] == "event_appended"] == ["event_appended"]
    assert {e["level"] for e in events} <= {"info", "debug"}
    quiet = cli(tmp_path / "l.db", "window", "2")
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_a_commands_warning_reaches_stderr_in_the_configured_format(tmp_path: Path) -> None:
    """A warning a command's library code emits is one structlog JSON line on stderr at the default
    level (structlog is set up by that first warning), and nothing at `--log-level error`."""
    import sqlite3

    from lifecycle_fsm.replay.checkpoints import FINGERPRINT_PARTS
    from lifecycle_fsm.store.chain import canonical_json

    db = tmp_path / "l.db"
    assert cli(db, "init").returncode == 0 and cli(db, "checkpoint").returncode == 0
    with sqlite3.connect(db) as conn:  # a checkpoint built under other rules: used, with a warning
        other_rules = canonical_json({**FINGERPRINT_PARTS, "rules": "0" * 64})
        conn.execute("UPDATE checkpoints SET fingerprint = ?", (other_rules,))
    warned = run_cli(db, "status")
    assert (warned.returncode, warned.stdout) == (0, "no candidates\n")
    (line,) = warned.stderr.splitlines()
    event = json.loads(line)
    assert (event["event"], event["level"], event["rules"]) == ("checkpoint_other_rules", "warning", "0" * 64)
    assert "timestamp" in event
    quiet = run_cli(db, "--log-level", "error", "status")
    assert (quiet.returncode, quiet.stderr) == (0, "")


def test_init_creates_the_ledger_with_its_guards(tmp_path: Path) -> None:
    """A new ledger file has its tables and the triggers that refuse UPDATE, DELETE and REPLACE."""
    import sqlite3

    assert cli(tmp_path / "new.db", "--json", "init").returncode == 0
    with sqlite3.connect(tmp_path / "new.db") as conn:
        names = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
    assert {
        "events",
        "streams",
        "meta",
        "events_refuse_update",
        "events_refuse_delete",
        "events_refuse_replace",
    } <= names
