"""Commands run outside the drill's own `Ledger`: in a child process killed at a commit point
(`crash`), or in several writers at once (`concurrently`).

Each returns what happened (deterministic facts, for the report) and the ledger's broken
promises as `(key, expected, actual)`. A fault this platform cannot inject raises
`Inconclusive`: the scenario is then `inconclusive`, never `pass`.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import orjson

from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.drills import schema
from lifecycle_fsm.replay.drills.faults import FaultOutcome, Problem, child_env, integrity
from lifecycle_fsm.replay.drills.schema import Refusal, Step
from lifecycle_fsm.replay.drills.workspace import Workspace
from lifecycle_fsm.store.base import EventStore

__all__ = ["Call", "Inconclusive", "command_call", "concurrently", "crash", "refusal_problem"]

Call = tuple[str, list[Any], dict[str, Any]]  # a Ledger method, its positional and keyword arguments
Outcome = tuple[str, Any, Any]  # ("done", seqs, None) or ("refused", class name, message)


class Inconclusive(Exception):
    """The fault cannot be injected here (no SIGKILL, not a SQLite file): the drill proves nothing."""


def command_call(ws: Workspace, spec: schema.Action) -> Call:
    """The `Ledger` method a command step names, with its artifacts' files from the workspace."""
    match spec:
        case schema.ActivateBaseline(artifact=name):
            return "activate_baseline", [str(ws.manifests[name])], {}
        case schema.Receive(artifact=name, id=candidate_id):
            return "receive", [str(ws.manifests[name])], {"candidate_id": candidate_id}
        case schema.Check(candidate=c) | schema.CompleteRecovery(candidate=c) | schema.HandOff(candidate=c):
            method = {"check": "check", "complete_recovery": "complete_recovery", "hand_off": "hand_off"}[spec.name]
            return method, [c], {}
        case schema.RecordTrustedState(candidate=candidate, kind=kind, artifact=name):
            return "record_trusted_state", [candidate, kind, str(ws.folders[name])], {}
        case schema.InvalidateTrustedState(candidate=candidate, kind=kind, reason=reason):
            return "invalidate_trusted_state", [candidate, kind, reason], {}
        case schema.FailStage(candidate=candidate, stage=stage):
            return "fail_stage", [candidate, stage], {}
        case schema.AdvanceWindow(window=window):
            return "advance_window", [window], {}
        case schema.ActivateEvaluation(version=version):
            return "activate_evaluation", [version], {}
    raise AssertionError(f"not a ledger command: {spec.name}")


def refusal_problem(refusal: Refusal, name: str, message: str) -> str | None:
    """Why an error does not match `refused:` (exact class, then message), or None when it does."""
    if name != refusal.error:
        return f"{name}: {message}"
    if refusal.message is not None and message != refusal.message:
        return f"{name}: {message}"
    if refusal.contains is not None and refusal.contains not in message:
        return f"{name}: {message}"
    return None


def _run_child(
    target: str, calls: Sequence[Call], actor: str, fault: str | None, extra: dict[str, Any]
) -> subprocess.CompletedProcess[str]:
    plan = orjson.dumps({"actor": actor, "calls": calls, "go": None} | extra).decode()
    return subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm.replay.drills.child", target, plan],
        env=child_env(fault), capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip


def _parse(stdout: str) -> list[Outcome]:
    outcomes: list[Outcome] = []
    for line in stdout.splitlines():
        words = line.split(" ", 3)
        if words[0] == "done":
            outcomes.append(("done", [int(w) for w in line.split()[2:]], None))
        elif words[0] == "refused":
            outcomes.append(("refused", words[2], orjson.loads(words[3])))
    return outcomes


def crash(
    store: EventStore, ws: Workspace, target: str, step: Step, actor: str, extra: dict[str, Any] | None = None
) -> FaultOutcome:
    """Run `step.inner[0]` in a child that SIGKILLs itself at the planned commit point."""
    if os.name != "posix":
        raise Inconclusive("SIGKILL at a commit point needs a POSIX platform")
    assert isinstance(step.spec, schema.Crash)
    at, commit = step.spec.at, step.spec.commit
    inner = step.inner[0]
    fault = f"kill@{at}#{commit}"
    before = store.count_events()
    proc = _run_child(target, [command_call(ws, inner.spec)], actor, fault, extra or {})
    after = store.count_events()
    detail = {"command": inner.action, "fault": fault, "returncode": proc.returncode, "events_appended": after - before}
    problems: list[Problem] = []
    if proc.returncode != -signal.SIGKILL:
        outcomes = _parse(proc.stdout)
        what = (
            f"exit {proc.returncode} after {outcomes[0][0]} (the command made fewer than {commit} commits)"
            if outcomes
            else f"exit {proc.returncode} ({(proc.stderr.strip().splitlines() or ['no output'])[-1]})"
        )
        problems.append(("killed", f"SIGKILL at {at} on commit {commit}", ws.shown(what)))
    elif at == "before_commit" and after != before:
        problems.append(("events", f"{before} (the killed transaction leaves nothing)", after))
    elif at == "after_commit" and after <= before:
        problems.append(("events", f"more than {before} (the commit happened before the kill)", after))
    problems.extend(integrity(store))
    return FaultOutcome(detail, tuple(problems))


def concurrently(store: EventStore, ws: Workspace, target: str, step: Step, actor: str) -> FaultOutcome:
    """Start every writer together (processes wait on a go-file, threads on a barrier) and judge them."""
    assert isinstance(step.spec, schema.Concurrently)
    repeat, mode = step.spec.repeat, step.spec.mode
    plans = [[command_call(ws, w.spec)] * repeat for w in step.inner]
    before = store.count_events()
    if mode == "processes":
        results = _processes(target, plans, actor, ws.root / f"go-{step.number}")
    else:
        results = _threads(target, plans, actor)
    after = store.count_events()
    problems: list[Problem] = []
    appended = 0
    for i, (writer, outcomes) in enumerate(zip(step.inner, results, strict=True)):
        if len(outcomes) != repeat:
            problems.append((f"writers[{i}]", f"{repeat} commands run", f"{len(outcomes)} run"))
        for kind, value, message in outcomes:
            if kind == "done":
                appended += len(value)
                if writer.refused is not None:
                    problems.append((f"writers[{i}]", writer.refused.describe(), f"success (appended {len(value)})"))
            elif writer.refused is None or refusal_problem(writer.refused, value, ws.shown(message)):
                expected = "success" if writer.refused is None else writer.refused.describe()
                problems.append((f"writers[{i}]", expected, ws.shown(f"{value}: {message}")))
    if after - before != appended:
        problems.append(("events", f"{before} + {appended} acknowledged", after))
    problems.extend(integrity(store))
    summary = [sorted({"done" if k == "done" else f"refused:{v}" for k, v, _ in outcomes}) for outcomes in results]
    detail = {"mode": mode, "writers": len(plans), "repeat": repeat, "events_appended": after - before,
              "outcomes": summary}  # fmt: skip
    return FaultOutcome(detail, tuple(problems))


def _processes(target: str, plans: list[list[Call]], actor: str, go: Path) -> list[list[Outcome]]:
    procs = []
    for i, calls in enumerate(plans):
        plan = orjson.dumps({"actor": f"{actor}:w{i}", "calls": calls, "go": str(go)}).decode()
        procs.append(subprocess.Popen(
            [sys.executable, "-m", "lifecycle_fsm.replay.drills.child", target, plan], env=child_env(None),
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        ))  # fmt: skip
    for p in procs:  # every writer has opened its ledger before any starts
        assert p.stdout is not None
        p.stdout.readline()
    go.touch()
    results = []
    try:
        for p in procs:
            out, _ = p.communicate(timeout=120)
            results.append(_parse(out))
    except BaseException:  # a writer that hangs (or Ctrl-C): none of the others is left running
        for p in procs:
            p.kill()
            p.wait()
        raise
    return results


def _threads(target: str, plans: list[list[Call]], actor: str) -> list[list[Outcome]]:
    barrier = threading.Barrier(len(plans))
    results: list[list[Outcome]] = [[] for _ in plans]
    failed: list[BaseException] = []

    def write(i: int) -> None:
        try:
            with Ledger.open(target, synchronous="NORMAL", actor=f"{actor}:w{i}") as ledger:
                barrier.wait()
                for method, args, kwargs in plans[i]:
                    try:
                        result = getattr(ledger, method)(*args, **kwargs)
                    except LifecycleError as e:
                        results[i].append(("refused", type(e).__name__, str(e)))
                        continue
                    results[i].append(("done", [] if result.duplicate else [e.seq for e in result.events], None))
        except BaseException as e:  # one writer that cannot start must not leave the others at the barrier
            barrier.abort()
            failed.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    cause = next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), None)
    if cause is not None:
        raise cause
    return results
