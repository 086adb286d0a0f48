"""Run a schedule against a real SQLite ledger and check the SPEC's invariants after every step.

The ledger lives in a fresh temporary folder, built from the schedule's artifacts by the
drill workspace; steps run through the drill runner (faults, crashes in child
processes) or straight through the `Ledger` API (commands, so the model can judge every
outcome). After each step, against the reference model (`model.py`): refusals are the
expected error class and append nothing; accepted commands append the expected number
of events; every candidate's state, version and trusted states match; a failed stage's
plan matches; the event count matches. Every `check_every` steps and at the end: loading
(latest checkpoint + tail) equals a full replay, and `verify` is ok — or, after a garbled
checkpoint, broken at that checkpoint's position; after an edited event, broken naming its seq.

Clock, actor and event ids are fixed, and the folder is the same for a seed
(`<tmp>/lifecycle-simulate/seed-N`, payloads record absolute paths; a lock file keeps two
runs of one seed apart), so one seed gives a byte-identical head.
"""

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

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.checkpoints import load_state
from lifecycle_fsm.replay.drills import writers
from lifecycle_fsm.replay.drills.loader import parse_artifacts, parse_step
from lifecycle_fsm.replay.drills.model import LedgerModel, Prediction
from lifecycle_fsm.replay.drills.runner import Run, StepFailed, run_step
from lifecycle_fsm.replay.drills.schedule import Op, Schedule, split
from lifecycle_fsm.replay.drills.schema import COMMAND_ACTIONS, DrillConfig, Scenario, Step
from lifecycle_fsm.replay.drills.workspace import Workspace
from lifecycle_fsm.replay.fold import snapshot_json
from lifecycle_fsm.replay.verify import verify

__all__ = ["FIXED_CLOCK", "SimFailure", "SimResult", "kept_name", "simulate"]

JSON = dict[str, Any]
Problem = tuple[str, Any, Any]
FIXED_CLOCK = "2026-01-01T00:00:00.000000Z"
ACTOR = "simulator"


@attrs.frozen
class SimFailure:
    """The first step whose invariants did not hold."""

    step: int  # 1-based index into the schedule's ops
    op: Op
    problems: tuple[Problem, ...]


@attrs.frozen
class SimResult:
    seed: int
    steps_run: int
    failure: SimFailure | None
    head: JSON
    events: int
    seconds: float
    ran: tuple[int, ...]  # the ops that ran (1-based); the others were skipped as meaningless at that point
    refusals: tuple[tuple[int, str], ...]  # (op, error class) for each refused command
    predicted: tuple[tuple[int, tuple[str, ...]], ...]  # (op, error classes) for each refusal the model expected
    expectations: JSON  # what the model held after the failing op (for the shrunk scenario)

    @property
    def ok(self) -> bool:
        return self.failure is None


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
    schedule: Schedule
    model: LedgerModel
    run: Run
    artifacts: Any
    checkpoints: int = 0
    broken_checkpoint: bool = False
    tampered_seq: int | None = None
    refusals: list[tuple[int, str]] = attrs.Factory(list)
    predicted: list[tuple[int, tuple[str, ...]]] = attrs.Factory(list)

    @property
    def ledger(self) -> Ledger:
        return self.run.ledger

    def step(self, number: int, op: Op) -> Step:
        return parse_step(Path("simulated"), number, op, self.artifacts)


def _judge_command(sim: _Sim, number: int, op: Op, prediction: Prediction) -> list[Problem]:
    step = sim.step(number, op)
    store = sim.ledger.store
    if prediction.refused:
        sim.predicted.append((number, prediction.errors))
    before = store.count_events()
    method, args, kwargs = writers.command_call(sim.run.ws, step.spec)
    if method in ("check", "hand_off"):
        kwargs = kwargs | {"rehash": True}  # a re-used digest records when it was read: wall-clock time in the head
    try:
        result = getattr(sim.ledger, method)(*args, **kwargs)
    except LifecycleError as e:
        name = type(e).__name__
        sim.refusals.append((number, name))
        problems: list[Problem] = []
        if not prediction.refused:
            problems.append(("outcome", f"success, {prediction.events} events", f"{name}: {sim.run.ws.shown(str(e))}"))
        elif name not in prediction.errors:
            problems.append(("refused", " or ".join(prediction.errors), f"{name}: {sim.run.ws.shown(str(e))}"))
        if store.count_events() != before:
            problems.append(("events", f"{before} (a refusal appends nothing)", store.count_events()))
        return problems
    appended = 0 if result.duplicate else len(result.events)
    if prediction.refused:
        return [("outcome", f"refused with {' or '.join(prediction.errors)}", f"success (appended {appended})")]
    prediction.apply()
    if appended != prediction.events:
        return [("appended", prediction.events, appended)]
    return []


def _candidates(sim: _Sim) -> list[Problem]:
    """Every candidate's state, version, trusted states and last plan, as the model says."""
    problems: list[Problem] = []
    for cid, want in sim.model.candidates.items():
        try:
            c = sim.ledger.candidate(cid)
        except LifecycleError as e:
            problems.append((f"{cid} state", want.state, f"{type(e).__name__}: {e}"))
            continue
        if c.state != want.state:
            problems.append((f"{cid} state", want.state, str(c.state)))
        if c.version != want.version:
            problems.append((f"{cid} version", want.version, c.version))
        if sorted(c.trusted_states) != sorted(want.trusted):
            problems.append((f"{cid} trusted_states", sorted(want.trusted), sorted(c.trusted_states)))
        if want.plan is not None:
            got = {k: (c.last_recovery or {}).get(k) for k in ("action", "recovery_state", "reused_state")}
            wanted = {k: want.plan[k] for k in got}
            if got != wanted:
                problems.append((f"{cid} recovery", wanted, got))
    if (count := sim.ledger.store.count_events()) != sim.model.events:
        problems.append(("events", sim.model.events, count))
    return problems


def _whole(sim: _Sim) -> list[Problem]:
    """Replay = checkpoint + tail, and `verify` as the faults so far say it must be."""
    problems: list[Problem] = []
    store = sim.ledger.store
    if sim.tampered_seq is None and snapshot_json(load_state(store).state) != snapshot_json(
        load_state(store, use_checkpoints=False).state
    ):
        problems.append(("replay", "latest checkpoint + tail equal to a full replay", "differs"))
    report = verify(store)
    if sim.tampered_seq is not None:
        if report["ok"] or report.get("bad_seq") != sim.tampered_seq:
            problems.append(("bad_seq", sim.tampered_seq, report.get("bad_seq")))
    elif sim.broken_checkpoint:
        at_checkpoint = type(report.get("bad_seq")) is int  # the broken checkpoint's own position
        if report["ok"] or not at_checkpoint or not str(report.get("reason")).startswith("checkpoint"):
            problems.append(
                (
                    "verify",
                    "broken checkpoint, at its position",
                    {k: report.get(k) for k in ("ok", "bad_seq", "reason")},
                )
            )
    elif not report["ok"]:
        problems.append(("verify_ok", True, f"bad_seq {report.get('bad_seq')}: {report.get('reason')}"))
    return problems


def _fault(sim: _Sim, number: int, op: Op) -> list[Problem] | None:
    """Run a fault step through the drill runner; None when it would mean nothing here (skipped)."""
    action, args = split(op)
    model = sim.model
    if action == "crash":
        prediction = model.predict(*split(args["run"]))
        if prediction.refused or prediction.events == 0:
            return None
    elif (
        (action == "tamper_artifact" and not model.intact(args["artifact"]))
        or (action == "restore_artifact" and model.intact(args["artifact"]))
        or (action == "delete_artifact" and model.content.get(args["artifact"], 0) is None)
        or (action == "corrupt_checkpoint" and not sim.checkpoints)
        or (action == "tamper_event" and not 1 <= args["seq"] <= sim.ledger.store.count_events())
    ):
        return None
    try:
        run_step(sim.run, sim.step(number, op))
        problems: list[Problem] = []
    except StepFailed as e:
        problems = list(e.failures)
    if action == "crash":
        if args["at"] == "after_commit":
            prediction.apply()
    elif action == "tamper_artifact":
        model.tamper(args["artifact"])
    elif action == "delete_artifact":
        model.delete(args["artifact"])
    elif action == "restore_artifact":
        model.restore(args["artifact"])
    elif action == "edit_manifest":
        model.specs[args["artifact"]] = model.specs[args["artifact"]] | args["set"]
    elif action == "checkpoint":
        sim.checkpoints += 1
    elif action == "corrupt_checkpoint":
        sim.broken_checkpoint = True
    elif action == "tamper_event":
        sim.tampered_seq = args["seq"]
    return problems


def _expectations(sim: _Sim) -> JSON:
    return {
        "events": sim.model.events,
        "candidates": {
            cid: {"state": c.state, "version": c.version, "trusted_states": sorted(c.trusted), "plan": c.plan}
            for cid, c in sim.model.candidates.items()
        },
        "verify_ok": sim.tampered_seq is None and not sim.broken_checkpoint,
    }


def kept_name(seed: int) -> str:
    """The name `drill --simulate --keep DIR` keeps the ledger of `seed` under (DIR/<name>.db)."""
    return f"simulated-seed-{seed}"


def simulate(schedule: Schedule, *, keep: Path | None = None, check_every: int = 20) -> SimResult:
    """Run `schedule` against a fresh SQLite ledger; stop at the first step whose invariants fail."""
    started = time.perf_counter()
    with _fixed_folder(schedule.seed) as folder:
        artifacts = parse_artifacts(Path("simulated"), schedule.artifacts)
        ws = Workspace(folder, schedule.seed)
        ids = itertools.count(1)
        ledger = Ledger.open(ws.db, synchronous="OFF", actor=ACTOR, clock=lambda: FIXED_CLOCK,
                             new_id=lambda: f"sim-{next(ids)}")  # fmt: skip
        scenario = Scenario(Path("simulated"), "simulated", "", schedule.seed, DrillConfig(), artifacts, ())
        run = Run(scenario, ws, ledger, random.Random(schedule.seed), str(ws.db), clock=lambda: FIXED_CLOCK)
        shas: dict[str, str] = {}
        try:
            ws.materialize(artifacts, DrillConfig())
            shas = dict(ws.shas)
            ledger.init()
            model = LedgerModel(baselines=shas, specs={k: dict(v) for k, v in schedule.specs.items()})
            sim = _Sim(schedule, model, run, artifacts)
            failure, ran = _loop(sim, check_every)
            head = ledger.store.head()
            result = SimResult(
                schedule.seed, len(ran), failure, {"seq": head.seq, "hash": head.hash}, ledger.store.count_events(),
                time.perf_counter() - started, tuple(ran), tuple(sim.refusals), tuple(sim.predicted),
                _expectations(sim),
            )  # fmt: skip
        finally:
            ledger.close()
        if keep is not None:
            ws.keep(keep, kept_name(schedule.seed))
    return result


def _loop(sim: _Sim, check_every: int) -> tuple[SimFailure | None, list[int]]:
    ran: list[int] = []
    ops = sim.schedule.ops
    for number, op in enumerate(ops, start=1):
        action, args = split(op)
        sim.run.child = {"clock": FIXED_CLOCK, "id_prefix": f"crash{number}", "actor": ACTOR}
        if action in COMMAND_ACTIONS:
            problems = _judge_command(sim, number, op, sim.model.predict(action, args))
        else:
            found = _fault(sim, number, op)
            if found is None:
                continue
            problems = found
        ran.append(number)
        if action == "tamper_event":  # the log is no longer trusted: fail-closed reads; only verify is asked
            return (SimFailure(number, op, tuple(problems + _whole(sim))) if problems or _whole(sim) else None), ran
        problems += _candidates(sim)
        if not problems and (number % check_every == 0 or number == len(ops) or (action != "expect" and
                             action in ("checkpoint", "corrupt_checkpoint", "tamper_event"))):  # fmt: skip
            problems += _whole(sim)
        if problems:
            return SimFailure(number, op, tuple(problems)), ran
    return None, ran
