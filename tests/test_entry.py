"""The `lifecycle` script's click-free `status ID` (`lifecycle_fsm/cli/entry.py`) is click's, byte for byte.

Each case runs twice in real subprocesses: through the entry (`python -m lifecycle_fsm`, what
the script runs) and through the click group itself (`lifecycle_fsm.cli.main`), and the exit
code, stdout and stderr must be equal. Which path the entry took is read from `-X importtime`
(click imported or not): the shapes it knows answer without click, everything else goes to
click unchanged.
"""

from __future__ import annotations

import json
import os
import pty
import re
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import Workspace, run_cli

from lifecycle_fsm.cli.entry import StatusRequest, _status, status_request
from lifecycle_fsm.ledger import Ledger

GROUP = "import sys; from lifecycle_fsm.cli import main; main(prog_name='lifecycle')"
LONG_ID = "c" * 250  # wider than a pipe's table: rich lays it out


def _run(argv: list[str], env: dict[str, str], *, through_entry: bool, stdout: int | None = None) -> tuple:
    """(exit code, stdout, stderr without -X importtime's lines, whether click was imported)."""
    how = ["-m", "lifecycle_fsm"] if through_entry else ["-c", GROUP]
    done = subprocess.run(
        [sys.executable, "-X", "importtime", *how, *argv],
        stdout=subprocess.PIPE if stdout is None else stdout, stderr=subprocess.PIPE, env=env, check=False,
        timeout=120,
    )  # fmt: skip
    lines = done.stderr.decode().splitlines(keepends=True)
    imported = {line.rsplit("|", 1)[1].strip() for line in lines if line.startswith("import time:") and "|" in line}
    stderr = "".join(line for line in lines if not line.startswith("import time:"))
    stderr = re.sub(r'"timestamp":"[^"]+"', '"timestamp":"T"', stderr)  # a log line's own clock
    return done.returncode, done.stdout, stderr, "click" in imported


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")}
    return {**env, **extra}


@pytest.fixture
def ledgers(ws: Workspace) -> dict[str, Path]:
    """A ledger with candidates in several states (one rejected, one non-ASCII, one long id), and broken files."""
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.grpo("cand-1"), candidate_id="cand-1")
        led.receive(ws.dpo("bad"), candidate_id="bad")
        led.receive(ws.grpo("stale", source_policy_version="f" * 64), candidate_id="stale")
        led.check("stale")
        led.receive(ws.grpo("cand-e"), candidate_id="cand-é")
        led.receive(ws.grpo("long"), candidate_id=LONG_ID)
    empty = ws.root / "empty.db"
    empty.write_bytes(b"")
    garbage = ws.root / "garbage.db"
    garbage.write_bytes(b"not a ledger at all\n" * 100)
    tampered = ws.root / "tampered.db"
    with sqlite3.connect(ws.db) as src, sqlite3.connect(tampered) as dst:
        src.backup(dst)
    with sqlite3.connect(tampered) as conn:
        conn.execute("DROP TRIGGER IF EXISTS events_refuse_update")
        conn.execute("UPDATE events SET actor = 'mallory' WHERE stream_id = 'candidate:cand-1'")
    checkpointed = ws.root / "checkpointed.db"
    with sqlite3.connect(ws.db) as src, sqlite3.connect(checkpointed) as dst:
        src.backup(dst)
    assert run_cli(checkpointed, "checkpoint").returncode == 0
    garbled = ws.root / "garbled.db"  # a checkpoint copy that fails its digest: skipped with a warning
    with sqlite3.connect(checkpointed) as src, sqlite3.connect(garbled) as dst:
        src.backup(dst)
    with sqlite3.connect(garbled) as conn:
        conn.execute("UPDATE checkpoint_streams SET state = replace(state, '\"received\"', '\"ready\"')")
    return {"ok": ws.db, "empty": empty, "garbage": garbage, "tampered": tampered, "missing": ws.root / "no.db",
            "dir": ws.root, "checkpointed": checkpointed, "garbled": garbled}  # fmt: skip


COMPLETION = {"_LIFECYCLE_COMPLETE": "bash_complete", "COMP_WORDS": "lifecycle status c", "COMP_CWORD": "2",
              "LIFECYCLE_DB": "{ok}"}  # fmt: skip
# (case id, argv with {name} for a ledger path, extra environment, whether the entry answers without click)
CASES = [
    ("text", ["--db", "{ok}", "status", "cand-1"], {}, True),
    ("json before", ["--db", "{ok}", "--json", "status", "cand-1"], {}, True),
    ("json after", ["--db", "{ok}", "status", "cand-1", "--json"], {}, True),
    ("json between", ["--db", "{ok}", "status", "--json", "cand-1"], {}, True),
    ("json first", ["--json", "--db", "{ok}", "status", "cand-1"], {}, True),
    ("db=", ["--db={ok}", "status", "cand-1"], {}, True),
    ("db from env", ["status", "cand-1"], {"LIFECYCLE_DB": "{ok}"}, True),
    ("option over env", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_DB": "{missing}"}, True),
    ("empty env var", ["status", "cand-1"], {"LIFECYCLE_DB": "", "LIFECYCLE_LOG_LEVEL": ""}, True),
    ("log level", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_LOG_LEVEL": "debug"}, True),
    ("actor env", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_ACTOR": "someone"}, True),
    ("rejected", ["--db", "{ok}", "status", "stale"], {}, True),
    ("rejected json", ["--db", "{ok}", "--json", "status", "stale"], {}, True),
    ("non-ascii id", ["--db", "{ok}", "status", "cand-é"], {}, True),
    ("long id", ["--db", "{ok}", "status", LONG_ID], {}, True),
    ("unknown id", ["--db", "{ok}", "status", "nobody"], {}, True),
    ("db named status", ["--db", "status", "status", "cand-1"], {}, True),
    ("memory", ["--db", ":memory:", "status", "cand-1"], {}, True),
    ("empty file", ["--db", "{empty}", "status", "cand-1"], {}, True),
    ("missing file", ["--db", "{missing}", "status", "cand-1"], {}, True),
    ("a directory", ["--db", "{dir}", "status", "cand-1"], {}, True),
    ("not a ledger", ["--db", "{garbage}", "status", "cand-1"], {}, True),
    ("edited row", ["--db", "{tampered}", "status", "cand-1"], {}, True),
    ("checkpoint copy", ["--db", "{checkpointed}", "--json", "status", "cand-1"], {}, True),
    ("garbled copy", ["--db", "{garbled}", "status", "cand-1"], {}, True),
    # everything else is click's
    ("no id", ["--db", "{ok}", "status"], {}, False),
    ("two ids", ["--db", "{ok}", "status", "cand-1", "stale"], {}, False),
    ("help", ["--db", "{ok}", "status", "--help"], {}, False),
    ("as-of", ["--db", "{ok}", "status", "cand-1", "--as-of", "3"], {}, False),
    ("other option", ["--db", "{ok}", "--actor", "x", "status", "cand-1"], {}, False),
    ("unknown option", ["--db", "{ok}", "status", "cand-1", "-x"], {}, False),
    ("dash id", ["--db", "{ok}", "status", "--", "-x"], {}, False),
    ("db twice", ["--db", "{missing}", "--db", "{ok}", "status", "cand-1"], {}, False),
    ("db value like an option", ["--db", "--json", "status", "cand-1"], {}, False),
    ("empty db=", ["--db=", "status", "cand-1"], {}, False),
    ("another command", ["--db", "{ok}", "history", "cand-1"], {}, False),
    ("whole status", ["--db", "{ok}", "status"], {}, False),
    ("group help", ["--help"], {}, False),
    ("nothing", [], {}, False),
    ("bad log level", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_LOG_LEVEL": "loud"}, False),
    ("synchronous env", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_SYNCHRONOUS": "normal"}, False),
    ("bad synchronous", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_SYNCHRONOUS": "sometimes"}, False),
    ("signing key env", ["--db", "{ok}", "status", "cand-1"], {"LIFECYCLE_SIGNING_KEY": "{dir}"}, False),
    ("completion", ["status", "c"], COMPLETION, False),
    ("control character", ["--db", "{ok}", "status", "cand\x1b[31m"], {}, False),
]


@pytest.mark.parametrize(("argv", "extra", "fast"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_the_entry_answers_as_the_click_group(ledgers: dict[str, Path], argv: list[str], extra: dict[str, str],
                                              fast: bool) -> None:  # fmt: skip
    names = {k: str(v) for k, v in ledgers.items()}
    args = [a.format(**names) if "{" in a else a for a in argv]
    env = _env(**{k: v.format(**names) for k, v in extra.items()})
    code, out, err, clicked = _run(args, env, through_entry=True)
    assert (code, out, err) == _run(args, env, through_entry=False)[:3]
    assert clicked is not fast
    if fast and code == 0:
        assert out


@pytest.mark.postgres
def test_postgresql_ledger(ws: Workspace, pg_url: str) -> None:
    """`--db postgresql://…`: the same state and the same unknown-id refusal on both paths."""
    with Ledger.open(pg_url) as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.grpo("cand-1"), candidate_id="cand-1")
    for args in (["--db", pg_url, "status", "cand-1"], ["--db", pg_url, "--json", "status", "nobody"]):
        code, out, err, clicked = _run(args, _env(), through_entry=True)
        assert (code, out, err) == _run(args, _env(), through_entry=False)[:3]
        assert not clicked and code in (0, 4)


def test_a_skipped_copy_warns_the_same_line(ledgers: dict[str, Path]) -> None:
    """The garbled copy is skipped with one warning (a JSON line on stderr) on both paths; the state is the fold's."""
    args = ["--db", str(ledgers["garbled"]), "--json", "status", "cand-1"]
    code, out, err, clicked = _run(args, _env(), through_entry=True)
    assert (code, clicked) == (0, False) and json.loads(out)["state"] == "received"
    assert json.loads(err)["event"] == "stream_snapshot_skipped" and "sha256" in json.loads(err)["reason"]


def test_a_terminal_gets_clicks_path(ledgers: dict[str, Path]) -> None:
    """On a terminal rich draws the table (colours, its width): the entry leaves that to click."""
    leader, follower = pty.openpty()
    try:
        args = ["--db", str(ledgers["ok"]), "status", "cand-1"]
        code, _, err, clicked = _run(args, _env(), through_entry=True, stdout=follower)
        assert (code, err, clicked) == (0, "", True)
    finally:
        os.close(leader)
        os.close(follower)


def test_a_closed_pipe_ends_as_with_click(ledgers: dict[str, Path]) -> None:
    """The reader went away before the table: exit 1, nothing on stderr, on both paths."""
    args = ["--db", str(ledgers["ok"]), "status", "cand-1"]
    results = []
    for through_entry in (True, False):
        read, write = os.pipe()
        os.close(read)
        try:
            results.append(_run(args, _env(), through_entry=through_entry, stdout=write))
        finally:
            os.close(write)
    assert results[0][:3] == results[1][:3] == (1, None, "")
    assert results[0][3] is False


def test_the_matcher() -> None:
    """What `status_request` takes, directly: one shape, and the environment click would read."""
    assert status_request(["status", "x"], {}) == StatusRequest("lifecycle.db", False, "x", "warning")
    assert status_request(["--db", "a", "--json", "status", "x"], {"LIFECYCLE_DB": "b"}) == StatusRequest(
        "a", True, "x", "warning"
    )
    assert status_request(["status", "x"], {"LIFECYCLE_LOG_LEVEL": "info"}) == StatusRequest(
        "lifecycle.db", False, "x", "info"
    )
    for argv in (["status"], ["statu", "x"], ["status", "x", "y"], ["--db"], ["--db", "a"], ["x", "status", "y"],
                 ["--jsonn", "status", "x"], ["status", ""], ["status", "x\n"], ["--db=", "status", "x"]):  # fmt: skip
        assert status_request(argv, {}) is None, argv


def test_the_installed_script_is_the_entry() -> None:
    """The `lifecycle` script runs `entry.run` (installed before this change: `pip install -e .` regenerates it)."""
    script = Path(sys.executable).with_name("lifecycle")
    assert "from lifecycle_fsm.cli.entry import run" in script.read_text(), "reinstall: pip install -e ."


def test_ctrl_c_on_the_fast_path_is_exit_130(
    ledgers: dict[str, Path], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Ctrl-C during the fast `status ID` ends as on click's path (tests/test_faults.py): exit 130,
    `Error: interrupted`, not exit 1 ("a bug")."""
    import lifecycle_fsm.streams

    def interrupted(*_: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(lifecycle_fsm.streams, "query_work", interrupted)
    request = status_request(["--db", str(ledgers["ok"]), "status", "cand-1"], {})
    assert request is not None
    assert _status(request) == 130
    assert capsys.readouterr().err.strip().splitlines() == ["Error: interrupted"]
