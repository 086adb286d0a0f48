"""A seed expands into a schedule: the artifacts a simulated ledger starts with and its operations (scenario
steps, so a shrunk failure is a scenario). The generator steers by a `LedgerModel` toward the least-met goals, so
every state meets every kind of command and settings change early; every choice is a pure function of the seed."""

from __future__ import annotations

import copy
import itertools
import random
from collections import Counter
from collections.abc import Callable, Hashable
from typing import Any

import attrs

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.drills.model import ALIVE, DECIDED, LedgerModel
from lifecycle_fsm.replay.drills.steps import ACTIONS, DAMAGE
from lifecycle_fsm.rules import CANDIDATE_KINDS, ONLINE_KINDS, STAGES
from lifecycle_fsm.rules import TRUSTED_STATE_KINDS as KINDS

Op = JSON  # one scenario step: {action: args}
BASELINES = ("b0", "b1", "b2")
FOLDERS = ("t0", "t1", "t2", "t3")
SETTINGS = ("activate_baseline", "advance_window", "activate_evaluation")
GOAL_STEPS = 0.5  # the share of steps that head for the least-met goal; the rest are drawn at random
GIVE_UP = 30  # goal steps spent on one goal before another is tried
# What the generator makes sure happens to a candidate in each state: every command that means
# something there, every kind of settings change, a check after its artifact or the rollback
# baseline was damaged, a failure with nothing left to resume from.
GOALS = [
    *((s, g) for s in ALIVE for g in ("record_trusted_state", "invalidate_trusted_state", *SETTINGS)),
    *((s, "check") for s in ("received", *DECIDED)),
    *((s, "fail_stage") for s in ("received", "verified", "recovering", "ready")),
    ("verified", "hand_off"),
    ("recovering", "complete_recovery"),
    ("tune", "receive"),
    ("registered", "receive"),
    *((s, "check_damaged") for s in DECIDED),
    ("verified", "hand_off_damaged"),
    *((s, "fail_blocked") for s in ("received", "verified", "recovering", "ready")),
]
# How a candidate gets to a state: from which state, by which command.
ROUTE = {
    "verified": ("received", "check"),
    "ready": ("verified", "hand_off"),
    "tune": ("verified", "hand_off"),
    "recovering": ("received", "fail_stage"),
    "received": ("recovering", "complete_recovery"),
}

# What a candidate in each state is usually asked to do next (weights); anything else is a
# probe the ledger must refuse, drawn now and then.
USUAL: dict[str, dict[str, int]] = {
    "received": {"check": 6, "fail_stage": 3, "record_trusted_state": 3, "invalidate_trusted_state": 1},
    "verified": {"hand_off": 6, "check": 2, "fail_stage": 2, "record_trusted_state": 1},
    "recovering": {"complete_recovery": 6, "fail_stage": 2, "record_trusted_state": 1},
    "ready": {"check": 2, "fail_stage": 1, "record_trusted_state": 1, "invalidate_trusted_state": 1},
    "tune": {"check": 2, "receive": 2, "record_trusted_state": 1},
    "reject": {},
}
EVERY = ("check", "hand_off", "fail_stage", "complete_recovery", "record_trusted_state", "invalidate_trusted_state")


@attrs.frozen
class Schedule:
    """The artifacts (scenario `artifacts:` mappings), the model's view of them, and the operations."""

    seed: int
    artifacts: dict[str, JSON]
    specs: dict[str, JSON]  # candidate artifact -> what the model knows its manifest says
    ops: list[Op]


def split(op: Op) -> tuple[str, JSON]:
    """A step's action and its arguments (the shorthand's key filled from a scalar)."""
    action, value = next(iter(op.items()))
    if isinstance(value, dict):
        return action, value
    return action, {} if value is None else {str(ACTIONS[action].shorthand): value}


def describe(op: Op) -> str:
    """One line of the printed schedule."""
    action, args = split(op)
    if action == "crash":
        return f"crash {args['at']}#{args['commit']} around {describe(args['run'])}"
    return " ".join([action, *(f"{k}={v}" for k, v in args.items())])


def advance(model: LedgerModel, op: Op) -> None:
    """Move the model past one operation, as it must happen on a correct ledger."""
    action, args = split(op)
    if action == "crash":
        if args["at"] == "after_commit":
            advance(model, args["run"])
    elif action in DAMAGE:
        getattr(model, action.removesuffix("_artifact"))(args["artifact"])
    elif action == "edit_manifest":
        model.edit(args["artifact"], args["set"])
    elif action == "checkpoint":
        model.checkpoints += 1
    elif action == "corrupt_checkpoint":
        model.corrupted = True
    elif action == "tamper_event":
        model.tampered_seq = args["seq"]
    elif ACTIONS[action].command and not (prediction := model.predict(action, args)).refused:
        prediction.apply()


def _candidate(rng: random.Random) -> tuple[JSON, JSON]:
    """A candidate's scenario artifact and the model's reading of its manifest."""
    kind = rng.choice(CANDIDATE_KINDS)
    source = rng.choices(("b0", "b1"), (6, 1))[0]
    decision = rng.choices(("accept", "tune", "reject", "maybe"), (14, 4, 1, 1))[0]
    index = rng.choice((0, 1, 1, 1, 1, 1, 2, None)) if kind != "dpo" else None
    evaluation = rng.choices(("eval-v1", "eval-v2"), (10, 1))[0]
    sha_ok = rng.random() > 0.05
    manifest: JSON = {"decision": decision}
    artifact: JSON = {"type": kind, "source": source, "manifest": manifest, "size": 512}
    if kind != "dpo" and index is None:
        artifact["drop"] = ["evidence_window_index"]
    elif kind != "dpo":
        manifest["evidence_window_index"] = index
    if evaluation != "eval-v1":
        manifest["evaluation_version"] = evaluation
    if not sha_ok:
        manifest["adapter_sha256"] = "0" * 64
    spec = {"kind": kind, "source": source, "decision": decision, "window_index": index}
    return artifact, spec | {"evaluation": evaluation, "sha_ok": sha_ok}


@attrs.define
class _Generator:
    rng: random.Random
    model: LedgerModel
    artifacts: dict[str, JSON]
    names: list[str]  # the candidate artifacts
    seen: Counter[Hashable] = attrs.Factory(Counter)
    spawned: Any = attrs.Factory(lambda: itertools.count(1))  # ids for candidates received from an artifact again
    target: tuple[str, str] | None = None  # the goal being headed for
    target_seen: int = 0
    tries: int = 0

    def pick(self, weighted: list[tuple[float, Callable[[], Op | None]]]) -> Op | None:
        return self.rng.choices([f for _, f in weighted], [w for w, _ in weighted])[0]()

    def about(self, cid: str, action: str) -> Op:
        rng = self.rng
        if action == "fail_stage":
            return {action: {"candidate": cid, "stage": rng.choice(STAGES) if rng.random() > 0.03 else "bogus"}}
        kind = rng.choice(KINDS) if rng.random() > 0.03 else "bogus"
        if action == "record_trusted_state":
            folders = BASELINES if kind == "verified_baseline" and rng.random() < 0.8 else FOLDERS
            return {action: {"candidate": cid, "kind": kind, "artifact": rng.choice(folders)}}
        if action == "invalidate_trusted_state":
            return {action: {"candidate": cid, "kind": kind}}
        if action == "receive":
            return {action: {"artifact": self.adapter_of(cid), "id": cid}}
        return {action: cid}

    def adapter_of(self, cid: str) -> str:
        """The artifact a candidate is (re)received from: its own, or for a registered one an artifact of its
        kind and source (now and then another)."""
        c, specs = self.model.candidates.get(cid), self.model.specs
        if c is not None and not c.pending:
            return c.artifact
        wanted = None if c is None else tuple(c.fields.values())
        fits = [a for a in self.names if (specs[a]["kind"], specs[a]["source"]) == wanted]
        return self.rng.choice(fits if fits and self.rng.random() > 0.1 else self.names)

    def register(self) -> Op:
        kind = self.rng.choice(CANDIDATE_KINDS) if self.rng.random() > 0.03 else "bogus"
        return {"register": {"candidate": f"r{next(self.spawned)}", "kind": kind}}

    def for_candidate(self) -> Op:
        rng, ids = self.rng, list(self.model.candidates)
        if not ids or rng.random() < 0.03:
            return self.about(rng.choice([*self.names, "ghost"]), rng.choice((*EVERY, "receive")))
        alive = [cid for cid in ids if self.model.candidates[cid].state != "reject"]
        cid = rng.choice(alive if alive and rng.random() > 0.05 else ids)
        weights = USUAL[self.model.candidates[cid].state]
        if not weights or rng.random() < 0.08:
            return self.about(cid, rng.choice((*EVERY, "receive")))
        return self.about(cid, rng.choices(list(weights), list(weights.values()))[0])

    def command(self) -> Op:
        rng, window = self.rng, self.model.active_window
        op = self.pick(
            [
                (4, lambda: {"receive": rng.choice(self.names)}),
                (4, lambda: {"receive": {"artifact": rng.choice(self.names), "id": f"n{next(self.spawned)}"}}),
                (2, self.register),
                (60, self.for_candidate),
                (2, lambda: {"activate_baseline": self.detour(self.model.active_baseline, BASELINES)}),
                (3, lambda: {"advance_window": max(0, window + rng.choice((-1, 0, 1, 1, 1)))}),
                (1, lambda: {"activate_evaluation": self.detour(self.model.evaluation, ("eval-v1", "eval-v2"))}),
            ]
        )
        assert op is not None
        return op

    def detour(self, active: str | None, values: tuple[str, ...]) -> str:
        """Another setting now and then, and mostly back to the first (candidates are made for it)."""
        if active in (None, values[0]):
            return self.rng.choice(values)
        return values[0] if self.rng.random() < 0.75 else self.rng.choice(values)

    def change(self, what: str) -> Op:
        """A settings change that changes something."""
        model = self.model
        if what == "advance_window":
            return {what: model.active_window + 1}
        if what == "activate_baseline":
            return {what: "b0" if model.active_baseline != "b0" else self.rng.choice(BASELINES[1:])}
        return {what: "eval-v1" if model.evaluation != "eval-v1" else "eval-v2"}

    def damage(self, action: str) -> Op | None:
        """Damage (or restore) an artifact: half the time the active baseline or a decided candidate's."""
        model = self.model
        pool = [a for a in self.artifacts if model.intact(a) is (action != "restore_artifact")]
        decided = {c.artifact for c in model.candidates.values() if c.state in DECIDED}
        telling = [a for a in pool if a == model.active_baseline or a in decided]
        return {action: self.rng.choice(telling if telling and self.rng.random() < 0.5 else pool)} if pool else None

    def edit(self, decision: str | None = None, name: str | None = None) -> Op:
        """A new revision of a manifest: a decision, for the current window and evaluation."""
        rng, model = self.rng, self.model
        tuned = [c.artifact for c in model.candidates.values() if c.state == "tune"]
        if name is None:
            name = rng.choice(tuned) if tuned and rng.random() < 0.7 else rng.choice(self.names)
        changes: JSON = {"decision": decision or rng.choice(("accept", "tune", "reject"))}
        changes["evaluation_version"] = model.evaluation or "eval-v1"
        if model.specs[name]["kind"] in ONLINE_KINDS:
            changes["evidence_window_index"] = model.active_window
        return {"edit_manifest": {"artifact": name, "set": changes}}

    def crash(self) -> Op | None:
        inner = self.command()
        if self.model.predict(*split(inner)).events == 0:
            return None
        return {"crash": {"at": self.rng.choice(("before_commit", "after_commit")), "commit": 1, "run": inner}}

    def propose(self) -> Op | None:
        corrupt = 0.5 if self.model.checkpoints and not self.model.corrupted else 0
        return self.pick(
            [
                (70, self.command),
                (3, lambda: self.damage("tamper_artifact")),
                (1, lambda: self.damage("delete_artifact")),
                (5, lambda: self.damage("restore_artifact")),
                (4, self.edit),
                (2, lambda: {"checkpoint": None}),
                (corrupt, lambda: {"corrupt_checkpoint": None}),
                (1.5, self.crash),
            ]
        )

    def toward(self, state: str, decision: str) -> Op:
        """The next move of some candidate on its way to `state` (a hand-off to ready or tune needs a
        candidate of that upstream `decision`); a fresh candidate when no one is on the way."""
        model = self.model
        source, action = ROUTE.get(state, ("", ""))
        holders = [
            cid for cid, c in model.candidates.items() if c.state == source and c.fields.get("decision") == decision
        ]
        for cid in self.rng.sample(holders, len(holders)):
            op = self.about(cid, action)
            if model.predict(*split(op)).states.get(cid, ("",))[0] == state:
                return op
        if source and source != "received":
            return self.toward(source, decision)
        return self.spawn(decision)

    def spawn(self, decision: str) -> Op:
        """A new candidate that will pass its check, or the step that makes one possible."""
        model, rng = self.model, self.rng
        passing = [a for a in self.names if model.would_pass(a) and model.specs[a]["decision"] == decision]
        if passing:
            return {"receive": {"artifact": rng.choice(passing), "id": f"n{next(self.spawned)}"}}
        name = rng.choice([a for a in self.names if model.specs[a]["sha_ok"]] or self.names)
        for damaged in (model.active_baseline, name):
            if damaged is not None and not model.intact(damaged):
                return {"restore_artifact": damaged}
        if model.active_baseline != model.specs[name]["source"]:
            return {"activate_baseline": model.specs[name]["source"]}
        return self.edit(decision, name)

    def goal(self) -> Op:
        """A step toward the least-met goal, kept until met or given up."""
        if self.target is None or self.seen[self.target] > self.target_seen or self.tries > GIVE_UP:
            if self.target is not None and self.tries > GIVE_UP:
                self.seen[self.target] += 1  # try the others first
            least = min(self.seen[g] for g in GOALS)
            self.target = self.rng.choice([g for g in GOALS if self.seen[g] == least])
            self.target_seen, self.tries = self.seen[self.target], 0
        self.tries += 1
        state, what = self.target
        holders = [
            cid for cid, c in self.model.candidates.items() if c.state == state or (c.pending and state == "registered")
        ]
        if state == "registered" and not holders:
            return self.register()
        if not holders:
            return self.toward(state, "tune" if state == "tune" else "accept")
        return self.meet(self.rng.choice(holders), what)

    def meet(self, cid: str, what: str) -> Op:
        """`what` done to candidate `cid`, or the step that makes it possible."""
        model, c = self.model, self.model.candidates[cid]
        damaged = not model.intact(c.artifact)
        if what in SETTINGS:
            return self.change(what)
        if what in ("check_damaged", "hand_off_damaged"):
            return {what.removesuffix("_damaged"): cid} if damaged else {"tamper_artifact": c.artifact}
        if what == "receive" and not c.pending and model.specs[c.artifact] == c.fields:
            return self.edit(None, c.artifact)
        if what == "fail_blocked" and model.active_baseline is not None and model.intact(model.active_baseline):
            return {"tamper_artifact": model.active_baseline}
        if what == "fail_blocked":
            return {"fail_stage": {"candidate": cid, "stage": "artifact_validation"}}
        if what == "invalidate_trusted_state" and c.trusted:
            return {what: {"candidate": cid, "kind": self.rng.choice(sorted(c.trusted))}}
        if what == "fail_stage" and c.state == "ready":  # after hand-off only artifact validation fails
            return {what: {"candidate": cid, "stage": "artifact_validation"}}
        return self.about(cid, "record_trusted_state" if what == "invalidate_trusted_state" else what)

    def met(self, op: Op) -> None:
        """Count the goals `op` meets (before the model moves past it)."""
        action, args = split(op)
        model = self.model
        if not ACTIONS[action].command:
            return
        if action in SETTINGS:
            if model.predict(action, args).events:
                self.seen.update((c.state, action) for c in model.candidates.values())
            return
        c = model.candidates.get(str(args.get("candidate", args.get("id"))))
        prediction = model.predict(action, args)
        if c is None or prediction.refused or not prediction.events:
            return
        passed = action != "check" or prediction.states[str(args["candidate"])][0] != "reject"
        self.seen[("registered" if c.pending else c.state, action)] += passed  # a failed check: `check_damaged`
        if action in ("check", "hand_off") and not (model.intact(c.artifact) and model.intact(model.active_baseline)):
            self.seen[(c.state, f"{action}_damaged")] += 1
        if (prediction.plan or {}).get("action") in ("block_update", "block_release"):
            self.seen[(c.state, "fail_blocked")] += 1

    def next(self) -> Op | None:
        op = self.goal() if self.rng.random() < GOAL_STEPS else self.propose()
        if op is not None:
            self.met(op)
        return op


def generate(seed: int, steps: int, candidates: int) -> Schedule:
    """The schedule for `seed`: `steps` operations over `candidates` candidate artifacts."""
    rng = random.Random(seed)
    artifacts: dict[str, JSON] = {b: {"type": "baseline", "size": 512} for b in BASELINES}
    specs: dict[str, JSON] = {}
    for i in range(candidates):
        artifacts[f"c{i}"], specs[f"c{i}"] = _candidate(rng)
    artifacts |= {f: {"type": "trusted_state", "size": 256} for f in FOLDERS}
    model = LedgerModel(baselines={b: b for b in BASELINES}, specs=copy.deepcopy(specs))
    gen = _Generator(rng, model, artifacts, list(specs))
    ops: list[Op] = [{"activate_baseline": "b0"}]
    advance(model, ops[0])
    while len(ops) < steps:
        if (op := gen.next()) is not None:
            advance(model, op)
            ops.append(op)
    if rng.random() < 0.1:
        ops.append({"tamper_event": {"seq": rng.randint(1, model.events)}})
    return Schedule(seed, artifacts, specs, ops)
