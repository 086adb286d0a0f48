"""Run a scenario's steps against a fresh ledger and judge the outcome.

Each scenario gets its own temporary folder (`workspace.Workspace`): the artifacts it
declares and a new ledger initialised from its `config` (an SQLite file in the folder,
or, given `ledger_url`, an empty PostgreSQL schema: the drills run on both backends). Steps call the real
`Ledger`, faults damage the real files (`faults`), expectations read the ledger
back. A run stops at the first step that fails, saying the step number, what was
expected and what was found. Paths inside the temporary folder are shown as
`<workspace>/…`.
"""

from __future__ import annotations

import random
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.ledger import CandidateResult, CommandResult, Ledger, utc_now
from replay.checkpoints import load_state, take_checkpoint
from replay.drills import faults, schema
from replay.drills.report import DrillResult, Failure, StepResult
from replay.drills.schema import ERROR_CLASSES, Scenario, Step
from replay.drills.workspace import Workspace
from replay.fold import snapshot_json
from replay.verify import verify
from store.open import describe_target

__all__ = ["run_drills", "run_scenario"]

JSON = dict[str, Any]


class _StepFailed(Exception):
    """Carries the failures of one step out of the code that checks it."""

    def __init__(self, failures: list[tuple[str, Any, Any]], detail: JSON | None = None) -> None:
        super().__init__(failures)
        self.failures = failures
        self.detail = detail or {}


@attrs.frozen
class _Run:
    """A scenario while it runs: its workspace, its ledger, its seeded randomness."""

    scenario: Scenario
    ws: Workspace
    ledger: Ledger
    rng: random.Random
    target: Path | str  # what the ledger was opened from: the file, or the PostgreSQL URL


def _command(run: _Run, spec: schema.Action) -> CommandResult:
    """The ledger command a step names, with its artifacts' files from the workspace."""
    ledger, ws = run.ledger, run.ws
    match spec:
        case schema.ActivateBaseline(artifact=name):
            return ledger.activate_baseline(ws.manifests[name])
        case schema.Receive(artifact=name, id=candidate_id):
            return ledger.receive(ws.manifests[name], candidate_id=candidate_id)
        case schema.Check(candidate=candidate):
            return ledger.check(candidate)
        case schema.RecordTrustedState(candidate=candidate, kind=kind, artifact=name):
            return ledger.record_trusted_state(candidate, kind, ws.folders[name])
        case schema.InvalidateTrustedState(candidate=candidate, kind=kind, reason=reason):
            return ledger.invalidate_trusted_state(candidate, kind, reason)
        case schema.FailStage(candidate=candidate, stage=stage):
            return ledger.fail_stage(candidate, stage)
        case schema.CompleteRecovery(candidate=candidate):
            return ledger.complete_recovery(candidate)
        case schema.HandOff(candidate=candidate):
            return ledger.hand_off(candidate)
        case schema.AdvanceWindow(window=window):
            return ledger.advance_window(window)
        case schema.ActivateEvaluation(version=version):
            return ledger.activate_evaluation(version)
    raise AssertionError(f"not a ledger command: {spec.name}")


def _run_command(run: _Run, step: Step) -> JSON:
    before = run.ledger.store.count_events()
    try:
        result = _command(run, step.spec)
    except Exception as e:
        name = type(e).__name__
        if step.refused is not None and isinstance(e, ERROR_CLASSES[step.refused]):
            after = run.ledger.store.count_events()
            if after != before:
                raise _StepFailed([("events", before, after)], {"refused": name}) from e
            return {"refused": name}
        expected = f"refused with {step.refused}" if step.refused else "success"
        raise _StepFailed([("outcome", expected, run.ws.shown(f"{name}: {e}"))]) from e
    appended = [] if result.duplicate else [e.seq for e in result.events]
    if step.refused is not None:
        raise _StepFailed([("outcome", f"refused with {step.refused}", f"success (appended {len(appended)})")])
    detail: JSON = {"appended": appended}
    if isinstance(result, CandidateResult):
        detail["state"] = result.candidate.state
        plan = result.candidate.last_recovery
        if step.action == "fail_stage" and plan is not None:
            detail["recovery"] = {k: plan[k] for k in ("action", "recovery_state", "reused_state")}
    elif result.invalidated:
        detail["invalidated"] = list(result.invalidated)
    return detail


def _expect(run: _Run, step: Step) -> JSON:
    a = step.args
    found: JSON = {}
    if "candidate" in a:
        try:
            c = run.ledger.candidate(a["candidate"])
        except NotFoundError:
            raise _StepFailed([("candidate", a["candidate"], "unknown candidate")]) from None
        handoff = c.last_handoff or {}
        plan = c.last_recovery or {}
        found |= {
            "state": c.state, "reason_codes": list(c.reason_codes), "trusted_states": sorted(c.trusted_states),
            "handoff": handoff.get("handoff_status"), "hard_failures": handoff.get("hard_failures"),
            "recovery": {k: plan.get(k) for k in a.get("recovery", {})},
        }  # fmt: skip
    if "events" in a:
        found["events"] = run.ledger.store.count_events()
    if "chain_valid" in a:
        found["chain_valid"] = run.ledger.store.verify_chain().ok
    if "verify_ok" in a or "bad_seq" in a:
        report = verify(run.ledger.store)
        found |= {"verify_ok": report["ok"], "bad_seq": report.get("bad_seq")}
    checked = [k for k in a if k != "candidate"]
    subject = f"{a['candidate']} " if "candidate" in a else ""
    failures = [(f"{subject}{k}", a[k], run.ws.shown(found[k])) for k in checked if found[k] != a[k]]
    if failures:
        raise _StepFailed(failures)
    return {"checked": checked}


def _replay(run: _Run, to: int | None) -> JSON:
    loaded = load_state(run.ledger.store, to=to)
    full = load_state(run.ledger.store, to=to, use_checkpoints=False)
    detail = {
        "from_checkpoint": None if loaded.checkpoint is None else loaded.checkpoint.position,
        "position": loaded.state.position,
        "skipped": [{"checkpoint_id": cid, "reason": why} for cid, why in loaded.skipped],
        "states": {cid: c.state for cid, c in sorted(loaded.state.candidates.items())},
    }
    if snapshot_json(loaded.state) != snapshot_json(full.state):
        raise _StepFailed([("replay", "equal to a full replay", "differs")], detail)
    return detail


def _fault(run: _Run, step: Step) -> JSON:
    store, ws = run.ledger.store, run.ws
    target = run.target
    match step.spec:
        case schema.CrashDuringAppend(candidate=candidate, stage=stage, commands=commands):
            outcome = faults.crash_during_append(
                store, target, candidate=candidate, stage=stage, commands=commands, rng=run.rng,
                actor=f"drill:{run.scenario.name}:crash",
            )  # fmt: skip
        case schema.CorruptCheckpoint():
            outcome = faults.corrupt_checkpoint(store, target)
        case schema.TamperEvent(seq=seq):
            outcome = faults.tamper_event(store, target, seq=seq, rng=run.rng)
        case schema.DeleteArtifact(artifact=name):
            outcome = faults.delete_artifact(ws.folders[name], shown=str(ws.folders[name].relative_to(ws.root)))
        case schema.TamperArtifact(artifact=name):
            trusted = run.scenario.artifacts[name].type == "trusted_state"
            file = ws.folders[name] / ("state.bin" if trusted else "adapter_model.safetensors")
            outcome = faults.tamper_artifact(file, rng=run.rng, shown=str(file.relative_to(ws.root)))
        case _:
            raise AssertionError(f"not a fault: {step.action}")
    detail: JSON = run.ws.shown(outcome.detail)
    if outcome.problems:
        raise _StepFailed([(k, e, run.ws.shown(v)) for k, e, v in outcome.problems], detail)
    return detail


def _step(run: _Run, step: Step) -> JSON:
    match step.spec:
        case schema.Checkpoint():
            record = take_checkpoint(run.ledger.store, clock=utc_now)
            return {"checkpoint_id": record.checkpoint_id, "position": record.position}
        case schema.Expect():
            return _expect(run, step)
        case schema.Replay(to=to):
            return _replay(run, to)
        case spec if spec.command:
            return _run_command(run, step)
    return _fault(run, step)


def run_scenario(
    scenario: Scenario, *, seed: int | None = None, keep_dir: Path | None = None, ledger_url: str | None = None
) -> DrillResult:
    """Run one scenario against a fresh ledger: a file in a temporary folder, or `ledger_url` (empty)."""
    seed = scenario.seed if seed is None else seed
    started = time.perf_counter()
    results: list[StepResult] = []
    failures: list[Failure] = []
    with tempfile.TemporaryDirectory(prefix=f"drill-{scenario.name}-") as tmp:
        ws = Workspace(Path(tmp), seed)
        target = ws.db if ledger_url is None else ledger_url
        where = describe_target(target)  # a PostgreSQL ledger is kept where it is: the caller owns its schema
        ledger = Ledger.open(target, synchronous="NORMAL", actor=f"drill:{scenario.name}")
        run = _Run(scenario, ws, ledger, random.Random(seed), target)
        try:
            config = scenario.config
            ws.materialize(scenario.artifacts, config)
            ledger.init(config.max_window_age, config.active_window)
            if config.evaluation_version is not None:
                ledger.activate_evaluation(config.evaluation_version)
            for step in scenario.steps:
                try:
                    detail = _step(run, step)
                except _StepFailed as e:
                    results.append(StepResult(step.number, step.action, False, e.detail))
                    failures.extend(Failure(step.number, step.action, k, exp, act) for k, exp, act in e.failures)
                    break
                except Exception as e:  # a library bug must fail the drill, not hide the other scenarios
                    results.append(StepResult(step.number, step.action, False, {}))
                    failures.append(Failure(step.number, step.action, "outcome", "success",
                                            run.ws.shown(f"{type(e).__name__}: {e}")))  # fmt: skip
                    break
                results.append(StepResult(step.number, step.action, True, detail))
            events = ledger.store.count_events()
        finally:
            ledger.close()
        kept = None if keep_dir is None else ws.keep(keep_dir, scenario.name) if ledger_url is None else where
    return DrillResult(
        scenario.name, scenario.path.name, seed, len(scenario.steps), tuple(results), tuple(failures),
        events, time.perf_counter() - started, kept,
    )  # fmt: skip


def run_drills(
    scenarios: Sequence[Scenario], *, seed: int | None = None, keep_dir: Path | None = None
) -> list[DrillResult]:
    """Run every scenario, each against its own fresh ledger."""
    return [run_scenario(s, seed=seed, keep_dir=keep_dir) for s in scenarios]
