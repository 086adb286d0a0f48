"""What a shell script leans on: `wait`, `log --follow`, `--exit-status`, did-you-mean, and what `key new` says."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
from click.testing import CliRunner
from conftest import Workspace, invoke

from lifecycle_fsm.cli import main
from lifecycle_fsm.cli.app import install_hint, unknown_command
from lifecycle_fsm.cli.exit_codes import ExitCode, decision_exit_code
from lifecycle_fsm.ledger import Ledger


@pytest.fixture
def decided(ws: Workspace) -> Workspace:
    """A ledger with dpo-ready (ready), dpo-tune (tune) and dpo-old (rejected by its check), and dpo-new received."""
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        for cid, overrides in (("dpo-ready", {}), ("dpo-tune", {"decision": "tune"})):
            led.receive(ws.dpo(cid, **overrides))
            led.check(cid)
            led.hand_off(cid)
        led.receive(ws.dpo("dpo-old", source_policy_version="older"))
        led.check("dpo-old")
        led.receive(ws.dpo("dpo-new"))
    return ws


def _cli(*argv: str) -> list[str]:
    return [sys.executable, "-m", "lifecycle_fsm", *argv]


def test_exit_status_gates_on_the_decision(decided: Workspace) -> None:
    """0 only for a passed check or a ready hand-off; tune 10, reject 11; without the flag, 0 whatever was decided."""
    ws = decided
    with ws.ledger() as led:
        for cid, overrides in (("dpo-r", {}), ("dpo-t", {"decision": "tune"}), ("dpo-x", {"decision": "reject"})):
            led.receive(ws.dpo(cid, **overrides))
    assert invoke(ws.db, "check", "dpo-r", "--exit-status").exit_code == 0
    assert invoke(ws.db, "handoff", "dpo-r", "--exit-status").exit_code == 0
    assert invoke(ws.db, "check", "dpo-t", "--exit-status").exit_code == 0
    tuned = invoke(ws.db, "--json", "handoff", "dpo-t", "--exit-status")
    assert tuned.exit_code == ExitCode.TUNE == 10 and json.loads(tuned.stdout)["state"] == "tune"
    assert invoke(ws.db, "check", "dpo-t", "--exit-status").exit_code == 0  # a re-check that passes: still tune
    assert invoke(ws.db, "check", "dpo-x").exit_code == 0
    rejected = invoke(ws.db, "handoff", "dpo-x", "--exit-status")
    assert rejected.exit_code == ExitCode.REJECT == 11 and "state reject (upstream_reject)" in rejected.stdout
    with ws.ledger() as led:
        led.receive(ws.dpo("dpo-stale", source_policy_version="older"))
    assert invoke(ws.db, "check", "dpo-stale", "--exit-status").exit_code == 11
    assert decision_exit_code("check", "verified", inconclusive=True) == ExitCode.INCONCLUSIVE == 12


def test_exit_status_of_an_unreadable_artifact_is_inconclusive(ws: Workspace) -> None:
    """The artifact root gone (an unmounted volume): `check --exit-status` exits 12, says nothing was decided,
    and the candidate stays verified; mounted again, the hand-off is ready (0)."""
    volume = Workspace(ws.root / "volume", paths_from_root=True)
    volume.root.mkdir()
    root = ["--artifact-root", str(volume.root)]
    for argv in (["init"], ["baseline", "activate", str(volume.baseline())], ["receive", str(volume.dpo())]):
        assert invoke(ws.db, *root, *argv).exit_code == 0, argv
    assert invoke(ws.db, *root, "check", "dpo-v5", "--exit-status").exit_code == 0
    volume.root.rename(ws.root / "unmounted")
    checked = invoke(ws.db, *root, "--json", "check", "dpo-v5", "--exit-status")
    assert checked.exit_code == ExitCode.INCONCLUSIVE == 12
    assert json.loads(checked.stdout)["state"] == "verified" and json.loads(checked.stdout)["inconclusive"] is True
    text = invoke(ws.db, *root, "handoff", "dpo-v5", "--exit-status")
    assert text.exit_code == 12 and "inconclusive" in text.stdout and "state verified" in text.stdout
    (ws.root / "unmounted").rename(volume.root)
    assert invoke(ws.db, *root, "handoff", "dpo-v5", "--exit-status").exit_code == 0


def test_wait_returns_at_once_when_the_state_is_there(decided: Workspace) -> None:
    """Reached: exit 0; rejected while waiting for ready: 11 at once; not reached in time: 9, one line."""
    ws = decided
    done = invoke(ws.db, "--json", "wait", "dpo-ready", "--state", "tune,ready", "--timeout", "0")
    assert done.exit_code == 0
    assert json.loads(done.stdout) == {
        "id": "dpo-ready",
        "state": "ready",
        "wanted": ["tune", "ready"],
        "reached": True,
    }
    rejected = invoke(ws.db, "wait", "dpo-old", "--state", "ready", "--timeout", "60")
    assert (rejected.exit_code, rejected.stdout) == (11, "dpo-old: reject (not ready)\n")
    assert invoke(ws.db, "wait", "dpo-old", "--state", "ready", "--state", "reject", "--timeout", "0").exit_code == 0
    late = invoke(ws.db, "wait", "dpo-new", "--state", "ready", "--timeout", "0.3", "--poll", "0.05")
    assert (late.exit_code, late.stdout) == (ExitCode.TIMED_OUT, "")
    assert late.stderr == "Error: candidate 'dpo-new' did not reach ready within 0.3 s (last state: received)\n"
    late_json = invoke(ws.db, "--json", "wait", "dpo-new", "--state", "ready", "--timeout", "0")
    assert late_json.exit_code == ExitCode.TIMED_OUT
    assert json.loads(late_json.stdout) == {"id": "dpo-new", "state": "received", "wanted": ["ready"], "reached": False}
    unknown = invoke(ws.db, "--json", "wait", "dpo-later", "--state", "ready", "--timeout", "0")
    assert json.loads(unknown.stdout) == {"id": "dpo-later", "state": None, "wanted": ["ready"], "reached": False}


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--state", "readdy", "--timeout", "1"], "'readdy' is not a state"),
        (["--state", ",", "--timeout", "1"], "nothing is not a state"),
        (["--state", "ready", "--timeout", "nan"], "timeout"),
        (["--state", "ready", "--timeout", "-1"], "timeout"),
    ],
)
def test_wait_refuses_what_it_cannot_wait_for(decided: Workspace, argv: list[str], message: str) -> None:
    result = invoke(decided.db, "wait", "dpo-new", *argv)
    assert result.exit_code in (2, 3) and result.stderr.count("\n") == 1 and message in result.stderr


def test_wait_sees_another_process_decide(decided: Workspace) -> None:
    """A real `lifecycle wait` blocks until a supervisor in another process hands the candidate off."""
    ws = decided
    argv = _cli("--db", str(ws.db), "wait", "dpo-new", "--state", "ready", "--timeout", "60", "--poll", "0.05")
    waiting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        time.sleep(0.5)
        assert waiting.poll() is None
        with ws.ledger() as led:
            led.check("dpo-new")
            led.hand_off("dpo-new")
        out, err = waiting.communicate(timeout=60)
    finally:
        if waiting.poll() is None:
            waiting.kill()
    assert (waiting.returncode, out, err) == (0, "dpo-new: ready\n", "")


def _lines(stream: IO[str], n: int, timeout: float = 60) -> list[str]:
    """The next `n` lines a follower printed, read on a thread so a silent follower fails instead of hanging."""
    got: list[str] = []

    def read() -> None:
        while len(got) < n and (line := stream.readline()):
            got.append(line)

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    reader.join(timeout)
    return got


def _follow(target: str, *args: str) -> subprocess.Popen[str]:
    argv = _cli("--db", target, "log", "--follow", "--poll", "0.05", *args)
    return subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _stop(follower: subprocess.Popen[str]) -> tuple[int, str]:
    follower.send_signal(signal.SIGINT)  # Ctrl-C
    try:
        _, err = follower.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        follower.kill()  # a follower that ignored Ctrl-C fails the test, never outlives it
        follower.communicate()
        raise
    return follower.returncode, err


@pytest.mark.parametrize("backend", ["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def test_log_follow_prints_new_events_until_ctrl_c(ws: Workspace, backend: str, request: pytest.FixtureRequest) -> None:
    """`log --follow --jsonl` prints the log, then each new event as it is appended (a filter applies to both);
    Ctrl-C ends it, exit 0 and nothing on stderr. PostgreSQL wakes it by NOTIFY, SQLite by polling."""
    target = str(ws.db) if backend == "sqlite" else request.getfixturevalue("pg_url")
    with Ledger.open(target) as led:
        led.init()
        led.activate_baseline(ws.baseline())
        follower = _follow(target, "--jsonl", "--type", "CandidateReceived", "--type", "ChecksRecorded")
        typed = _follow(target, "--after", "1")
        try:
            assert _lines(typed.stdout, 1)[0].split()[0] == "2"  # the catch-up: seq 2, as text
            led.receive(ws.dpo())
            led.check("dpo-v5")
            led.advance_window(2)  # not followed: another type
            led.receive(ws.grpo())
            got = [json.loads(line) for line in _lines(follower.stdout, 3)]
            assert [(d["type"], d["stream_id"]) for d in got] == [
                ("CandidateReceived", "candidate:dpo-v5"),
                ("ChecksRecorded", "candidate:dpo-v5"),
                ("CandidateReceived", "candidate:grpo-v7"),
            ]
            assert [int(line.split()[0]) for line in _lines(typed.stdout, 4)] == [3, 4, 5, 6]
        finally:
            results = [_stop(follower), _stop(typed)]
    assert results == [(0, ""), (0, "")]


def test_log_follow_of_one_candidate_sees_its_new_events(ws: Workspace) -> None:
    """`--stream ID` follows that candidate alone, and sees what is appended after it started."""
    with ws.ledger() as led:
        led.init()
        led.activate_baseline(ws.baseline())
        led.receive(ws.dpo())
        follower = _follow(str(ws.db), "--stream", "dpo-v5", "--jsonl")
        try:
            assert [json.loads(line)["type"] for line in _lines(follower.stdout, 1)] == ["CandidateReceived"]
            led.receive(ws.grpo())
            led.check("dpo-v5")
            assert [json.loads(line)["type"] for line in _lines(follower.stdout, 1)] == ["ChecksRecorded"]
        finally:
            assert _stop(follower) == (0, "")
    unknown = invoke(ws.db, "log", "--follow", "--stream", "nobody")
    assert unknown.exit_code == 4 and unknown.stdout == ""


def test_log_follow_ends_at_its_limit_and_refuses_a_json_array(ws: Workspace) -> None:
    """`--limit N` counts the catch-up and what follows; `--follow --json` cannot be one document (usage, exit 2)."""
    with ws.ledger() as led:
        led.init()
        follower = _follow(str(ws.db), "--limit", "2")
        assert len(_lines(follower.stdout, 1)) == 1
        led.advance_window(2)
        led.advance_window(3)
        out, err = follower.communicate(timeout=60)
    assert (follower.returncode, err, [int(line.split()[0]) for line in out.splitlines()]) == (0, "", [2])
    refused = invoke(ws.db, "log", "--follow", "--json")
    assert refused.exit_code == 2 and "use --jsonl" in refused.stderr


def test_an_unknown_command_names_the_ones_meant() -> None:
    """A typo or the Python API's name for a command: the command meant (exit 2, one line); else no guess."""
    assert unknown_command("handof", ["handoff", "history"]) == "No such command 'handof'. Did you mean 'handoff'?"
    assert "Did you mean 'handoff'" in unknown_command("hand_off", ["handoff"], api_names=True)
    assert "Did you mean 'baseline activate'" in unknown_command("activate-baseline", ["baseline"], api_names=True)
    assert unknown_command("xyzzy", ["handoff"]) == "No such command 'xyzzy'."
    for argv, meant in ((["fail_stage", "x"], "'fail'"), (["baseline", "activte"], "'activate'")):
        result = CliRunner().invoke(main, argv)
        assert (result.exit_code, result.stdout) == (2, "")
        assert result.stderr.count("\n") == 1 and f"Did you mean {meant}?" in result.stderr


def test_key_new_says_where_the_files_went_and_what_to_export(tmp_path: Path) -> None:
    result = invoke(tmp_path / "unused.db", "key", "new", "--out", str(tmp_path / "keys"))
    assert result.exit_code == 0, result.stderr
    private, public = tmp_path / "keys" / "lifecycle-signing.key", tmp_path / "keys" / "lifecycle-signing.pub"
    lines = result.stdout.splitlines()
    assert lines[0].startswith("key id: ") and len(lines[0].split()[-1]) == 64
    assert any(str(private) in line for line in lines) and any(str(public) in line for line in lines)
    assert lines[-1] == f"  export LIFECYCLE_SIGNING_KEY={private}"


def test_install_hints_fit_where_the_code_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """From the checkout's folder: `pip install -e '.[ui]'`; elsewhere, the checkout's path."""
    checkout = Path(__file__).resolve().parents[1]
    monkeypatch.chdir(checkout)
    assert install_hint("ui") == "pip install -e '.[ui]'"
    monkeypatch.chdir(tmp_path)
    assert install_hint("ui") == f"pip install -e '{checkout}[ui]' (this checkout)"


def _until_it_opened(pid: int, path: Path, timeout: float = 60.0) -> None:
    """Block until process `pid` holds `path` open: its interpreter has started and it is waiting."""
    deadline = time.monotonic() + timeout
    fds = Path(f"/proc/{pid}/fd")
    while time.monotonic() < deadline:
        try:
            if any(os.path.realpath(fd) == str(path.resolve()) for fd in fds.iterdir()):
                time.sleep(0.2)
                return
        except OSError:
            pass
        time.sleep(0.05)
    raise AssertionError(f"process {pid} never opened {path}")


def test_ctrl_c_on_a_wait_is_exit_130(decided: Workspace) -> None:
    """Ctrl-C during `wait` is an interruption (130, one line), not a decision."""
    argv = _cli("--db", str(decided.db), "wait", "dpo-new", "--state", "ready", "--timeout", "60")
    waiting = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _until_it_opened(waiting.pid, decided.db)
    waiting.send_signal(signal.SIGINT)
    _, err = waiting.communicate(timeout=60)
    assert waiting.returncode == 130 and err.strip().splitlines()[-1] == "Error: interrupted"


def test_log_follow_whose_limit_or_before_the_log_already_meets_ends_at_once(ws: Workspace) -> None:
    """It printed the rows, then waited for an event it would never print (until another writer came)."""
    with ws.ledger() as led:
        led.init()
        led.advance_window(2)
        led.advance_window(3)
    for args, seqs in ((["--limit", "2"], [1, 2]), (["--before", "3"], [1, 2])):
        done = subprocess.run(
            _cli("--db", str(ws.db), "log", "--follow", "--poll", "0.05", *args),
            capture_output=True,
            text=True,
            timeout=20,
            check=False,
        )
        assert (done.returncode, [int(line.split()[0]) for line in done.stdout.splitlines()]) == (0, seqs), done
