"""A seed expands into a schedule: the artifacts a simulated ledger starts with and a list of
operations (commands, valid and invalid, and faults), printed before anything runs.

Operations are scenario steps (`{"check": "c1"}`, `{"crash": {...}}`), so a failing
schedule *is* a scenario once shrunk. The generator steers with a `LedgerModel` so most
commands are ones the ledger should accept (a schedule of refusals would test little),
but every choice is a pure function of the seed: the same seed gives the same schedule.
"""

from __future__ import annotations

import copy
import itertools
import random
from collections.abc import Callable
from typing import Any

import attrs

from lifecycle_fsm.replay.drills.model import LedgerModel

__all__ = ["Schedule", "describe", "generate"]

JSON = dict[str, Any]
Op = dict[str, Any]  # one scenario step: {action: args}
BASELINES = ("b0", "b1", "b2")
FOLDERS = ("t0", "t1", "t2", "t3")
STAGES = ("sampling", "reward", "update", "artifact_validation")
KINDS = ("prompt_queue", "trajectories", "pre_update_checkpoint", "verified_baseline")


@attrs.frozen
class Schedule:
    """The artifacts (scenario `artifacts:` mappings), the model's view of them, and the operations."""

    seed: int
    artifacts: dict[str, JSON]
    specs: dict[str, JSON]  # candidate artifact -> what the model knows its manifest says
    ops: list[Op]


# What a candidate in each state is usually asked to do next (weights); anything else is a probe
# the ledger must refuse, drawn now and then.
USUAL: dict[str, dict[str, int]] = {
    "received": {"check": 6, "fail_stage": 3, "record_trusted_state": 3, "invalidate_trusted_state": 1},
    "verified": {"hand_off": 6, "check": 2, "fail_stage": 2, "record_trusted_state": 1},
    "recovering": {"complete_recovery": 6, "fail_stage": 2, "record_trusted_state": 1},
    "ready": {"check": 2, "record_trusted_state": 1, "invalidate_trusted_state": 1},
    "tune": {"check": 2, "receive": 2, "record_trusted_state": 1},
    "reject": {},
}
EVERY = ("check", "hand_off", "fail_stage", "complete_recovery", "record_trusted_state",
         "invalidate_trusted_state", "receive")  # fmt: skip


def _candidate(rng: random.Random, name: str) -> tuple[JSON, JSON]:
    """A candidate's scenario artifact and the model's reading of its manifest."""
    kind = rng.choice(("dpo", "grpo", "rlvr"))
    source = rng.choices(("b0", "b1"), (6, 1))[0]
    decision = rng.choices(("accept", "tune", "reject", "maybe"), (14, 4, 1, 1))[0]
    index = rng.choice((0, 1, 1, 1, 1, 1, 2, None)) if kind != "dpo" else None
    evaluation = rng.choices(("eval-v1", "eval-v2"), (10, 1))[0]
    sha_ok = rng.random() > 0.05
    manifest: JSON = {"decision": decision}
    drop: list[str] = []
    if kind != "dpo":
        if index is None:
            drop.append("evidence_window_index")
        else:
            manifest["evidence_window_index"] = index
    if evaluation != "eval-v1":
        manifest["evaluation_version"] = evaluation
    if not sha_ok:
        manifest["adapter_sha256"] = "0" * 64
    artifact: JSON = {"type": kind, "source": source, "manifest": manifest, "size": 512}
    if drop:
        artifact["drop"] = drop
    spec = {"kind": kind, "source": source, "decision": decision, "window_index": index,
            "evaluation": evaluation, "sha_ok": sha_ok}  # fmt: skip
    return artifact, spec


def _pick(rng: random.Random, weighted: list[tuple[float, Callable[[], Op | None]]]) -> Op | None:
    return rng.choices([f for _, f in weighted], [w for w, _ in weighted])[0]()


def generate(seed: int, steps: int, candidates: int) -> Schedule:
    """The schedule for `seed`: `steps` operations over `candidates` candidate artifacts."""
    rng = random.Random(seed)
    artifacts: dict[str, JSON] = {b: {"type": "baseline", "size": 512} for b in BASELINES}
    specs: dict[str, JSON] = {}
    for i in range(candidates):
        artifacts[f"c{i}"], specs[f"c{i}"] = _candidate(rng, f"c{i}")
    artifacts |= {f: {"type": "trusted_state", "size": 256} for f in FOLDERS}
    model = LedgerModel(baselines={b: b for b in BASELINES}, specs=copy.deepcopy(specs))
    names = list(specs)
    spawned = itertools.count(1)  # fresh ids for candidates received from an artifact again
    checkpoints = 0
    corrupted = False

    def known() -> str:
        ids = list(model.candidates)
        return rng.choice(ids) if ids and rng.random() > 0.05 else rng.choice([*names, "ghost"])

    def about(cid: str, action: str) -> Op:
        stage = rng.choice(STAGES) if rng.random() > 0.03 else "bogus"
        kind = rng.choice(KINDS) if rng.random() > 0.03 else "bogus"
        if action == "fail_stage":
            return {"fail_stage": {"candidate": cid, "stage": stage}}
        if action == "record_trusted_state":
            return {"record_trusted_state": {"candidate": cid, "kind": kind, "artifact": rng.choice(FOLDERS)}}
        if action == "invalidate_trusted_state":
            return {"invalidate_trusted_state": {"candidate": cid, "kind": kind}}
        if action == "receive":
            c = model.candidates.get(cid)
            return {"receive": {"artifact": c.artifact if c else rng.choice(names), "id": cid}}
        return {action: cid}

    def for_candidate() -> Op:
        ids = list(model.candidates)
        if not ids or rng.random() < 0.03:
            return about(rng.choice([*names, "ghost"]), rng.choice(EVERY))
        alive = [cid for cid in ids if model.candidates[cid].state != "reject"]
        cid = rng.choice(alive if alive and rng.random() > 0.05 else ids)
        weights = USUAL[model.candidates[cid].state]
        if not weights or rng.random() < 0.08:
            return about(cid, rng.choice(EVERY))
        return about(cid, rng.choices(list(weights), list(weights.values()))[0])

    def command() -> Op:
        return _pick(rng, [
            (4, lambda: {"receive": rng.choice(names)}),
            (4, lambda: {"receive": {"artifact": rng.choice(names), "id": f"n{next(spawned)}"}}),
            (60, for_candidate),
            (2, lambda: {"activate_baseline": rng.choices(BASELINES, (4, 1, 1))[0]}),
            (3, lambda: {"advance_window": max(0, model.active_window + rng.choice((-1, 0, 1, 1, 1)))}),
            (1, lambda: {"activate_evaluation": rng.choices(("eval-v1", "eval-v2"), (4, 1))[0]}),
        ]) or {}  # fmt: skip

    def damage(kind: str) -> Op | None:
        pool = [a for a in artifacts if (model.intact(a) if kind != "restore_artifact" else not model.intact(a))]
        return {kind: rng.choice(pool)} if pool else None

    def edit() -> Op:
        tuned = [c.artifact for c in model.candidates.values() if c.state == "tune"]
        name = rng.choice(tuned) if tuned and rng.random() < 0.7 else rng.choice(names)
        return {"edit_manifest": {"artifact": name, "set": {"decision": rng.choice(("accept", "tune", "reject"))}}}

    def crash() -> Op | None:
        inner = command()
        action, args = next(iter(inner.items()))
        if model.predict(action, _args(action, args)).events == 0:
            return None
        return {"crash": {"at": rng.choice(("before_commit", "after_commit")), "commit": 1, "run": inner}}

    ops: list[Op] = [{"activate_baseline": "b0"}]
    apply_op(model, ops[0])
    while len(ops) < steps:
        op = _pick(rng, [
            (70, command), (3, lambda: damage("tamper_artifact")), (1, lambda: damage("delete_artifact")),
            (5, lambda: damage("restore_artifact")), (2, edit), (2, lambda: {"checkpoint": None}),
            (0.5 if checkpoints and not corrupted else 0, lambda: {"corrupt_checkpoint": None}), (1.5, crash),
        ])  # fmt: skip
        if op is None:
            continue
        checkpoints += "checkpoint" in op
        corrupted = corrupted or "corrupt_checkpoint" in op
        apply_op(model, op)
        ops.append(op)
    if rng.random() < 0.1:
        ops.append({"tamper_event": {"seq": rng.randint(1, model.events)}})
    return Schedule(seed, artifacts, specs, ops)


SHORTHAND = {"receive": "artifact", "check": "candidate", "hand_off": "candidate", "complete_recovery": "candidate",
             "activate_baseline": "artifact", "advance_window": "window", "activate_evaluation": "version",
             "tamper_artifact": "artifact", "delete_artifact": "artifact", "restore_artifact": "artifact"}  # fmt: skip


def _args(action: str, value: Any) -> JSON:
    """A step's value as its argument mapping (the shorthand's key filled from a scalar)."""
    if isinstance(value, dict):
        return value
    return {} if value is None else {SHORTHAND[action]: value}


def split(op: Op) -> tuple[str, JSON]:
    action, value = next(iter(op.items()))
    return action, _args(action, value)


def apply_op(model: LedgerModel, op: Op) -> None:
    """Advance the model past one operation (as it must happen on a correct ledger)."""
    action, args = split(op)
    if action == "crash":
        if args["at"] == "after_commit":
            apply_op(model, args["run"])
    elif action == "tamper_artifact":
        model.tamper(args["artifact"])
    elif action == "delete_artifact":
        model.delete(args["artifact"])
    elif action == "restore_artifact":
        model.restore(args["artifact"])
    elif action == "edit_manifest":
        model.specs[args["artifact"]] = model.specs[args["artifact"]] | args["set"]
    elif action not in ("checkpoint", "corrupt_checkpoint", "tamper_event"):
        prediction = model.predict(action, args)
        if not prediction.refused:
            prediction.apply()


def describe(op: Op) -> str:
    """One line of the printed schedule."""
    action, args = split(op)
    if action == "crash":
        return f"crash {args['at']}#{args['commit']} around {describe(args['run'])}"
    return " ".join([action, *(f"{k}={v}" for k, v in args.items())])
