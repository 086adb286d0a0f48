"""LIFECYCLE_FAULT crash injection, through real processes that SIGKILL themselves mid-write."""

from __future__ import annotations

import os
import signal
import sqlite3
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
from conftest import Workspace, count_events, run_cli

from lifecycle_fsm.store import InputError, NewEvent, SQLiteEventStore
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.threads import ENV_VAR

REPO = Path(__file__).resolve().parent.parent
KILLED = -signal.SIGKILL

# Opens the store, says so, then appends `n` batches of two events, saying so after each.
_CHILD = """
import os, sys
from lifecycle_fsm.store import NewEvent, SQLiteEventStore
db, n = sys.argv[1], int(sys.argv[2])
store = SQLiteEventStore(db)
print("opened", flush=True)
for i in range(n):
    version = store.stream_version("child")
    batch = [
        NewEvent("child", "Happened", 1, {"i": i, "part": part}, f"child-{i}-{part}", "2024-01-01T00:00:00Z", "child")
        for part in (0, 1)
    ]
    store.append("child", version, batch)
    print("returned", i, flush=True)
print("done", flush=True)
"""


@pytest.fixture(autouse=True)
def _no_inherited_fault(monkeypatch: pytest.MonkeyPatch) -> None:
    """Only the child processes get a fault plan."""
    monkeypatch.delenv(ENV_VAR, raising=False)


@pytest.fixture
def db(tmp_path: Path) -> Path:
    """A ledger file already holding three events."""
    path = tmp_path / "faults.db"
    with SQLiteEventStore(path, synchronous="NORMAL") as store:
        store.append(
            "setup", 0, [NewEvent("setup", "Happened", 1, {"k": k}, f"setup-{k}", "t", "me") for k in range(3)]
        )
    return path


def run_child(db: Path, fault: str | None, appends: int = 1) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR}
    if fault is not None:
        env[ENV_VAR] = fault
    return subprocess.run(
        [sys.executable, "-c", _CHILD, str(db), str(appends)],
        capture_output=True,
        text=True,
        env=env,
        cwd=REPO,
        check=False,
        timeout=120,
    )


def assert_sound(db: Path) -> None:
    """The file opens, passes SQLite's own integrity check, and its chain verifies."""
    with closing(sqlite3.connect(db)) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with SQLiteEventStore(db) as store:
        report = verify_chain(store)
        assert report.ok, report
        assert report.events == store.count_events()


def child_rows(db: Path) -> list[tuple[int, str]]:
    with closing(sqlite3.connect(db)) as conn:
        return conn.execute("SELECT version, event_id FROM events WHERE stream_id = 'child' ORDER BY seq").fetchall()


def test_unfaulted_child_commits_everything(db: Path) -> None:
    """Without LIFECYCLE_FAULT the child runs to the end (the baseline for the crash tests)."""
    done = run_child(db, None, appends=2)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split("\n")[-2] == "done"
    assert count_events(db) == 7
    assert_sound(db)


def test_kill_before_commit_loses_the_uncommitted_batch(db: Path) -> None:
    """kill@before_commit: SIGKILL inside the append's transaction; nothing of the batch lands."""
    crashed = run_child(db, "kill@before_commit")
    assert crashed.returncode == KILLED
    assert "opened" in crashed.stdout  # the kill hit the append, not the store's opening
    assert "returned" not in crashed.stdout
    assert count_events(db) == 3
    assert child_rows(db) == []
    assert_sound(db)
    after = run_child(db, None)  # the file is usable again
    assert after.returncode == 0, after.stderr
    assert child_rows(db) == [(1, "child-0-0"), (2, "child-0-1")]
    assert_sound(db)


def test_kill_after_commit_keeps_the_committed_batch(db: Path) -> None:
    """kill@after_commit: SIGKILL after COMMIT, before append returns; the whole batch is durable."""
    crashed = run_child(db, "kill@after_commit")
    assert crashed.returncode == KILLED
    assert "opened" in crashed.stdout
    assert "returned" not in crashed.stdout
    assert child_rows(db) == [(1, "child-0-0"), (2, "child-0-1")]
    assert count_events(db) == 5
    assert_sound(db)


def test_kill_on_the_nth_commit(db: Path) -> None:
    """kill@before_commit#3: the first two appends land whole, the third does not."""
    crashed = run_child(db, "kill@before_commit#3", appends=5)
    assert crashed.returncode == KILLED
    assert crashed.stdout.split() == ["opened", "returned", "0", "returned", "1"]
    assert [eid for _, eid in child_rows(db)] == ["child-0-0", "child-0-1", "child-1-0", "child-1-1"]
    assert_sound(db)


@pytest.mark.parametrize(
    "value",
    ["kill", "explode@before_commit", "kill@sometime", "kill@before_commit#x", "kill@after_commit#0", "kill@"],
)
def test_invalid_fault_is_input_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, value: str) -> None:
    """An unknown LIFECYCLE_FAULT value is refused when the store opens, never ignored."""
    monkeypatch.setenv(ENV_VAR, value)
    path = tmp_path / "never.db"
    with pytest.raises(InputError, match=ENV_VAR):
        SQLiteEventStore(path)
    assert not path.exists()


def test_invalid_fault_cli_exits_3(tmp_path: Path) -> None:
    """The CLI turns an invalid LIFECYCLE_FAULT into exit 3 and one Error line, appending nothing."""
    db = tmp_path / "cli.db"
    done = run_cli(db, "init", env={ENV_VAR: "kill@whenever"})
    assert done.returncode == 3
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1
    assert lines[0].startswith("Error: ") and ENV_VAR in lines[0]
    assert count_events(db) == 0


def _ready_ledger(ws: Workspace) -> None:
    with ws.ledger() as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo())


def test_cli_kill_before_commit_of_a_two_event_command(ws: Workspace) -> None:
    """`fail` appends StageFailed + RecoveryPlanned; killed before COMMIT, neither lands, the CLI works on."""
    _ready_ledger(ws)
    before = count_events(ws.db)
    crashed = run_cli(ws.db, "fail", "dpo-v5", "--stage", "update", env={ENV_VAR: "kill@before_commit"})
    assert crashed.returncode == KILLED
    assert count_events(ws.db) == before
    assert_sound(ws.db)
    status = run_cli(ws.db, "--json", "status", "dpo-v5")
    assert status.returncode == 0, status.stderr
    assert '"received"' in status.stdout
    retried = run_cli(ws.db, "fail", "dpo-v5", "--stage", "update")
    assert retried.returncode == 0, retried.stderr
    assert count_events(ws.db) == before + 2
    assert run_cli(ws.db, "verify").returncode == 0


def test_cli_kill_after_commit_keeps_the_command(ws: Workspace) -> None:
    """`receive` killed after COMMIT: the process dies, but the candidate is in the ledger."""
    _ready_ledger(ws)
    before = count_events(ws.db)
    crashed = run_cli(ws.db, "receive", str(ws.grpo()), env={ENV_VAR: "kill@after_commit"})
    assert crashed.returncode == KILLED
    assert count_events(ws.db) == before + 1
    assert_sound(ws.db)
    with ws.ledger() as ledger:
        assert ledger.candidate("grpo-v7").state == "received"


@pytest.mark.parametrize(("point", "appended"), [("before_commit", 0), ("after_commit", 2)])
def test_cli_ctrl_c_exits_130(ws: Workspace, point: str, appended: int) -> None:
    """Ctrl-C (a real SIGINT, timed by the fault hook) is exit 130 and one `Error: interrupted`
    line, never exit 1 ("a bug") or a traceback: before COMMIT nothing lands, after it the
    command does (the documented exit-code table says both)."""
    _ready_ledger(ws)
    before = count_events(ws.db)
    stopped = run_cli(ws.db, "fail", "dpo-v5", "--stage", "update", env={ENV_VAR: f"int@{point}"})
    assert stopped.returncode == 130, stopped.stderr
    assert stopped.stderr.strip().splitlines() == ["Error: interrupted"]
    assert count_events(ws.db) == before + appended
    assert_sound(ws.db)
