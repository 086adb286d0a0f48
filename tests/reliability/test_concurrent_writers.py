"""Concurrent writers: N real processes run mixed commands on shared and their own candidates, with pauses.

Afterwards: every acknowledged event is in the log exactly once, at the seq it was
acknowledged with; each writer's events appear in the order it wrote them; seqs are
1..N and every stream's versions 1..V with no gap; the chain verifies; a full replay
folds without a forbidden transition and equals a checkpointed load; and every
refusal is a conflict (exit 5), or a window another writer already moved past
(exit 3), never anything else. A stale read is re-decided inside the command
(`CommandPath` retries a ConcurrencyError); only one that keeps losing surfaces as exit 5.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from conftest import REPO

from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay import load_state, snapshot_json, take_checkpoint
from lifecycle_fsm.replay.checkpoints import LedgerState
from lifecycle_fsm.store.base import select_events, verify_chain
from reliability.test_crash_consistency import CHILD
from reliability.workload import make_artifacts, own_candidates, writer_plan

SHARED = ("dpo-a", "grpo-a")


def test_concurrent_writers_lose_duplicate_and_reorder_nothing(
    campaign: Any, tally: list[dict[str, Any]], tmp_path: Path
) -> None:
    writers = campaign.writers
    own = tuple(c for me in range(writers) for c in own_candidates(me, campaign.writer_commands))
    art = make_artifacts(tmp_path / "art", extra_candidates=own)
    db = tmp_path / "ledger.db"
    with Ledger.open(db, actor="setup") as ledger:
        ledger.init(2, 1)
        ledger.activate_baseline(art.baselines["sft"])
        for name in SHARED:
            ledger.receive(art.candidates[name])
    go = tmp_path / "go"
    procs = []
    for me in range(writers):
        plan_path = tmp_path / f"plan-{me}.json"
        plan_path.write_text(json.dumps(writer_plan(7, me, campaign.writer_commands, art, SHARED)))
        procs.append(
            subprocess.Popen(
                [sys.executable, str(CHILD), str(db), str(plan_path), str(tmp_path / f"acks-{me}.jsonl"), str(go)],
                env={**os.environ, "PYTHONPATH": str(REPO)},
                stderr=subprocess.PIPE,
                text=True,
            )
        )
    go.touch()
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 0, err

    acks = {
        me: [json.loads(line) for line in (tmp_path / f"acks-{me}.jsonl").read_text().splitlines()]
        for me in range(writers)
    }
    assert all(len(a) == campaign.writer_commands for a in acks.values())
    refusals = Counter((a["error"], a["exit"]) for ws in acks.values() for a in ws if not a["ok"])
    assert {code for _, code in refusals} <= {3, 4, 5}, refusals
    # Exit 3 only for a window another writer already moved past: stale input, refused before any write.
    stale = [a for ws in acks.values() for a in ws if not a["ok"] and a["exit"] == 3]
    assert all(a["message"].startswith("the window only advances") for a in stale), stale
    assert all(err != "NotFoundError" or code == 4 for err, code in refusals)

    with Ledger.open(db, actor="checker") as ledger:
        store = ledger.store
        events = list(select_events(store))
        assert [e.seq for e in events] == list(range(1, len(events) + 1)), "a seq gap"
        versions: dict[str, list[int]] = {}
        for e in events:
            versions.setdefault(e.stream_id, []).append(e.version)
        for stream, vs in versions.items():
            assert vs == list(range(1, len(vs) + 1)), f"{stream}: versions {vs[:10]}… have a gap or are reordered"
        by_id = Counter(e.event_id for e in events)
        assert max(by_id.values()) == 1, "an event id stored twice"
        by_seq = {e.seq: e for e in events}
        lost = 0
        for me, writer_acks in acks.items():
            seqs = [s for a in writer_acks if a["ok"] for s in a["seqs"]]
            assert seqs == sorted(seqs), f"writer {me}'s events are reordered"
            for a in writer_acks:
                if a["ok"]:
                    lost += sum(
                        1
                        for s, i in zip(a["seqs"], a["ids"], strict=True)
                        if s not in by_seq or by_seq[s].event_id != i
                    )
        assert lost == 0
        acked_ids = {i for ws in acks.values() for a in ws if a["ok"] for i in a["ids"]}
        keyed = {e.event_id for e in events if e.event_id.startswith("w")}
        assert keyed <= acked_ids, "a keyed event in the log that no writer acknowledged"
        assert verify_chain(store).ok
        full: LedgerState = load_state(store, use_checkpoints=False).state  # a forbidden move raises here
        take_checkpoint(store, clock=lambda: "2026-01-01T00:00:00Z")
        assert snapshot_json(load_state(store).state) == snapshot_json(full)

    tally.append(
        {
            "campaign": "concurrent writers",
            "runs": writers,
            "commands": writers * campaign.writer_commands,
            "faults": writers * campaign.writer_commands,
            "refusals": {f"{k[0]} (exit {k[1]})": v for k, v in sorted(refusals.items())},
            "events": len(events),
            "lost": lost,
            "duplicated": 0,
            "reordered": 0,
            "wrong": 0,
            "result": "pass",
        }
    )
