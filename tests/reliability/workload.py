"""Seeded command plans, and running them against a ledger: shared by the child processes and the oracle.

A plan is a list of plain dicts (JSON, so a child process reads the same plan the
test wrote). Every write command of the ledger appears, multi-event ones included:
`fail` (StageFailed + RecoveryPlanned), `baseline` (BaselineActivated plus one
EvidenceInvalidated per decided candidate, in one transaction) and `handoff`. Each
command carries its own `event_id`, so the log says which command every event
belongs to. A command the ledger refuses (wrong state) is part of the workload too:
the oracle refuses it the same way.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path
from typing import Any

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.cli.exit_codes import exit_code_for
from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now, write_manifest
from lifecycle_fsm.replay import take_checkpoint
from lifecycle_fsm.replay.drills.workspace import baseline_manifest, candidate_manifest, write_adapter
from lifecycle_fsm.rules import STAGES, TRUSTED_STATE_KINDS

__all__ = ["Artifacts", "make_artifacts", "own_candidates", "plan_commands", "run_command", "writer_plan"]

CANDIDATES = ("dpo-a", "dpo-b", "grpo-a", "grpo-b")
_TRUSTED_FOR_STAGE = {"sampling": "prompt_queue", "update": "pre_update_checkpoint"}


class Artifacts:
    """Manifests and trusted-state folders on disk, made once per workspace."""

    def __init__(self, root: Path, extra_candidates: tuple[str, ...] = ()) -> None:
        self.root = root
        sft = hash_directory(write_adapter(root / "sft" / "adapter", "sft", random.Random("sft").randbytes(4096)))
        self.baselines = {
            "sft": str(write_manifest(root / "sft" / "manifest.json", baseline_manifest(sft))),
        }
        sft2_adapter = write_adapter(root / "sft2" / "adapter", "sft2", random.Random("sft2").randbytes(4096))
        self.baselines["sft2"] = str(
            write_manifest(root / "sft2" / "manifest.json", baseline_manifest(hash_directory(sft2_adapter)))
        )
        self.candidates: dict[str, str] = {}
        for name in (*CANDIDATES, *extra_candidates):
            kind = "dpo" if name.startswith("dpo") else "grpo"
            adapter = write_adapter(root / name / "adapter", name, random.Random(name).randbytes(4096))
            manifest = candidate_manifest(
                kind, adapter_sha256=hash_directory(adapter), source_policy_version=sft, policy_version=name
            )
            self.candidates[name] = str(write_manifest(root / name / "manifest.json", manifest))
        self.trusted: dict[str, str] = {}
        for kind in TRUSTED_STATE_KINDS:
            folder = root / "trusted" / kind
            if kind == "verified_baseline":  # an activated baseline's adapter: other bytes are refused
                folder = root / "sft" / "adapter"
            else:
                folder.mkdir(parents=True, exist_ok=True)
                (folder / "state.bin").write_bytes(random.Random(kind).randbytes(1024))
            self.trusted[kind] = str(folder)


def make_artifacts(root: Path, extra_candidates: tuple[str, ...] = ()) -> Artifacts:
    root.mkdir(parents=True, exist_ok=True)
    return Artifacts(root, extra_candidates)


def _random_command(
    rng: random.Random, art: Artifacts, candidates: tuple[str, ...], window: list[int]
) -> dict[str, Any]:
    cid = rng.choice(candidates)
    roll = rng.random()
    if roll < 0.14:
        return {"op": "receive", "path": art.candidates[cid]}
    if roll < 0.30:
        return {"op": "check", "id": cid}
    if roll < 0.44:
        return {"op": "handoff", "id": cid}
    if roll < 0.56:
        return {"op": "fail", "id": cid, "stage": rng.choice(STAGES)}
    if roll < 0.64:
        return {"op": "recovered", "id": cid}
    if roll < 0.74:
        kind = rng.choice(TRUSTED_STATE_KINDS)
        return {"op": "trusted", "id": cid, "kind": kind, "path": art.trusted[kind]}
    if roll < 0.78:
        return {"op": "untrust", "id": cid, "kind": rng.choice(TRUSTED_STATE_KINDS)}
    if roll < 0.83:
        window[0] += rng.choice((0, 1))
        return {"op": "window", "n": window[0]}
    if roll < 0.86:
        return {"op": "evaluation", "version": rng.choice(("eval-v1", "eval-v2"))}
    if roll < 0.95:
        return {"op": "baseline", "path": art.baselines[rng.choice(("sft", "sft", "sft2"))]}
    return {"op": "checkpoint"}


def plan_commands(seed: int, count: int, art: Artifacts) -> list[dict[str, Any]]:
    """`init`, a baseline, every candidate received, then `count` seeded commands."""
    rng = random.Random(seed)
    plan: list[dict[str, Any]] = [{"op": "init"}, {"op": "baseline", "path": art.baselines["sft"]}]
    plan += [{"op": "receive", "path": art.candidates[c]} for c in CANDIDATES[:2]]
    window = [1]
    plan += [_random_command(rng, art, CANDIDATES, window) for _ in range(count)]
    for i, cmd in enumerate(plan):
        cmd["event_id"] = f"cmd-{i}"
    return plan


def own_candidates(me: int, count: int) -> tuple[str, ...]:
    """A writer's own candidates: a fresh one every 8 commands, so its streams keep moving."""
    return tuple(f"own-{me}-{k}" for k in range(count // 8 + 1))


def writer_plan(seed: int, me: int, count: int, art: Artifacts, shared: tuple[str, ...]) -> list[dict[str, Any]]:
    """One concurrent writer's commands: on the shared candidates and on its newest own ones."""
    rng = random.Random(f"{seed}:{me}")
    own = own_candidates(me, count)
    plan: list[dict[str, Any]] = []
    window = [1]
    for i in range(count):
        if i % 8 == 0:
            plan.append({"op": "receive", "path": art.candidates[own[i // 8]]})
            continue
        newest = own[max(0, i // 8 - 1) : i // 8 + 1]
        cmd = _random_command(rng, art, rng.choice((shared, newest, newest)), window)
        if cmd["op"] in ("baseline", "evaluation", "checkpoint") or (cmd["op"] == "window" and rng.random() < 0.7):
            cmd = {"op": "check", "id": newest[-1]}
        if rng.random() < 0.2:
            cmd["pause"] = rng.uniform(0, 0.004)
        plan.append(cmd)
    for i, cmd in enumerate(plan):
        cmd["event_id"] = f"w{me}-{i}"
    return plan


def run_command(ledger: Ledger, cmd: dict[str, Any]) -> dict[str, Any]:
    """Run one planned command; the outcome is what the child acknowledges (seqs, ids, or the refusal)."""
    op, eid = cmd["op"], cmd["event_id"]
    try:
        if op == "init":
            result = ledger.init(2, 1, event_id=eid)
        elif op == "baseline":
            result = ledger.activate_baseline(cmd["path"], event_id=eid)
        elif op == "receive":
            result = ledger.receive(cmd["path"], event_id=eid)
        elif op == "check":
            result = ledger.check(cmd["id"], event_id=eid)
        elif op == "handoff":
            result = ledger.hand_off(cmd["id"], event_id=eid)
        elif op == "fail":
            result = ledger.fail_stage(cmd["id"], cmd["stage"], event_id=eid)
        elif op == "recovered":
            result = ledger.complete_recovery(cmd["id"], event_id=eid)
        elif op == "trusted":
            result = ledger.record_trusted_state(cmd["id"], cmd["kind"], cmd["path"], event_id=eid)
        elif op == "untrust":
            result = ledger.invalidate_trusted_state(cmd["id"], cmd["kind"], event_id=eid)
        elif op == "window":
            result = ledger.advance_window(cmd["n"], event_id=eid)
        elif op == "evaluation":
            result = ledger.activate_evaluation(cmd["version"], event_id=eid)
        elif op == "checkpoint":
            record = take_checkpoint(ledger.store, clock=utc_now)
            return {"n": eid, "ok": True, "seqs": [], "ids": [], "checkpoint": record.position}
        else:  # pragma: no cover - a typo in a plan
            raise AssertionError(op)
    except LifecycleError as e:
        return {
            "n": eid,
            "ok": False,
            "error": type(e).__name__,
            "exit": int(exit_code_for(e)),
            "message": str(e)[:300],
        }
    events = [] if result.duplicate else list(result.events)
    return {"n": eid, "ok": True, "seqs": [e.seq for e in events], "ids": [e.event_id for e in events]}


def ack(fh: Any, outcome: dict[str, Any]) -> None:
    """One acknowledgement line, on disk (fsynced) before the next command starts."""
    fh.write(json.dumps(outcome) + "\n")
    fh.flush()
    os.fsync(fh.fileno())
