"""Ledger commands as drills run them: in the drill's own `Ledger`, in a child process killed at a commit
point (`crash`, `crash_during_append`), or in several writers at once (`concurrently`)."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import attrs
import orjson

import lifecycle_fsm
from lifecycle_fsm.errors import LifecycleError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.ledger import Ledger
from lifecycle_fsm.replay.drills.faults import FaultOutcome, Problem, integrity
from lifecycle_fsm.replay.drills.schema import Refusal, Step
from lifecycle_fsm.replay.drills.steps import Action, Concurrently, Crash
from lifecycle_fsm.replay.drills.workspace import Workspace
from lifecycle_fsm.store.base import EventStore, event_at
from lifecycle_fsm.store.threads import ENV_VAR

Call = tuple[str, list[Any], JSON]  # a Ledger method, its positional and keyword arguments


class Inconclusive(Exception):
    """The fault cannot be injected here (no SIGKILL, not a SQLite file): the drill proves nothing."""


@attrs.frozen
class Outcome:
    """One command's outcome: the seqs it appended, or the error's class names (most derived first)."""

    seqs: list[int] = attrs.Factory(list)
    classes: list[str] = attrs.Factory(list)
    message: str = ""
    result: Any = attrs.field(default=None, eq=False)

    @property
    def refused(self) -> bool:
        return bool(self.classes)

    def shown(self, ws: Workspace) -> str:
        return (
            ws.shown(f"{self.classes[0]}: {self.message}") if self.refused else f"success (appended {len(self.seqs)})"
        )

    def judge(self, refusal: Refusal | None, ws: Workspace) -> str | None:
        """Why this outcome is not what `refusal` (None: success) asks for, or None when it is."""
        if refusal is None:
            return self.shown(ws) if self.refused else None
        return None if self.refused and refusal.accepts(self.classes, ws.shown(self.message)) else self.shown(ws)

    def line(self) -> str:
        """How a child writer reports it: one JSON line."""
        return orjson.dumps(attrs.asdict(self, filter=lambda a, _: a.name != "result")).decode()


def call(ledger: Ledger, command: Call) -> Outcome:
    """Run one command; a ledger refusal is an outcome, anything else propagates."""
    method, args, kwargs = command
    try:
        result = getattr(ledger, method)(*args, **kwargs)
    except LifecycleError as e:
        return Outcome(classes=[c.__name__ for c in type(e).__mro__[:-2]], message=str(e))
    return Outcome(seqs=[] if result.duplicate else [e.seq for e in result.events], result=result)


def command_call(ws: Workspace, spec: Action) -> Call:
    """`Ledger.<step name>` with the step's fields in order, an artifact as its manifest or folder."""
    values = attrs.asdict(spec, recurse=False)
    kwargs = {"candidate_id": values.pop("id")} if "id" in values else {}
    if spec.name == "register":
        kwargs = {"kind": values.pop("kind")}
    if "artifact" in values:  # a folder for any artifact, else the adapter's manifest
        folder = attrs.fields_dict(type(spec))["artifact"].metadata["refers"] == "any"
        values["artifact"] = str((ws.folders if folder else ws.manifests)[values["artifact"]])
    return spec.name, list(values.values()), kwargs


def _child(target: str, calls: Sequence[Call], plan: JSON, fault: str | None) -> subprocess.Popen[str]:
    """A writer process (`child.py`), our packages importable even from a source checkout."""
    env = {k: v for k, v in os.environ.items() if k != ENV_VAR} | ({ENV_VAR: fault} if fault is not None else {})
    project = str(Path(lifecycle_fsm.__file__).resolve().parent.parent)
    env["PYTHONPATH"] = os.pathsep.join([project, *filter(None, [os.environ.get("PYTHONPATH")])])
    plan_json = orjson.dumps(plan | {"calls": calls})
    argv: list[str | bytes] = [sys.executable, "-m", "lifecycle_fsm.replay.drills.child", target, plan_json]
    return subprocess.Popen(argv, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _killed(target: str, calls: Sequence[Call], plan: JSON, fault: str) -> tuple[int, str, list[Outcome], int]:
    """Run `calls` in a child that SIGKILLs itself at `fault`: its return code, last stderr line,
    outcomes and the call it died in (0: between calls)."""
    if os.name != "posix":
        raise Inconclusive("SIGKILL at a commit point needs a POSIX platform")
    proc = _child(target, calls, {"go": None} | plan, fault)
    out, err = proc.communicate(timeout=120)
    outcomes = _outcomes(out)
    begun = [int(line.split()[1]) for line in out.splitlines() if line.startswith("begin ")]
    in_flight = begun[-1] if len(begun) > len(outcomes) else 0
    return proc.returncode, (err.strip().splitlines() or ["no output"])[-1], outcomes, in_flight


def _outcomes(out: str) -> list[Outcome]:
    return [Outcome(**orjson.loads(line)) for line in out.splitlines() if line.startswith("{")]


def crash(store: EventStore, ws: Workspace, target: str, step: Step, plan: JSON) -> FaultOutcome:
    """Run `step.inner[0]` in a child that SIGKILLs itself at the planned commit point."""
    assert isinstance(step.spec, Crash)
    at, commit = step.spec.at, step.spec.commit
    fault = f"kill@{at}#{commit}"
    before = store.count_events()
    code, tail, outcomes, _ = _killed(target, [command_call(ws, step.inner[0].spec)], plan, fault)
    after = store.count_events()
    detail = {"command": step.inner[0].word, "fault": fault, "returncode": code, "events_appended": after - before}
    problems: list[Problem] = []
    if code != -signal.SIGKILL:
        finished = "refused" if outcomes and outcomes[0].refused else "done"
        why = f"exit {code} after {finished} (the command made fewer than {commit} commits)"
        problems.append(("killed", f"SIGKILL at {at} on commit {commit}", ws.shown(why if outcomes else tail)))
    elif at == "before_commit" and after != before:
        problems.append(("events", f"{before} (the killed transaction leaves nothing)", after))
    elif at == "after_commit" and after <= before:
        problems.append(("events", f"more than {before} (the commit happened before the kill)", after))
    return FaultOutcome(detail, (*problems, *integrity(store)))


def crash_during_append(
    store: EventStore, target: str, candidate: str, stage: str, commands: int, *, rng: random.Random, actor: str
) -> FaultOutcome:
    """A writer process SIGKILLed before COMMIT in its K-th `fail_stage` (K from the seed)."""
    planned = rng.randint(1, commands)
    fault = f"kill@before_commit#{planned}"  # the store counts command commits only, not opening
    before = store.count_events()
    calls: list[Call] = [("fail_stage", [candidate, stage], {})] * commands
    code, tail, outcomes, in_flight = _killed(target, calls, {"actor": actor}, fault)
    acknowledged = [seq for o in outcomes for seq in o.seqs]
    after = store.count_events()
    detail = {"commands": commands, "killed_in_command": planned, "fault": fault, "returncode": code}
    detail |= {"acknowledged_events": len(acknowledged), "events_before": before, "events_after": after}
    problems: list[Problem] = []
    if code != -signal.SIGKILL:
        refused = next((o for o in outcomes if o.refused), None)  # why no command got to its commit
        why = f"{refused.classes[0]}: {refused.message}" if refused is not None else tail
        problems.append(("returncode", -signal.SIGKILL, f"{code} ({why})"))
    if in_flight != planned:
        problems.append(("killed_in_command", planned, in_flight or None))
    present = sum(1 for seq in acknowledged if event_at(store, seq) is not None)
    if present != len(acknowledged):
        problems.append(("acknowledged_events_kept", len(acknowledged), present))
    if after != before + len(acknowledged):
        problems.append(("events", before + len(acknowledged), after))
    stream = store.read_stream(f"candidate:{candidate}")
    if stream and stream[-1].type == "StageFailed":
        problems.append(("torn_event", "none", f"seq {stream[-1].seq} StageFailed without its RecoveryPlanned"))
    return FaultOutcome(detail, (*problems, *integrity(store)))


def concurrently(store: EventStore, ws: Workspace, target: str, step: Step, actor: str) -> FaultOutcome:
    """Start every writer together (processes wait on a go-file, threads on a barrier) and judge them."""
    assert isinstance(step.spec, Concurrently)
    repeat, mode = step.spec.repeat, step.spec.mode
    plans = [[command_call(ws, w.spec)] * repeat for w in step.inner]
    before = store.count_events()
    if mode == "processes":
        results = _processes(target, plans, actor, ws.root / f"go-{step.number}")
    else:
        results = _threads(target, plans, actor)
    after = store.count_events()
    problems = _judge(step, results, ws)
    appended = sum(len(o.seqs) for outcomes in results for o in outcomes)
    if after - before != appended:
        problems.append(("events", f"{before} + {appended} acknowledged", after))
    summary = [sorted({f"refused:{o.classes[0]}" if o.refused else "done" for o in outcomes}) for outcomes in results]
    detail: JSON = {"mode": mode, "writers": len(plans), "repeat": repeat, "events_appended": after - before}
    detail["outcomes"] = summary if step.refused is None else sorted(summary)  # which writer wins is a race
    return FaultOutcome(detail, (*problems, *integrity(store)))


def _judge(step: Step, results: list[list[Outcome]], ws: Workspace) -> list[Problem]:
    """Each writer ran its commands, each as its `refused:` says (or as the step's count says)."""
    assert isinstance(step.spec, Concurrently)
    problems: list[Problem] = []
    for i, (writer, outcomes) in enumerate(zip(step.inner, results, strict=True)):
        if len(outcomes) != step.spec.repeat:
            problems.append((f"writers[{i}]", f"{step.spec.repeat} commands run", f"{len(outcomes)} run"))
        expected = writer.refused.describe() if writer.refused else "success"
        whys = [] if step.refused else [why for o in outcomes if (why := o.judge(writer.refused, ws))]
        problems.extend((f"writers[{i}]", expected, why) for why in whys)
    if step.refused is not None:
        problems.extend(_count_refused(step.refused, [o for outcomes in results for o in outcomes], ws))
    return problems


def _count_refused(refusal: Refusal, outcomes: list[Outcome], ws: Workspace) -> list[Problem]:
    """Exactly `refusal.count` of the commands are refused as it says; every other one succeeds."""
    matching = [o for o in outcomes if o.judge(refusal, ws) is None]
    others = sorted({o.shown(ws) for o in outcomes if o.refused and o not in matching})
    if len(matching) == refusal.count and not others:
        return []
    wanted = f"exactly {refusal.count} of the {len(outcomes)} commands {refusal.describe()}, the others succeeding"
    return [("refused", wanted, "; ".join([f"{len(matching)} {refusal.describe()}", *others]))]


def _processes(target: str, plans: list[list[Call]], actor: str, go: Path) -> list[list[Outcome]]:
    procs = [_child(target, calls, {"actor": f"{actor}:w{i}", "go": str(go)}, None) for i, calls in enumerate(plans)]
    try:
        for p in procs:  # every writer has opened its ledger before any starts
            assert p.stdout is not None
            p.stdout.readline()
        go.touch()
        outputs = [p.communicate(timeout=120)[0] for p in procs]
    except BaseException:  # a writer that hangs (or Ctrl-C): none of the others is left running
        for p in procs:
            p.kill()
            p.wait()
        raise
    return [_outcomes(out) for out in outputs]


def _threads(target: str, plans: list[list[Call]], actor: str) -> list[list[Outcome]]:
    barrier = threading.Barrier(len(plans))
    results: list[list[Outcome]] = [[] for _ in plans]
    failed: list[BaseException] = []

    def write(i: int) -> None:
        try:
            with Ledger.open(target, synchronous="NORMAL", actor=f"{actor}:w{i}") as ledger:
                barrier.wait()
                results[i] = [call(ledger, c) for c in plans[i]]
        except BaseException as e:  # one writer that cannot start must not leave the others at the barrier
            barrier.abort()
            failed.append(e)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(len(plans))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if cause := next((e for e in failed if not isinstance(e, threading.BrokenBarrierError)), None):
        raise cause
    return results
