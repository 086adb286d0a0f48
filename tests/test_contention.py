"""Supervisors racing on one candidate (SPEC §10): lost races re-decide, none surfaces.

Real processes on one ledger, mostly on one shared candidate, some on their own,
with a setting change now and then that invalidates candidates in every stream.
Afterwards: no ConcurrencyError escaped, the events stored are exactly the ones the
processes were told they appended, every stream's versions run 1..N without a gap,
the chain verifies, and a full replay equals what the live ledger answers.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from collections import defaultdict

import pytest

from lifecycle_fsm import Ledger
from lifecycle_fsm.replay.checkpoints import load_state
from lifecycle_fsm.replay.verify import verify
from tests.conftest import REPO, Workspace

WORKER = REPO / "tests" / "contention_worker.py"


@pytest.mark.parametrize(
    ("backend", "workers", "commands"), [("sqlite", 3, 150), ("postgres", 3, 150), ("sqlite", 4, 500)]
)
def test_racing_supervisors_never_see_a_concurrency_error(
    ws: Workspace, request: pytest.FixtureRequest, backend: str, workers: int, commands: int
) -> None:
    target = str(ws.db) if backend == "sqlite" else str(request.getfixturevalue("pg_url"))
    files = ws.root / "states"
    files.mkdir()
    with Ledger.open(target, actor="setup", synchronous="NORMAL") as ledger:
        ledger.init()
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.grpo("shared"))
        for w in range(workers):
            ledger.receive(ws.grpo(f"grpo-w{w}"))
        setup = ledger.store.head().seq
    procs = [
        subprocess.Popen(
            [sys.executable, str(WORKER), target, str(w), str(commands), "7", str(files)],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for w in range(workers)
    ]
    deadline = time.monotonic() + 120
    while not all((files / f"ready-{w}").exists() for w in range(workers)) and time.monotonic() < deadline:
        time.sleep(0.01)
    (files / "go").touch()  # every worker opened its ledger: start them together
    outputs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outputs, strict=True):
        assert p.returncode == 0, err
        assert "ConcurrencyError" not in err
    reports = [json.loads(out) for out, _ in outputs]
    with Ledger.open(target, actor="auditor") as ledger:
        events = list(ledger.events())
        assert len(events) == setup + sum(r["appended"] for r in reports)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        versions: dict[str, list[int]] = defaultdict(list)
        for e in events:
            versions[e.stream_id].append(e.version)
        assert all(v == list(range(1, len(v) + 1)) for v in versions.values())
        shared_writers = {e.actor for e in events if e.stream_id == "candidate:shared"}
        # The shared candidate really was contended, and every worker made progress. Not "every
        # worker wrote to it": SQLite's lock is not fair, so a worker can wait out the others'
        # commands until the shared candidate is rejected (a stale window), then find it refused.
        assert len(shared_writers - {"setup"}) >= 2, shared_writers
        assert all(r["appended"] > 0 for r in reports), reports
        report = verify(ledger.store)
        assert report["ok"], report
        replayed = load_state(ledger.store, use_checkpoints=False).state
        assert {cid: replayed.candidates[cid] for cid in ledger.candidate_ids()} == {
            cid: ledger.candidate(cid) for cid in ledger.candidate_ids()
        }
