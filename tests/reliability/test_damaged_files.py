"""Damaged ledger files: every case is a clear error (exit 6/7, one `Error:` line) or the right answer.

Seeded byte flips and truncations hit a real ledger file (events, a checkpoint, the
stream index); structural damage drops a table or renames a column; the file is
replaced by text, emptied or made read-only; a WAL is deleted under a writer. Each
case runs `verify` and `status --json` as real processes and is judged by
`damage.judge`. The counts go to the campaign tally.
"""

from __future__ import annotations

import random
import sqlite3
import subprocess
import sys
from collections import Counter
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay import load_state, take_checkpoint
from lifecycle_fsm.replay import verify as verify_ledger
from reliability.damage import drop_triggers, invoke, judge, read_only, reset, run
from reliability.workload import make_artifacts


class Original:
    """A ledger with decided candidates, a failure, trusted states and a checkpoint; and its right answers."""

    def __init__(self, root: Path) -> None:
        art = make_artifacts(root / "art")
        self.db = root / "ledger.db"
        with Ledger.open(self.db, actor="setup") as ledger:
            ledger.init(2, 1)
            ledger.activate_baseline(art.baselines["sft"])
            for name in ("dpo-a", "dpo-b", "grpo-a", "grpo-b"):
                ledger.receive(art.candidates[name])
            ledger.check("dpo-a")
            ledger.hand_off("dpo-a")
            ledger.record_trusted_state("grpo-a", "prompt_queue", art.trusted["prompt_queue"])
            ledger.fail_stage("grpo-a", "sampling")
            take_checkpoint(ledger.store, clock=utc_now)
            ledger.check("dpo-b")
            ledger.activate_baseline(art.baselines["sft2"])
        self.good = self.db.read_bytes()
        self.status = run(self.db, "status", "--json")
        self.verify = run(self.db, "verify")
        assert self.status.returncode == 0 and self.verify.returncode == 0, self.verify.stderr

    def outcome(self, *, in_process: bool = False) -> dict[str, str]:
        call = invoke if in_process else run
        return {
            "verify": judge(call(self.db, "verify"), self.verify.stdout),
            "status": judge(call(self.db, "status", "--json"), self.status.stdout),
            "api": self.api_outcome(),
        }

    def api_outcome(self) -> str:
        """The library, not the CLI: a damaged file raises only the project's errors (no sqlite3 ones)."""
        try:
            with Ledger.open(self.db, actor="reader") as ledger:
                ledger.candidate_ids()
                for cid in ("dpo-a", "grpo-a"):
                    ledger.history(cid)
                load_state(ledger.store)
                verify_ledger(ledger.store)
                ledger.advance_window(9)
        except LifecycleError:
            return "error"
        except Exception as e:  # anything else crossed the API: sqlite3.DatabaseError, UnicodeDecodeError, …
            return f"wrong ({type(e).__module__}.{type(e).__name__})"
        return "same"


@pytest.fixture(scope="module")
def original(tmp_path_factory: pytest.TempPathFactory) -> Original:
    return Original(tmp_path_factory.mktemp("damaged"))


def _flip(data: bytes, rng: random.Random) -> bytes:
    out = bytearray(data)
    offset = rng.randrange(len(out))
    out[offset] ^= 1 << rng.randrange(8)
    return bytes(out)


def test_seeded_byte_flips_and_truncations(original: Original, campaign: Any, tally: list[dict[str, Any]]) -> None:
    rng = random.Random(10)
    size = len(original.good)
    cases: list[tuple[str, bytes]] = [(f"flip-{i}", _flip(original.good, rng)) for i in range(campaign.byte_flips)]
    cases += [(f"truncate-{n}", original.good[:n]) for n in (100, 512, 4096, size // 2, size - 4096, size - 1)]
    counts: Counter[str] = Counter()
    wrong = []
    for name, data in cases:
        reset(original.db, data)
        outcome = original.outcome(in_process=True)  # thousands of cases: no process start each
        counts.update(f"{cmd}:{o}" for cmd, o in outcome.items())
        if any(o.startswith("wrong") for o in outcome.values()):
            wrong.append((name, outcome))
    tally.append(
        {
            "campaign": "damaged files: byte flips and truncations",
            "runs": len(cases),
            "faults": len(cases),
            "outcomes": dict(sorted(counts.items())),
            "lost": 0,
            "wrong": len(wrong),
            "result": "pass" if not wrong else "FAIL",
        }
    )
    assert not wrong, wrong


def _drop_events(conn: sqlite3.Connection) -> None:
    drop_triggers(conn)
    conn.execute("DROP TABLE events")


def _drop_streams(conn: sqlite3.Connection) -> None:
    conn.execute("DROP TABLE streams")


def _drop_checkpoints(conn: sqlite3.Connection) -> None:
    conn.execute("DROP TABLE checkpoint_streams")
    conn.execute("DROP TABLE checkpoints")


def _rename_payload(conn: sqlite3.Connection) -> None:
    drop_triggers(conn)
    conn.execute("ALTER TABLE events RENAME COLUMN payload TO body")


def _rename_status(conn: sqlite3.Connection) -> None:
    conn.execute("ALTER TABLE streams RENAME COLUMN status TO state")


SQL_DAMAGE: dict[str, Callable[[sqlite3.Connection], None]] = {
    "dropped events table": _drop_events,
    "dropped streams table": _drop_streams,
    "dropped checkpoint tables": _drop_checkpoints,
    "renamed events.payload": _rename_payload,
    "renamed streams.status": _rename_status,
}


@pytest.mark.parametrize("name", SQL_DAMAGE)
def test_structural_damage_is_a_clear_error(original: Original, name: str, tally: list[dict[str, Any]]) -> None:
    reset(original.db, original.good)
    with sqlite3.connect(original.db) as conn:
        SQL_DAMAGE[name](conn)
    outcome = original.outcome()
    tally.append(
        {
            "campaign": f"damaged files: {name}",
            "runs": 1,
            "faults": 1,
            "outcomes": outcome,
            "lost": 0,
            "wrong": sum(o.startswith("wrong") for o in outcome.values()),
        }
    )
    assert not any(o.startswith("wrong") for o in outcome.values()), outcome


@pytest.mark.parametrize(
    "content",
    [
        pytest.param(b"", id="0-byte file"),
        pytest.param(b"S", id="1-byte file (SQLite reads it as empty)"),
        pytest.param(b"name,policy\ndpo,v5\n" * 200, id="text file"),
        pytest.param(b"SQLite format 3\x00" + b"\x00" * 100, id="header only"),
    ],
)
def test_a_file_that_is_not_a_ledger_is_a_clear_error(original: Original, content: bytes) -> None:
    """Reads refuse it (exit 7) and leave it as it was (#9: a read never initialises a file)."""
    reset(original.db, content)
    reads = {
        "verify": judge(run(original.db, "verify"), original.verify.stdout),
        "status": judge(run(original.db, "status", "--json"), original.status.stdout),
    }
    assert set(reads.values()) == {"error"}, reads
    assert original.db.read_bytes() == content, "a read command must never initialise the file"
    # The library's Ledger.open creates a ledger in an empty file (SPEC §10: created if
    # missing) and then finds no candidate; a file with other content is refused.
    assert original.api_outcome() == "error"


def test_a_read_only_ledger_answers_reads_and_refuses_writes(original: Original) -> None:
    reset(original.db, original.good)
    with read_only(original.db):
        outcome = original.outcome()
        write = run(original.db, "window", "5")
    assert not any(o.startswith("wrong") for o in outcome.values()), outcome
    assert judge(write, "") == "error", write.stderr
    assert original.db.read_bytes() == original.good


_WRITER = """
import sys, time
from pathlib import Path
from lifecycle_fsm.errors import StoreError
from lifecycle_fsm.ledger import Ledger
db, ready, go = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3])
with Ledger.open(db, actor="writer") as ledger:
    ledger.advance_window(5)
    ready.touch()
    while not go.exists():
        time.sleep(0.01)
    try:
        ledger.advance_window(6)
    except StoreError as e:
        assert "-wal: deleted or replaced" in str(e), e
        print("refused")
print("closed")
"""


def test_a_wal_deleted_under_an_open_writer(original: Original, tmp_path: Path) -> None:
    """The writer keeps its WAL open; others see a clear error meanwhile; its next write, which would go into
    the deleted file, is refused; and its close checkpoints what it had committed into the ledger file."""
    reset(original.db, original.good)
    ready, go = tmp_path / "ready", tmp_path / "go"
    writer = subprocess.Popen(
        [sys.executable, "-c", _WRITER, str(original.db), str(ready), str(go)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    for _ in range(3000):
        if ready.exists():
            break
        subprocess.run(["sleep", "0.01"], check=True)
    Path(f"{original.db}-wal").unlink()
    meanwhile = run(original.db, "status", "--json")
    assert judge(meanwhile, original.status.stdout) in ("error", "same"), meanwhile.stderr
    go.touch()
    out, err = writer.communicate(timeout=120)
    assert writer.returncode == 0 and out.split() == ["refused", "closed"], err
    after = run(original.db, "verify")
    assert after.returncode in (0, 6, 7)
    assert judge(after, after.stdout) in ("error", "same")
    if after.returncode == 0:  # the writer's close checkpointed its WAL: the window it committed is in the log
        with Ledger.open(original.db, create=False) as reader:
            assert reader.settings().active_window == 5
