"""Drills: run a scenario's steps against a fresh SQLite ledger and judge the outcome.

Each scenario gets its own temporary folder: the artifacts it declares (adapter
folders with manifests written the way `lifecycle hash` hashes them, trusted-state
folders), and a new ledger file initialised from its `config`. Steps call the real
`Ledger`, faults damage the real files (`replay.faults_inject`), expectations read
the ledger back. A run stops at the first step that fails, saying the step number,
what was expected and what was found.

Reports are deterministic: the same files and seed give the same report, apart from
the `timings` field (wall-clock durations live only there). Paths inside the
temporary folder are shown as `<workspace>/…`.
"""

from __future__ import annotations

import random
import sqlite3
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from contextlib import closing
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.artifacts import hash_directory
from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.fixtures import baseline_manifest, candidate_manifest, write_adapter, write_manifest
from lifecycle_fsm.ledger import CommandResult, Ledger, utc_now
from replay import faults_inject
from replay.checkpoints import load_state, take_checkpoint
from replay.fold import snapshot_json
from replay.scenario import COMMAND_ACTIONS, ERROR_CLASSES, ArtifactSpec, Scenario, Step
from replay.verify import verify

__all__ = ["DrillResult", "Failure", "StepResult", "build_report", "report_markdown", "run_drills", "run_scenario"]

JSON = dict[str, Any]


@attrs.frozen
class Failure:
    """An expectation that did not hold: where, what was expected, what was found."""

    step: int
    action: str
    key: str
    expected: Any
    actual: Any

    def message(self) -> str:
        return f"step {self.step} ({self.action}): {self.key}: expected {self.expected!r}, actual {self.actual!r}"

    def to_json(self) -> JSON:
        return attrs.asdict(self) | {"message": self.message()}


@attrs.frozen
class StepResult:
    """One step as it ran: whether it held, and what it did (deterministic facts only)."""

    number: int
    action: str
    ok: bool
    detail: JSON


@attrs.frozen
class DrillResult:
    """One scenario's outcome."""

    name: str
    file: str
    seed: int
    steps_total: int
    steps: tuple[StepResult, ...]
    failures: tuple[Failure, ...]
    events: int
    seconds: float
    kept: str | None = None

    @property
    def ok(self) -> bool:
        return not self.failures and len(self.steps) == self.steps_total

    def to_json(self) -> JSON:
        """Everything but the duration (that goes to the report's `timings`)."""
        return {
            "name": self.name, "file": self.file, "seed": self.seed, "result": "pass" if self.ok else "fail",
            "steps": self.steps_total, "steps_run": len(self.steps), "events": self.events,
            "failures": [f.to_json() for f in self.failures], "kept": self.kept,
            "step_results": [attrs.asdict(s) for s in self.steps],
        }  # fmt: skip


class _StepFailed(Exception):
    """Carries the failures of one step out of the code that checks it."""

    def __init__(self, failures: list[tuple[str, Any, Any]], detail: JSON | None = None) -> None:
        super().__init__(failures)
        self.failures = failures
        self.detail = detail or {}


@attrs.define
class _Run:
    """A scenario while it runs: its folder, its ledger, its artifacts, its seeded randomness."""

    scenario: Scenario
    root: Path
    ledger: Ledger
    rng: random.Random
    seed: int
    folders: dict[str, Path] = attrs.Factory(dict)  # artifact -> adapter or trusted-state folder
    manifests: dict[str, Path] = attrs.Factory(dict)

    @property
    def db(self) -> Path:
        return self.root / "ledger.db"

    def shown(self, value: Any) -> Any:
        """Hide the temporary folder so reports compare equal across runs."""
        if isinstance(value, str):
            for prefix in {str(self.root.resolve()), str(self.root)}:
                value = value.replace(prefix, "<workspace>")
        elif isinstance(value, list):
            value = [self.shown(v) for v in value]
        elif isinstance(value, dict):
            value = {k: self.shown(v) for k, v in value.items()}
        return value


def _materialize(run: _Run, spec: ArtifactSpec, shas: dict[str, str]) -> None:
    """Write one artifact (and its manifest) into the workspace."""
    home = run.root / "artifacts" / spec.name
    rng = random.Random(f"{run.seed}:{spec.name}")  # each artifact's bytes depend only on the seed and its name
    if spec.type == "trusted_state":
        home.mkdir(parents=True)
        (home / "state.bin").write_bytes(rng.randbytes(spec.size))
        run.folders[spec.name] = home
        return
    sha = hash_directory(write_adapter(home / "adapter", spec.name, rng.randbytes(spec.size)))
    overrides = dict(spec.manifest)
    claimed = overrides.pop("adapter_sha256", sha)
    manifest: JSON
    if spec.type == "baseline":
        shas[spec.name] = sha
        manifest = baseline_manifest(claimed) | overrides
    else:
        baseline = spec.source or next(iter(shas), None)
        config = run.scenario.config
        fields: JSON = {
            "source_policy_version": shas.get(baseline) if baseline else None,
            "policy_version": spec.name,
            "evaluation_version": config.evaluation_version or "eval-v1",
        }
        if spec.type != "dpo":
            fields["evidence_window_index"] = config.active_window
        manifest = candidate_manifest(spec.type, adapter_sha256=claimed, **(fields | overrides))
    for key in spec.drop:
        if key == "adapter_sha256":
            manifest["artifacts"]["adapter"].pop("sha256")
        else:
            manifest.pop(key, None)
    run.folders[spec.name] = home / "adapter"
    run.manifests[spec.name] = write_manifest(home / "manifest.json", manifest)


_Command = Callable[["_Run", Mapping[str, Any]], CommandResult]
_COMMANDS: dict[str, _Command] = {
    "activate_baseline": lambda run, a: run.ledger.activate_baseline(run.manifests[a["artifact"]]),
    "receive": lambda run, a: run.ledger.receive(run.manifests[a["artifact"]], candidate_id=a.get("id")),
    "check": lambda run, a: run.ledger.check(a["candidate"]),
    "record_trusted_state": lambda run, a: run.ledger.record_trusted_state(
        a["candidate"], a["kind"], run.folders[a["artifact"]]
    ),
    "invalidate_trusted_state": lambda run, a: run.ledger.invalidate_trusted_state(
        a["candidate"], a["kind"], a.get("reason", "invalidated by drill")
    ),
    "fail_stage": lambda run, a: run.ledger.fail_stage(a["candidate"], a["stage"]),
    "complete_recovery": lambda run, a: run.ledger.complete_recovery(a["candidate"]),
    "hand_off": lambda run, a: run.ledger.hand_off(a["candidate"]),
    "advance_window": lambda run, a: run.ledger.advance_window(a["window"]),
    "activate_evaluation": lambda run, a: run.ledger.activate_evaluation(a["version"]),
}


def _run_command(run: _Run, step: Step) -> JSON:
    before = run.ledger.store.count_events()
    try:
        result = _COMMANDS[step.action](run, step.args)
    except Exception as e:
        name = type(e).__name__
        if step.refused is not None and isinstance(e, ERROR_CLASSES[step.refused]):
            after = run.ledger.store.count_events()
            if after != before:
                raise _StepFailed([("events", before, after)], {"refused": name}) from e
            return {"refused": name}
        expected = f"refused with {step.refused}" if step.refused else "success"
        raise _StepFailed([("outcome", expected, run.shown(f"{name}: {e}"))]) from e
    appended = [] if result.duplicate else [e.seq for e in result.events]
    if step.refused is not None:
        raise _StepFailed([("outcome", f"refused with {step.refused}", f"success (appended {len(appended)})")])
    detail: JSON = {"appended": appended}
    if result.candidate is not None:
        detail["state"] = result.candidate.state
        plan = result.candidate.last_recovery
        if step.action == "fail_stage" and plan is not None:
            detail["recovery"] = {k: plan[k] for k in ("action", "recovery_state", "reused_state")}
    if result.invalidated:
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
    failures = [(f"{subject}{k}", a[k], run.shown(found[k])) for k in checked if found[k] != a[k]]
    if failures:
        raise _StepFailed(failures)
    return {"checked": checked}


def _replay(run: _Run, step: Step) -> JSON:
    to = step.optional("to")
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
    a, store = step.args, run.ledger.store
    if step.action == "crash_during_append":
        outcome = faults_inject.crash_during_append(
            store, run.db, candidate=a["candidate"], stage=a.get("stage", "sampling"),
            commands=a.get("commands", 3), rng=run.rng, actor=f"drill:{run.scenario.name}:crash",
        )  # fmt: skip
    elif step.action == "corrupt_checkpoint":
        outcome = faults_inject.corrupt_checkpoint(store, run.db)
    elif step.action == "tamper_event":
        outcome = faults_inject.tamper_event(store, run.db, seq=step.optional("seq"), rng=run.rng)
    else:
        name = a["artifact"]
        folder = run.folders[name]
        shown = str(folder.relative_to(run.root))
        if step.action == "delete_artifact":
            outcome = faults_inject.delete_artifact(folder, shown=shown)
        else:
            file = folder / ("state.bin" if run.scenario.artifacts[name].type == "trusted_state" else
                             "adapter_model.safetensors")  # fmt: skip
            outcome = faults_inject.tamper_artifact(file, rng=run.rng, shown=str(file.relative_to(run.root)))
    detail: JSON = run.shown(outcome.detail)
    if outcome.problems:
        raise _StepFailed([(k, e, run.shown(v)) for k, e, v in outcome.problems], detail)
    return detail


def _step(run: _Run, step: Step) -> JSON:
    if step.action == "checkpoint":
        record = take_checkpoint(run.ledger.store, clock=utc_now)
        return {"checkpoint_id": record.checkpoint_id, "position": record.position}
    handlers = {"expect": _expect, "replay": _replay}
    return handlers.get(step.action, _run_command if step.action in COMMAND_ACTIONS else _fault)(run, step)


def _keep(db: Path, keep_dir: Path, name: str) -> str:
    """Copy the ledger (a consistent copy via SQLite's backup API) to keep_dir/<name>.db."""
    keep_dir.mkdir(parents=True, exist_ok=True)
    target = keep_dir / f"{name}.db"
    target.unlink(missing_ok=True)
    with closing(sqlite3.connect(db)) as src, closing(sqlite3.connect(target)) as dst:
        src.backup(dst)
    return target.name


def run_scenario(scenario: Scenario, *, seed: int | None = None, keep_dir: Path | None = None) -> DrillResult:
    """Run one scenario against a fresh ledger in a temporary folder."""
    seed = scenario.seed if seed is None else seed
    started = time.perf_counter()
    results: list[StepResult] = []
    failures: list[Failure] = []
    with tempfile.TemporaryDirectory(prefix=f"drill-{scenario.name}-") as tmp:
        root = Path(tmp)
        ledger = Ledger.open(root / "ledger.db", synchronous="NORMAL", actor=f"drill:{scenario.name}")
        run = _Run(scenario, root, ledger, random.Random(seed), seed)
        try:
            shas: dict[str, str] = {}
            for spec in sorted(scenario.artifacts.values(), key=lambda s: s.type != "baseline"):
                _materialize(run, spec, shas)
            config = scenario.config
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
                                            run.shown(f"{type(e).__name__}: {e}")))  # fmt: skip
                    break
                results.append(StepResult(step.number, step.action, True, detail))
            events = ledger.store.count_events()
        finally:
            ledger.close()
        kept = _keep(run.db, keep_dir, scenario.name) if keep_dir is not None else None
    return DrillResult(
        scenario.name, scenario.path.name, seed, len(scenario.steps), tuple(results), tuple(failures),
        events, time.perf_counter() - started, kept,
    )  # fmt: skip


def run_drills(
    scenarios: Sequence[Scenario], *, seed: int | None = None, keep_dir: Path | None = None
) -> list[DrillResult]:
    """Run every scenario, each against its own fresh ledger."""
    return [run_scenario(s, seed=seed, keep_dir=keep_dir) for s in scenarios]


def build_report(results: Sequence[DrillResult]) -> JSON:
    """The report `drill --json` prints and `--report` writes; only `timings` varies between runs."""
    passed = sum(1 for r in results if r.ok)
    return {
        "ok": passed == len(results),
        "summary": {"scenarios": len(results), "passed": passed, "failed": len(results) - passed},
        "scenarios": [r.to_json() for r in results],
        "timings": {
            "total_seconds": round(sum(r.seconds for r in results), 3),
            "scenarios": {r.name: round(r.seconds, 3) for r in results},
        },
    }


def report_markdown(report: JSON) -> str:
    """drill-report.md: the same facts for people; timings in the last section only."""
    s = report["summary"]
    lines = [
        "# Drill report", "",
        f"**{'PASS' if report['ok'] else 'FAIL'}**: {s['passed']} of {s['scenarios']} scenarios passed.", "",
        "| scenario | file | seed | steps | events | result |", "|---|---|---|---|---|---|",
    ]  # fmt: skip
    for r in report["scenarios"]:
        steps = f"{r['steps_run']}/{r['steps']}"
        lines.append(f"| {r['name']} | {r['file']} | {r['seed']} | {steps} | {r['events']} | {r['result']} |")
    failed = [r for r in report["scenarios"] if r["failures"]]
    if failed:
        lines += ["", "## Failures", ""]
        lines += [f"- `{r['name']}` {f['message']}" for r in failed for f in r["failures"]]
    lines += ["", "## Timings", "", "| scenario | seconds |", "|---|---|"]
    lines += [f"| {name} | {sec:.3f} |" for name, sec in report["timings"]["scenarios"].items()]
    lines.append(f"| **total** | {report['timings']['total_seconds']:.3f} |")
    return "\n".join(lines) + "\n"
