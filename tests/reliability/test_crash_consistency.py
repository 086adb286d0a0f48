"""Crash consistency: a child drives every write command and is killed; nothing acknowledged is lost, nothing torn.

Each run is seeded. The child runs a plan (`workload.plan_commands`) against a real
SQLite file with synchronous=FULL and writes an fsynced acknowledgement after each
command. It is killed either at a random moment (SIGKILL from here) or by the store
itself through `LIFECYCLE_FAULT` just before or just after the commit of a chosen
command (often a multi-event one: `fail`, a baseline with invalidations, `handoff`). Afterwards:

- every acknowledged command is in the log with the seqs and event ids it reported;
- the log is exactly what a fault-free run of the same plan has after its first k
  commands, for the k the log reaches: no command is partial (a `fail` without its
  plan, a baseline without its invalidations), nothing is reordered or extra;
- the hash chain verifies, and a load through the newest checkpoint equals a full replay.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from conftest import REPO

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import load_state, snapshot_json
from lifecycle_fsm.store.base import select_events, verify_chain
from reliability.workload import make_artifacts, plan_commands, run_command

CHILD = Path(__file__).with_name("child.py")


def _oracle(db: Path, plan: list[dict[str, Any]]) -> tuple[list[tuple[str, str, str]], dict[str, int]]:
    """The fault-free log of the plan, and the log length after each command."""
    log_len: dict[str, int] = {}
    with Ledger.open(db, synchronous="NORMAL", actor="oracle") as ledger:
        for cmd in plan:
            run_command(ledger, cmd)
            log_len[cmd["event_id"]] = ledger.store.count_events()
        log = [_shape(e.stream_id, e.type, e.event_id) for e in select_events(ledger.store)]
    return log, log_len


def _fault_target(rng: random.Random, plan: list[dict[str, Any]], log_len: dict[str, int]) -> int:
    """The command to kill inside: often one that appends several events (a torn one is what to catch)."""
    appended, before = [], 0
    for i, cmd in enumerate(plan):
        appended.append((i, log_len[cmd["event_id"]] - before))
        before = log_len[cmd["event_id"]]
    multi = [i for i, n in appended if n > 1]
    committing = [i for i, n in appended if n > 0]
    return rng.choice(multi) if multi and rng.random() < 0.6 else rng.choice(committing)


def _shape(stream_id: str, type_: str, event_id: str) -> tuple[str, str, str]:
    """What must match the oracle: stream, type, and the id when a command chose it (fan-out ids are random)."""
    return (stream_id, type_, event_id if event_id.startswith("cmd-") else "*")


def _read_acks(path: Path) -> list[dict[str, Any]]:
    acks = []
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                acks.append(json.loads(line))
            except json.JSONDecodeError:  # the kill landed mid-line: that command was never acknowledged
                break
    return acks


def _one_run(seed: int, root: Path, commands: int) -> dict[str, Any]:
    rng = random.Random(seed)
    art = make_artifacts(root / "art")
    plan = plan_commands(seed, commands, art)
    oracle_log, oracle_len = _oracle(root / "oracle.db", plan)
    db, acks_path, plan_path = root / "ledger.db", root / "acks.jsonl", root / "plan.json"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    mode = rng.choice(("kill", "before_commit", "after_commit"))
    if mode != "kill":  # the child runs this command on a store opened with LIFECYCLE_FAULT=kill@<mode>#1
        plan[_fault_target(rng, plan, oracle_len)]["fault"] = mode
    plan_path.write_text(json.dumps(plan))
    child = subprocess.Popen(
        [sys.executable, str(CHILD), str(db), str(plan_path), str(acks_path)],
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    if mode == "kill":
        time.sleep(rng.uniform(0.2, 1.2))
        child.send_signal(signal.SIGKILL)
    _, err = child.communicate(timeout=120)
    killed = child.returncode == -signal.SIGKILL
    assert killed or child.returncode == 0, err
    return _check(db, _read_acks(acks_path), oracle_log, oracle_len) | {"mode": mode, "killed": killed}


def _check(
    db: Path, acks: list[dict[str, Any]], oracle_log: list[tuple[str, str, str]], oracle_len: dict[str, int]
) -> dict[str, Any]:
    if not db.exists():
        assert not any(a["ok"] and a["seqs"] for a in acks), "acknowledged events but no ledger file"
        return {"acked": len(acks), "events": 0, "lost": 0, "torn": 0}
    with Ledger.open(db, actor="checker") as ledger:
        store = ledger.store
        events = list(select_events(store))
        by_seq = {e.seq: e for e in events}
        lost = 0
        for a in acks:
            if a["ok"]:
                lost += sum(
                    1 for s, i in zip(a["seqs"], a["ids"], strict=True) if s not in by_seq or by_seq[s].event_id != i
                )
        assert lost == 0, f"{lost} acknowledged events missing"
        # The log is the oracle's log after some command: never between two commands' events.
        log = [_shape(e.stream_id, e.type, e.event_id) for e in events]
        reached = [n for n, length in oracle_len.items() if length == len(log)]
        torn = 0 if log and reached and oracle_log[: len(log)] == log else (0 if not log else 1)
        assert torn == 0, f"the log ({len(log)} events) is not the oracle's log after any whole command"
        if acks:
            assert len(log) >= oracle_len[acks[-1]["n"]], "the log is shorter than what was acknowledged"
        chain = verify_chain(store)
        assert chain.ok, chain
        full = load_state(store, use_checkpoints=False).state
        through_checkpoint = load_state(store).state
        assert snapshot_json(full) == snapshot_json(through_checkpoint)
    return {"acked": len(acks), "events": len(events), "lost": lost, "torn": torn}


@pytest.mark.slow
def test_killed_writers_lose_nothing_acknowledged_and_tear_nothing(
    campaign: Any, tally: list[dict[str, Any]], tmp_path: Path
) -> None:
    outcomes = []
    for seed in range(campaign.crash_runs):
        root = tmp_path / f"run-{seed}"
        outcomes.append(_one_run(seed, root, campaign.crash_commands))
    faults = sum(1 for o in outcomes if o["killed"])
    tally.append(
        {
            "campaign": "crash consistency",
            "runs": len(outcomes),
            "faults": faults,
            "by_mode": {
                m: sum(1 for o in outcomes if o["mode"] == m) for m in ("kill", "before_commit", "after_commit")
            },
            "acked_commands": sum(o["acked"] for o in outcomes),
            "lost": sum(o["lost"] for o in outcomes),
            "torn": sum(o["torn"] for o in outcomes),
            "wrong": 0,
            "result": "pass",
        }
    )
    assert faults >= len(outcomes) // 2, "most runs must actually be killed, or the campaign proves little"
