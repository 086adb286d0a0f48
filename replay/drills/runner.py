"""Run a scenario's steps against a fresh ledger (a temporary file, or an empty PostgreSQL schema) and judge
them; every failure is reported, and a fault that cannot be injected here makes the scenario `inconclusive`."""

from __future__ import annotations

import functools
import random
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.manifests import utc_now
from lifecycle_fsm.replay.checkpoints import take_checkpoint
from lifecycle_fsm.replay.drills import faults, steps, writers
from lifecycle_fsm.replay.drills.faults import FaultOutcome, Problem
from lifecycle_fsm.replay.drills.report import DrillResult, Failure, StepResult
from lifecycle_fsm.replay.drills.schema import Scenario, Step
from lifecycle_fsm.replay.drills.workspace import Workspace
from lifecycle_fsm.replay.explain import explain
from lifecycle_fsm.replay.verify import verify
from lifecycle_fsm.results import CandidateResult
from lifecycle_fsm.store.base import verify_chain
from lifecycle_fsm.store.open import describe_target, is_postgres_url


@attrs.define
class StepFailed(Exception):
    """Carries the failures of one step, as (key, expected, actual), out of the code that checks it."""

    failures: list[Problem]
    detail: JSON = attrs.Factory(dict)


@attrs.define
class Run:
    """A scenario while it runs: its workspace, its ledger, its seeded randomness."""

    scenario: Scenario
    ws: Workspace
    ledger: Ledger
    rng: random.Random
    target: Path | str  # what the ledger was opened from: the file, or the PostgreSQL URL
    clock: Callable[[], str] = utc_now  # checkpoints' clock (the simulator fixes it)
    child: JSON = attrs.Factory(dict)  # the plan every child writer gets (the simulator: clock, ids, actor)
    mark: int = 0  # events before the last step that was not an `expect` ("+N" counts from here)
    audit: JSON | None = None  # the last `audit` step's hand-off record
    reopen: Callable[[], Ledger] | None = None  # a new Ledger on the target, as the next command's process opens

    @property
    def actor(self) -> str:
        return f"drill:{self.scenario.name}"


def _run_command(run: Run, step: Step) -> JSON:
    before = run.ledger.store.count_events()
    outcome = writers.call(run.ledger, writers.command_call(run.ws, step.spec))
    if (why := outcome.judge(step.refused, run.ws)) is not None:
        raise StepFailed([("outcome", step.refused.describe() if step.refused else "success", why)])
    if outcome.refused:
        if (after := run.ledger.store.count_events()) != before:
            raise StepFailed([("events", before, after)], {"refused": outcome.classes[0]})
        return {"refused": outcome.classes[0]}
    detail: JSON = {"appended": outcome.seqs}
    result = outcome.result
    if isinstance(result, CandidateResult):
        detail["state"] = result.candidate.state
        plan = result.candidate.last_recovery
        if step.action == "fail_stage" and plan is not None:
            detail["recovery"] = {k: plan[k] for k in steps.PLAN_KEYS}
    elif result.invalidated:
        detail["invalidated"] = list(result.invalidated)
    return detail


def _dig(doc: Any, path: str) -> Any:
    """A dotted path into a JSON document (`artifact.expected`, `path.0.to`); a marker when absent."""
    for part in path.split("."):
        if isinstance(doc, dict) and part in doc:
            doc = doc[part]
        elif isinstance(doc, list) and part.isdigit() and int(part) < len(doc):
            doc = doc[int(part)]
        else:
            return f"(no field {path})"
    return doc


def _explained(doc: JSON, want: JSON) -> JSON:
    decisive = doc["decisive_event"]
    got = {"seq": decisive["seq"], "type": decisive["type"], "reason_codes": list(doc["reason_codes"])}
    got = {k: v for k, v in got.items() if k in want}
    if "evidence" in want:
        got["evidence"] = {k: _dig(doc, k) for k in want["evidence"]}
    return got


def _candidate_found(run: Run, a: Any) -> JSON:
    """What the candidate keys of an `expect` compare with: now, or as of `as_of`."""
    cid = a["candidate"]
    try:
        doc = explain(run.ledger.store, cid, as_of=a.get("as_of"))
    except LifecycleError as e:
        raise StepFailed([("candidate", cid, run.ws.shown(str(e)))]) from None
    found: JSON = {"state": doc["state"], "reason_codes": list(doc["reason_codes"]), "as_of": a.get("as_of")}
    found |= {"trusted_states": sorted(doc["trusted_states"])}
    if "explain" in a:
        found["explain"] = _explained(doc, a["explain"])
    if "as_of" not in a:
        c = run.ledger.candidate(cid)
        handoff, plan = c.last_handoff or {}, c.last_recovery or {}
        found |= {"handoff": handoff.get("handoff_status"), "hard_failures": handoff.get("hard_failures")}
        found["recovery"] = {k: plan.get(k) for k in a.get("recovery", {})}
    return found


def _events_found(run: Run, want: Any) -> Any:
    now = run.ledger.store.count_events()
    if isinstance(want, int):
        return now
    delta = now - run.mark
    return "unchanged" if want == "unchanged" and delta == 0 else f"+{delta}"


def _expect(run: Run, step: Step) -> JSON:
    a = step.args
    found: JSON = _candidate_found(run, a) if "candidate" in a else {}
    if "events" in a:
        found["events"] = _events_found(run, a["events"])
    if "chain_valid" in a:
        found["chain_valid"] = verify_chain(run.ledger.store).ok
    if "verify_ok" in a or "bad_seq" in a:
        report = verify(run.ledger.store)
        found |= {"verify_ok": report["ok"], "bad_seq": report.get("bad_seq")}
    if "audit_handoff" in a:
        found["audit_handoff"] = None if run.audit is None else run.audit["handoff_status"]
    checked = [k for k in a if k != "candidate"]

    def label(key: str) -> str:
        return f"{a['candidate']} {key}" if key in steps.CANDIDATE_EXPECTATIONS else key

    if failures := [(label(k), a[k], run.ws.shown(found[k])) for k in checked if found[k] != a[k]]:
        raise StepFailed(failures)
    return {"checked": checked}


def _checkpoint(run: Run, _step: Step) -> JSON:
    record = take_checkpoint(run.ledger.store, clock=run.clock)
    return {"checkpoint_id": record.checkpoint_id, "position": record.position}


def _replay(run: Run, step: Step) -> JSON:
    assert isinstance(step.spec, steps.Replay)
    to, head = step.spec.to, run.ledger.store.head().seq
    if to is not None and not 0 <= to <= head:  # `lifecycle replay --to` refuses it: never "replayed to the head"
        why = f"--to {to}: a seq is never negative" if to < 0 else f"--to {to} is past the head of the log (seq {head})"
        raise StepFailed([("to", f"a seq from 0 to the head ({head})", why)])
    loaded, skipped, same = faults.load_both_ways(run.ledger.store, to)
    detail: JSON = {"from_checkpoint": None if loaded.checkpoint is None else loaded.checkpoint.position}
    detail |= {"position": loaded.state.position, "skipped": skipped}
    detail["states"] = {cid: c.state for cid, c in sorted(loaded.state.candidates.items())}
    if not same:
        raise StepFailed([("replay", "equal to a full replay", "differs")], detail)
    return detail


def _audit(run: Run, step: Step) -> JSON:
    from lifecycle_fsm import audit

    spec = step.spec
    assert isinstance(spec, steps.Audit)
    settings = run.ledger.settings()
    request = audit.AuditRequest(
        baseline=run.ws.manifests[spec.baseline],
        candidates=tuple(run.ws.manifests[c] for c in spec.candidates),
        label=spec.label,
        out=run.ws.root / "audit" / f"step-{step.number}",
        root=None,  # the drill's ledger has no artifact root: each adapter path is beside its manifest
        active_window=settings.active_window or 0,
        max_window_age=settings.max_window_age or 0,
    )
    result = audit.run(audit.prepare(request), run.ledger)
    run.audit = result.handoff
    records = result.evidence["candidate_records"]
    statuses = {r.get("candidate_id", r.get("manifest")): r["handoff_status"] for r in records}
    return {"handoff_status": result.handoff_status, "candidates": statuses}


def _damage(run: Run, step: Step) -> FaultOutcome:
    """Tamper with, delete, restore or edit an artifact on disk (its original bytes kept aside first)."""
    ws, spec = run.ws, step.spec
    name = step.args["artifact"]
    shown = str(ws.folders[name].relative_to(ws.root))
    if isinstance(spec, steps.RestoreArtifact):
        if not ws.restore(name):
            raise StepFailed([("restore", f"{name} tampered with or deleted before", "never damaged")])
        return FaultOutcome({"restored": shown})
    if isinstance(spec, steps.EditManifest):
        ws.edit_manifest(name, spec.set, spec.drop)
        return FaultOutcome({"edited": str(ws.manifests[name].relative_to(ws.root))})
    ws.backup(name)
    if isinstance(spec, steps.DeleteArtifact):
        shutil.rmtree(ws.folders[name])
        return FaultOutcome({"removed": shown})
    file = ws.folders[name] / ("state.bin" if ws.specs[name].type == "trusted_state" else "adapter_model.safetensors")
    had = ws.tampered.setdefault(name, set())
    return faults.tamper_artifact(file, rng=run.rng, shown=str(file.relative_to(ws.root)), had=had)


def _behind_the_store(run: Run, step: Step) -> FaultOutcome:
    """The faults that reach the ledger's rows, or run other writers against it."""
    if not (is_postgres_url(run.target) or Path(run.target).is_file()):
        raise writers.Inconclusive(f"{step.word} needs the ledger's file or server; this ledger is neither")
    store, spec, target = run.ledger.store, step.spec, str(run.target)
    if isinstance(spec, steps.CrashDuringAppend):
        return writers.crash_during_append(
            store, target, spec.candidate, spec.stage, spec.commands, rng=run.rng, actor=f"{run.actor}:crash"
        )
    if isinstance(spec, steps.Crash):
        return writers.crash(store, run.ws, target, step, {"actor": f"{run.actor}:crash"} | run.child)
    if isinstance(spec, steps.Concurrently):
        return writers.concurrently(store, run.ws, target, step, run.actor)
    if isinstance(spec, steps.TamperEvent):
        outcome = faults.tamper_event(store, run.target, seq=spec.seq, rng=run.rng)
        if run.reopen is not None:  # the folds this Ledger holds were read before the edit: the next command's
            run.ledger.close()  # process (an operator's CLI call) reads the edited rows
            run.ledger = run.reopen()
        return outcome
    return faults.corrupt_checkpoint(store, run.target)


def _fault(fault: Callable[[Run, Step], FaultOutcome]) -> Callable[[Run, Step], JSON]:
    def run_fault(run: Run, step: Step) -> JSON:
        outcome = fault(run, step)
        detail: JSON = run.ws.shown(outcome.detail)
        if outcome.problems:
            raise StepFailed([(k, e, run.ws.shown(v)) for k, e, v in outcome.problems], detail)
        return detail

    return run_fault


STEPS: dict[str, Callable[[Run, Step], JSON]] = {
    "checkpoint": _checkpoint,
    "expect": _expect,
    "replay": _replay,
    "audit": _audit,
    **{name: _fault(_damage) for name in (*steps.DAMAGE, "edit_manifest")},
    **{name: _fault(_behind_the_store) for name, cls in steps.ACTIONS.items() if cls.needs_store},
    **{name: _run_command for name in steps.COMMAND_ACTIONS},
}


def run_step(run: Run, step: Step) -> JSON:
    return STEPS[step.action](run, step)


def _run_steps(run: Run) -> tuple[list[StepResult], list[Failure], list[str]]:
    results: list[StepResult] = []
    failures: list[Failure] = []
    inconclusive: list[str] = []
    for step in run.scenario.steps:
        if step.action != "expect":
            run.mark = run.ledger.store.count_events()
        detail: JSON = {}
        ok = False
        try:
            detail, ok = run_step(run, step), True
        except StepFailed as e:
            detail = e.detail
            failures.extend(Failure(step.number, step.word, k, exp, act) for k, exp, act in e.failures)
        except writers.Inconclusive as e:
            detail = {"inconclusive": str(e)}
            inconclusive.append(f"step {step.number} ({step.word}): {e}")
        except Exception as e:  # a library bug must fail the drill, not hide the other steps and scenarios
            actual = run.ws.shown(f"{type(e).__name__}: {e}")
            failures.append(Failure(step.number, step.word, "outcome", "success", actual))
        results.append(StepResult(step.number, step.word, ok, detail))
    return results, failures, inconclusive


def run_scenario(
    scenario: Scenario, *, seed: int | None = None, keep_dir: Path | None = None, ledger_url: str | None = None
) -> DrillResult:
    """Run one scenario against a fresh ledger: a file in a temporary folder, or `ledger_url` (empty)."""
    seed = scenario.seed if seed is None else seed
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix=f"drill-{scenario.name}-") as tmp:
        ws = Workspace(Path(tmp), seed)
        target: Path | str = ws.db if ledger_url is None else ledger_url
        reopen = functools.partial(Ledger.open, target, synchronous="NORMAL", actor=f"drill:{scenario.name}")
        run = Run(scenario, ws, reopen(), random.Random(seed), target, reopen=reopen)
        try:
            config = scenario.config
            ws.materialize(scenario.artifacts, config)
            run.ledger.init(config.max_window_age, config.active_window)
            if config.evaluation_version is not None:
                run.ledger.activate_evaluation(config.evaluation_version)
            results, failures, inconclusive = _run_steps(run)
            events = run.ledger.store.count_events()
        finally:
            run.ledger.close()
        kept = None
        if keep_dir is not None:  # a PostgreSQL ledger stays where it is: the caller owns its schema
            kept = ws.keep(keep_dir, scenario.name) if ledger_url is None else describe_target(target)
    return DrillResult(
        scenario.name,
        scenario.path.name,
        seed,
        len(scenario.steps),
        tuple(results),
        tuple(failures),
        events,
        time.perf_counter() - started,
        kept,
        tuple(inconclusive),
    )


def run_drills(
    scenarios: Sequence[Scenario], *, seed: int | None = None, keep_dir: Path | None = None
) -> list[DrillResult]:
    """Run every scenario, each against its own fresh ledger."""
    return [run_scenario(s, seed=seed, keep_dir=keep_dir) for s in scenarios]
