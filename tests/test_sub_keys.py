"""Idempotency keys and their sub-keys (README "Idempotency keys", SPEC §10).

A command that appends several events keys them KEY, KEY/1, KEY/2, …; a caller's key
ending in `/<digits>` would share that namespace. Such a key is refused by every keyed
command (InputError, exit 3, nothing appended), and a retry counts only the events
its own command appended, even in a ledger an older release let such keys into.
"""

from __future__ import annotations

import sqlite3
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson
import pytest

from lifecycle_fsm import InputError, Ledger
from lifecycle_fsm import command_path as command_path_module
from tests.conftest import Workspace, cli, count_events


def _files(ws: Workspace) -> dict[str, Path]:
    (ws.root / "queue.jsonl").write_text('{"prompt": 1}\n')
    return {"sft": ws.baseline(), "dpo": ws.dpo(), "grpo": ws.grpo(), "queue": ws.root / "queue.jsonl"}


def _error_line(stderr: str) -> str:
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert len(lines) == 1, stderr
    assert lines[0].startswith("Error:"), stderr
    return lines[0]


@pytest.fixture
def older_release(monkeypatch: pytest.MonkeyPatch) -> None:
    """Writes as a release before keys ending in /<number> were refused (no key check)."""
    monkeypatch.setattr(command_path_module, "check_event_id", lambda event_id: event_id)


# --- every keyed command refuses a key ending in /<digits> --------------------------------

API_COMMANDS: dict[str, Callable[[Ledger, dict[str, Path], str], Any]] = {
    "init": lambda led, f, k: led.init(2, 1, event_id=k),
    "baseline": lambda led, f, k: led.activate_baseline(f["sft"], event_id=k),
    "window": lambda led, f, k: led.advance_window(3, event_id=k),
    "evaluation": lambda led, f, k: led.activate_evaluation("eval-v9", event_id=k),
    "receive": lambda led, f, k: led.receive(f["dpo"], event_id=k),
    "check": lambda led, f, k: led.check("grpo-v7", event_id=k),
    "trusted": lambda led, f, k: led.record_trusted_state("grpo-v7", "prompt_queue", f["queue"], event_id=k),
    "untrust": lambda led, f, k: led.invalidate_trusted_state("grpo-v7", "prompt_queue", event_id=k),
    "fail": lambda led, f, k: led.fail_stage("grpo-v7", "reward", event_id=k),
    "recovered": lambda led, f, k: led.complete_recovery("grpo-v7", event_id=k),
    "handoff": lambda led, f, k: led.hand_off("grpo-v7", event_id=k),
}


def _seeded(ws: Workspace) -> dict[str, Path]:
    """A ledger with a baseline and a GRPO candidate holding one trusted state; its files."""
    files = _files(ws)
    with ws.ledger() as ledger:
        ledger.init()
        ledger.activate_baseline(files["sft"])
        ledger.receive(files["grpo"])
        ledger.record_trusted_state("grpo-v7", "prompt_queue", files["queue"])
    return files


@pytest.mark.parametrize("key", ["run/7/1", "ev/1", "x/0", "/12", "a/b/0042"])
@pytest.mark.parametrize("command", sorted(API_COMMANDS))
def test_every_api_command_refuses_a_key_ending_in_a_number(ws: Workspace, command: str, key: str) -> None:
    files = _seeded(ws)
    before = count_events(ws.db)
    with ws.ledger() as ledger, pytest.raises(InputError, match=r"ends with '/<number>'"):
        API_COMMANDS[command](ledger, files, key)
    assert count_events(ws.db) == before


@pytest.mark.parametrize("key", ["run-7", "run-42/0017/fail-reward", "v1.2", "7", "a/1b", "a/1/", "a/x1"])
def test_keys_not_ending_in_slash_digits_are_accepted(ledger: Ledger, key: str) -> None:
    assert ledger.init(2, 1, event_id=key).events[0].event_id == key


def test_an_empty_key_is_refused(ws: Workspace, ledger: Ledger) -> None:
    with pytest.raises(InputError, match="non-empty"):
        ledger.init(event_id="")
    assert count_events(ws.db) == 0


CLI_COMMANDS: dict[str, Callable[[dict[str, Path]], list[str]]] = {
    "init": lambda f: ["init"],
    "baseline": lambda f: ["baseline", "activate", str(f["sft"])],
    "window": lambda f: ["window", "3"],
    "evaluation": lambda f: ["evaluation", "activate", "eval-v9"],
    "receive": lambda f: ["receive", str(f["dpo"])],
    "check": lambda f: ["check", "grpo-v7"],
    "trusted": lambda f: ["trusted", "grpo-v7", "prompt_queue", str(f["queue"])],
    "untrust": lambda f: ["untrust", "grpo-v7", "prompt_queue"],
    "fail": lambda f: ["fail", "grpo-v7", "--stage", "reward"],
    "recovered": lambda f: ["recovered", "grpo-v7"],
    "handoff": lambda f: ["handoff", "grpo-v7"],
}


@pytest.fixture
def cli_ledger(ws: Workspace) -> dict[str, Path]:
    return _seeded(ws)


@pytest.mark.parametrize("command", sorted(CLI_COMMANDS))
def test_every_cli_write_refuses_a_key_ending_in_a_number(
    ws: Workspace, cli_ledger: dict[str, Path], command: str
) -> None:
    before = count_events(ws.db)
    done = cli(ws.db, "--json", *CLI_COMMANDS[command](cli_ledger), "--event-id", "run/7/1")
    assert done.returncode == 3, (done.stdout, done.stderr)
    line = _error_line(done.stderr)
    assert "run/7/1" in line and "/<number>" in line and "KEY/1" in line
    assert done.stdout == ""
    assert count_events(ws.db) == before


# --- the tester's reproductions ---------------------------------------------------------------


def test_a_check_cannot_take_the_sub_key_of_a_settings_command(ws: Workspace, cli_ledger: dict[str, Path]) -> None:
    """`evaluation activate v --event-id ev`, then `check G --event-id ev/1`: refused, and a retry of the
    first command reports its own events only (it used to add the check's seq and candidate)."""
    first = cli(ws.db, "--json", "evaluation", "activate", "v", "--event-id", "ev")
    assert first.returncode == 0, first.stderr
    refused = cli(ws.db, "check", "grpo-v7", "--event-id", "ev/1")
    assert refused.returncode == 3
    assert "ev/1" in _error_line(refused.stderr)
    again = cli(ws.db, "--json", "evaluation", "activate", "v", "--event-id", "ev")
    assert again.returncode == 0, again.stderr
    assert orjson.loads(again.stdout)["events"] == orjson.loads(first.stdout)["events"]


def test_a_never_used_key_is_not_blocked_by_a_key_ending_in_its_number(
    ws: Workspace, cli_ledger: dict[str, Path]
) -> None:
    """`check X --event-id run/7/1` is refused (and so is `run/7`, which ends in a number too), so the
    plan of `fail G --event-id run-7` gets `run-7/1` whatever keys were tried before."""
    assert cli(ws.db, "check", "grpo-v7", "--event-id", "run-7/1").returncode == 3
    assert cli(ws.db, "fail", "grpo-v7", "--stage", "reward", "--event-id", "run/7").returncode == 3
    failed = cli(ws.db, "--json", "fail", "grpo-v7", "--stage", "reward", "--event-id", "run-7")
    assert failed.returncode == 0, failed.stderr
    ids = [row[0] for row in sqlite3.connect(ws.db).execute("SELECT event_id FROM events WHERE event_id LIKE 'run%'")]
    assert ids == ["run-7", "run-7/1"]


# --- retries count only their own command's events, even with keys stored by older releases ----------


def test_a_settings_retry_ignores_a_foreign_event_under_its_sub_key(
    ws: Workspace, cli_ledger: dict[str, Path], older_release: None
) -> None:
    """An older release stored a check keyed `ev/1` right after `evaluation activate v --event-id ev`
    (the next seq): the retry reports seq of the activation only, and invalidates nothing."""
    first = cli(ws.db, "--json", "evaluation", "activate", "v", "--event-id", "ev")
    assert first.returncode == 0, first.stderr
    assert orjson.loads(first.stdout)["invalidated"] == []
    with ws.ledger() as ledger:  # in this process: the older release's writer (no key check)
        foreign = ledger.check("grpo-v7", event_id="ev/1").events
    assert foreign[0].seq == orjson.loads(first.stdout)["events"][-1] + 1  # adjacent: seq alone cannot tell
    again = cli(ws.db, "--json", "evaluation", "activate", "v", "--event-id", "ev")
    assert again.returncode == 0, again.stderr
    doc = orjson.loads(again.stdout)
    assert doc["events"] == orjson.loads(first.stdout)["events"]
    assert doc["invalidated"] == []
    assert doc["appended"] is False


def test_a_candidate_retry_ignores_a_foreign_event_under_its_sub_key(
    ws: Workspace, cli_ledger: dict[str, Path], older_release: None
) -> None:
    """`check G --event-id c`, then (older release) `check G --event-id c/1` at the next seq and version:
    a retry of the first check is one event."""
    with ws.ledger() as ledger:
        first = ledger.check("grpo-v7", event_id="c")
        foreign = ledger.check("grpo-v7", event_id="c/1")
        assert (foreign.events[0].seq, foreign.events[0].version) == (
            first.events[0].seq + 1,
            first.events[0].version + 1,
        )
    with ws.ledger() as ledger:
        again = ledger.check("grpo-v7", event_id="c")
    assert again.duplicate
    assert [e.seq for e in again.events] == [first.events[0].seq]


def test_a_fail_retry_still_returns_both_of_its_events(ws: Workspace, cli_ledger: dict[str, Path]) -> None:
    with ws.ledger() as ledger:
        first = ledger.fail_stage("grpo-v7", "reward", event_id="run/fail")
    with ws.ledger() as ledger:
        again = ledger.fail_stage("grpo-v7", "reward", event_id="run/fail")
    assert again.duplicate
    assert [e.event_id for e in again.events] == ["run/fail", "run/fail/1"]
    assert [e.seq for e in again.events] == [e.seq for e in first.events]
    assert again.plan == first.plan


def test_a_settings_retry_still_returns_its_fan_out(ws: Workspace, cli_ledger: dict[str, Path]) -> None:
    with ws.ledger() as ledger:
        ledger.receive(cli_ledger["dpo"])
        ledger.check("grpo-v7")
        ledger.check("dpo-v5")
        first = ledger.activate_evaluation("eval-v2", event_id="run/eval")
    assert sorted(first.invalidated) == ["dpo-v5", "grpo-v7"]
    with ws.ledger() as ledger:
        again = ledger.activate_evaluation("eval-v2", event_id="run/eval")
    assert again.duplicate
    assert [e.seq for e in again.events] == [e.seq for e in first.events]
    assert sorted(again.invalidated) == sorted(first.invalidated)


def test_keys_stored_by_an_older_release_still_read(
    ws: Workspace, cli_ledger: dict[str, Path], older_release: None
) -> None:
    with ws.ledger() as ledger:
        stored = ledger.check("grpo-v7", event_id="old/3").events[0]
    log = cli(ws.db, "--json", "log", "--stream", "grpo-v7")
    assert log.returncode == 0, log.stderr
    assert stored.seq in [e["seq"] for e in orjson.loads(log.stdout)]
    assert cli(ws.db, "verify").returncode == 0
    with ws.ledger() as ledger:
        assert [e.event_id for e in ledger.events(stream="grpo-v7") if e.seq == stored.seq] == ["old/3"]
