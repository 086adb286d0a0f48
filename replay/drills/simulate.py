"""Run a schedule against a real SQLite ledger: the model judges each command, then every candidate; replay
and `verify` are checked now and then. Clock, actor, ids and folder are fixed per seed, so one seed, one head.
A failing schedule is made small (delta debugging) and written as a scenario that `lifecycle drill FILE` runs:
judged by the model, so it passes on a correct ledger and fails on the broken one."""

from __future__ import annotations

import contextlib
import fcntl
import itertools
import random
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.drills import writers
from lifecycle_fsm.replay.drills.convert import Where
from lifecycle_fsm.replay.drills.faults import Problem, load_both_ways
from lifecycle_fsm.replay.drills.loader import parse_artifacts, parse_step
from lifecycle_fsm.replay.drills.model import LedgerModel
from lifecycle_fsm.replay.drills.runner import Run, StepFailed, run_step
from lifecycle_fsm.replay.drills.schedule import Op, Schedule, advance, describe, split
from lifecycle_fsm.replay.drills.schema import DrillConfig, Scenario, Step
from lifecycle_fsm.replay.drills.steps import ACTIONS, PLAN_KEYS
from lifecycle_fsm.replay.drills.workspace import Workspace
from lifecycle_fsm.replay.explain import explain
from lifecycle_fsm.replay.verify import verify

FIXED_CLOCK = "2026-01-01T00:00:00.000000Z"
ACTOR = "simulator"
SIMULATED = Path("simulated")


@attrs.frozen
class SimFailure:
    """The first step whose invariants did not hold."""

    step: int  # 1-based index into the schedule's ops
    op: Op
    problems: tuple[Problem, ...]


@attrs.frozen
class SimResult:
    seed: int
    failure: SimFailure | None
    head: JSON
    events: int
    seconds: float
    ran: tuple[int, ...]  # the ops that ran (1-based); the others were skipped as meaningless at that point
    refused: dict[int, str]  # op -> the error class the model says refuses it (the observed one, when allowed)
    expectations: JSON  # what the model held after the failing op (for the shrunk scenario)

    @property
    def ok(self) -> bool:
        return self.failure is None

    @property
    def steps_run(self) -> int:
        return len(self.ran)

    def to_json(self, steps: int, schedule: Schedule | None) -> JSON:
        """One seed's run as `drill --simulate --json` shows it (its schedule too, when given)."""
        doc: JSON = {"seed": self.seed, "steps": steps, "steps_run": self.steps_run, "events": self.events}
        doc |= {"head": self.head, "ok": self.ok, "seconds": round(self.seconds, 3), "failure": None}
        if (failure := self.failure) is not None:
            problems = [{"key": k, "expected": e, "actual": a} for k, e, a in failure.problems]
            doc["failure"] = {"step": failure.step, "op": describe(failure.op), "problems": problems}
        doc["schedule"] = None if schedule is None else [describe(op) for op in schedule.ops]
        return doc


@contextlib.contextmanager
def _fixed_folder(seed: int) -> Iterator[Path]:
    """The seed's own folder, emptied before and after, held under an exclusive lock."""
    base = Path(tempfile.gettempdir()) / "lifecycle-simulate"
    base.mkdir(exist_ok=True)
    folder = base / f"seed-{seed}"
    with open(base / f"seed-{seed}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shutil.rmtree(folder, ignore_errors=True)
        folder.mkdir()
        try:
            yield folder
        finally:
            shutil.rmtree(folder, ignore_errors=True)


@attrs.define
class _Sim:
    model: LedgerModel
    run: Run
    refused: dict[int, str] = attrs.Factory(dict)
    ran: list[int] = attrs.Factory(list)

    def step(self, number: int, op: Op) -> Step:
        return parse_step(Where(SIMULATED), number, op, self.run.scenario.artifacts)

    def meaningless(self, op: Op) -> bool:
        """A fault that would do nothing here (a shrunk schedule may leave one): skipped, not judged."""
        action, args = split(op)
        model, artifact = self.model, str(args.get("artifact"))
        if action == "crash":  # around a command that appends nothing (a refused one appends nothing either)
            return model.predict(*split(args["run"])).events == 0
        return (
            (action == "tamper_artifact" and not model.intact(artifact))
            or (action == "restore_artifact" and model.intact(artifact))
            or (action == "delete_artifact" and model.content.get(artifact, 0) is None)
            or (action == "corrupt_checkpoint" and not model.checkpoints)
            or (action == "tamper_event" and not 1 <= args["seq"] <= self.run.ledger.store.count_events())
        )


def _command(sim: _Sim, number: int, op: Op) -> list[Problem]:
    store, ws, prediction = sim.run.ledger.store, sim.run.ws, sim.model.predict(*split(op))
    if prediction.refused:  # the class the shrunk scenario's `refused:` names (the observed one, when allowed)
        sim.refused[number] = prediction.errors[0]
    before = store.count_events()
    method, args, kwargs = writers.command_call(ws, sim.step(number, op).spec)
    if method in ("check", "hand_off"):
        kwargs |= {"rehash": True}  # a re-used digest records when it was read: wall-clock time in the head
    outcome = writers.call(sim.run.ledger, (method, args, kwargs))
    if outcome.refused:
        name = outcome.classes[0]
        problems: list[Problem] = []
        if not prediction.refused:
            problems.append(("outcome", f"success, {prediction.events} events", outcome.shown(ws)))
        elif name not in prediction.errors:
            problems.append(("refused", " or ".join(prediction.errors), outcome.shown(ws)))
        else:
            sim.refused[number] = name
        if store.count_events() != before:
            problems.append(("events", f"{before} (a refusal appends nothing)", store.count_events()))
        return problems
    if prediction.refused:
        return [("outcome", f"refused with {' or '.join(prediction.errors)}", outcome.shown(ws))]
    prediction.apply()
    return [] if len(outcome.seqs) == prediction.events else [("appended", prediction.events, len(outcome.seqs))]


def _fault(sim: _Sim, number: int, op: Op) -> list[Problem]:
    """Run a fault step through the drill runner, then move the model past it."""
    try:
        run_step(sim.run, sim.step(number, op))
        problems: list[Problem] = []
    except StepFailed as e:
        problems = list(e.failures)
    advance(sim.model, op)
    return problems


def _candidates(sim: _Sim) -> list[Problem]:
    """Every candidate's state, version, trusted states and last plan, as the model says."""
    problems: list[Problem] = []
    for cid, want in sim.model.candidates.items():
        try:
            c = sim.run.ledger.candidate(cid)
        except LifecycleError as e:
            problems.append((f"{cid} state", want.state, f"{type(e).__name__}: {e}"))
            continue
        got: JSON = {"state": str(c.state), "version": c.version, "trusted_states": sorted(c.trusted_states)}
        wanted: JSON = {"state": want.state, "version": want.version, "trusted_states": sorted(want.trusted)}
        if want.plan is not None:
            got["recovery"] = {k: (c.last_recovery or {}).get(k) for k in PLAN_KEYS}
            wanted["recovery"] = {k: want.plan[k] for k in got["recovery"]}
        problems.extend((f"{cid} {k}", wanted[k], got[k]) for k in wanted if got[k] != wanted[k])
    if (count := sim.run.ledger.store.count_events()) != sim.model.events:
        problems.append(("events", sim.model.events, count))
    return problems


def _whole(sim: _Sim) -> list[Problem]:
    """Replay = checkpoint + tail, every candidate's path (`explain`'s), and `verify` as the faults say."""
    store = sim.run.ledger.store
    report = verify(store)
    found = {k: report.get(k) for k in ("ok", "bad_seq", "reason")}
    if (seq := sim.model.tampered_seq) is not None:
        named = not report["ok"] and report.get("bad_seq") == seq
        return [] if named else [("bad_seq", seq, report.get("bad_seq"))]
    problems: list[Problem] = []
    for cid, want in sim.model.candidates.items():
        if (path := [step["to"] for step in explain(store, cid)["path"]]) != want.path:
            problems.append((f"{cid} path", want.path, path))
    _, _, same = load_both_ways(store)
    if not same:
        problems.append(("replay", "latest checkpoint + tail equal to a full replay", "differs"))
    if sim.model.corrupted:
        at_checkpoint = type(report.get("bad_seq")) is int and str(report.get("reason")).startswith("checkpoint")
        if report["ok"] or not at_checkpoint:
            problems.append(("verify", "broken checkpoint, at its position", found))
    elif not report["ok"]:
        problems.append(("verify_ok", True, f"bad_seq {report.get('bad_seq')}: {report.get('reason')}"))
    return problems


def _expectations(sim: _Sim) -> JSON:
    candidates = {
        cid: {"path": c.path, "trusted_states": sorted(c.trusted), "plan": c.plan}
        for cid, c in sim.model.candidates.items()
    }
    verify_ok = sim.model.tampered_seq is None and not sim.model.corrupted
    return {"events": sim.model.events, "candidates": candidates, "verify_ok": verify_ok}


def kept_name(seed: int) -> str:
    """The name of `seed`'s kept ledger (`--keep DIR`: DIR/<name>.db) and shrunk scenario."""
    return f"simulated-seed-{seed}"


def simulate(schedule: Schedule, *, keep: Path | None = None, check_every: int = 20) -> SimResult:
    """Run `schedule` against a fresh SQLite ledger; stop at the first step whose invariants fail."""
    started = time.perf_counter()
    with _fixed_folder(schedule.seed) as folder:
        artifacts = parse_artifacts(Where(SIMULATED), schedule.artifacts)
        ws = Workspace(folder, schedule.seed)
        ids = itertools.count(1)
        ledger = Ledger.open(
            ws.db, synchronous="OFF", actor=ACTOR, clock=lambda: FIXED_CLOCK, new_id=lambda: f"sim-{next(ids)}"
        )
        scenario = Scenario(SIMULATED, "simulated", "", schedule.seed, DrillConfig(), artifacts, ())
        run = Run(scenario, ws, ledger, random.Random(schedule.seed), str(ws.db), clock=lambda: FIXED_CLOCK)
        try:
            ws.materialize(artifacts, DrillConfig())
            ledger.init()
            sim = _Sim(LedgerModel(baselines=dict(ws.shas), specs={k: dict(v) for k, v in schedule.specs.items()}), run)
            failure = _loop(sim, schedule.ops, check_every)
            head = ledger.store.head()
            result = SimResult(
                schedule.seed,
                failure,
                {"seq": head.seq, "hash": head.hash},
                ledger.store.count_events(),
                time.perf_counter() - started,
                tuple(sim.ran),
                sim.refused,
                _expectations(sim),
            )
        finally:
            ledger.close()
        if keep is not None:
            ws.keep(keep, kept_name(schedule.seed))
    return result


def _loop(sim: _Sim, ops: list[Op], check_every: int) -> SimFailure | None:
    for number, op in enumerate(ops, start=1):
        action = next(iter(op))
        command = ACTIONS[action].command
        sim.run.child = {"clock": FIXED_CLOCK, "id_prefix": f"crash{number}", "actor": ACTOR}
        if not command and sim.meaningless(op):
            continue
        sim.ran.append(number)
        try:
            problems = _command(sim, number, op) if command else _fault(sim, number, op)
        except Exception as e:  # a ledger bug: reported (and shrunk) like any broken invariant
            return SimFailure(number, op, (("outcome", "a result or a ledger refusal", f"{type(e).__name__}: {e}"),))
        if action == "tamper_event":  # the log is no longer trusted: reads fail closed, only verify is asked
            problems += _whole(sim)
            return SimFailure(number, op, tuple(problems)) if problems else None
        problems += _candidates(sim)
        if not problems and (number % check_every == 0 or number == len(ops) or "checkpoint" in action):
            problems += _whole(sim)
        if problems:
            return SimFailure(number, op, tuple(problems))
    return None


@attrs.frozen
class Shrunk:
    schedule: Schedule
    result: SimResult
    runs: int
    seconds: float


def shrink(schedule: Schedule, failed: SimResult, *, max_runs: int = 400, max_seconds: float = 120.0) -> Shrunk:
    """The smallest schedule found (within the budget) that still fails."""
    assert failed.failure is not None
    started = time.perf_counter()
    runs = 0
    best, result = _ran_only(schedule, failed), failed

    def attempt(ops: list[Op]) -> SimResult | None:
        nonlocal runs
        runs += 1
        r = simulate(attrs.evolve(schedule, ops=ops))
        return None if r.ok else r

    if (r := attempt(best.ops)) is not None:
        best, result = _ran_only(best, r), r
    chunk = max(1, len(best.ops) // 2)
    while chunk >= 1 and runs < max_runs and time.perf_counter() - started < max_seconds:
        i, removed = 0, False
        while i < len(best.ops) and runs < max_runs and time.perf_counter() - started < max_seconds:
            trial = best.ops[:i] + best.ops[i + chunk :]
            if trial and (r := attempt(trial)) is not None:
                best, result, removed = _ran_only(attrs.evolve(best, ops=trial), r), r, True
            else:
                i += chunk
        if not removed:
            chunk //= 2
    return Shrunk(best, result, runs, time.perf_counter() - started)


def _ran_only(schedule: Schedule, result: SimResult) -> Schedule:
    """The prefix up to the failure, without the operations that were skipped."""
    assert result.failure is not None
    ran = set(result.ran)
    return attrs.evolve(schedule, ops=[op for i, op in enumerate(schedule.ops[: result.failure.step], 1) if i in ran])


def _referenced(value: Any, names: set[str]) -> set[str]:
    if isinstance(value, dict | list):
        return set().union(*(_referenced(v, names) for v in (value.values() if isinstance(value, dict) else value)))
    return {value} if isinstance(value, str) and value in names else set()


def to_scenario(shrunk: Shrunk) -> JSON:
    """The shrunk schedule as a scenario document (dump it with `yaml.safe_dump`)."""
    schedule, result = shrunk.schedule, shrunk.result
    assert result.failure is not None
    used = _referenced(schedule.ops, set(schedule.artifacts)) | {"b0"}
    for name in list(used):
        if source := schedule.artifacts[name].get("source"):
            used.add(source)
    artifacts = {k: v for k, v in schedule.artifacts.items() if k in used}
    steps: list[JSON] = [
        op | {"refused": result.refused[i]} if i in result.refused else dict(op)
        for i, op in enumerate(schedule.ops, start=1)
    ]
    want = result.expectations
    for cid, c in want["candidates"].items():
        path = {f"path.{i}.to": state for i, state in enumerate(c["path"])}
        evidence = {"version": len(c["path"]), **path}
        expect: JSON = {"candidate": cid, "state": c["path"][-1], "trusted_states": c["trusted_states"]}
        expect["explain"] = {"evidence": evidence}
        if c["plan"] is not None:  # str(): an action is a `StrEnum`, which YAML cannot write
            plan = {k: c["plan"][k] for k in PLAN_KEYS}
            expect["recovery"] = {k: str(v) if isinstance(v, str) else v for k, v in plan.items()}
        steps.append({"expect": expect})
    action, _ = split(result.failure.op)
    if action != "tamper_event":
        steps += [
            {"expect": {"events": want["events"]}},
            {"replay": None},
            {"expect": {"verify_ok": want["verify_ok"]}},
        ]
    problems = "; ".join(f"{k}: expected {e}, actual {a}" for k, e, a in result.failure.problems)
    return {
        "name": kept_name(schedule.seed),
        "description": f"Shrunk by `lifecycle drill --simulate --seed {schedule.seed}` from step "
        f"{result.failure.step} ({describe(result.failure.op)}): {problems}",
        "seed": schedule.seed,
        "artifacts": artifacts,
        "steps": steps,
    }


def scenario_yaml(scenario: JSON) -> str:
    return yaml.safe_dump(scenario, sort_keys=False, width=110)
