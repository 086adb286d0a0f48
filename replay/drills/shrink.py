"""A failing schedule made small (delta debugging), written as a scenario that `lifecycle drill FILE` runs:
judged by the model, so it passes on a correct ledger and fails on the broken one."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import attrs
import yaml

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.drills.schedule import Op, Schedule, describe, split
from lifecycle_fsm.replay.drills.simulate import SimResult, kept_name, simulate

__all__ = ["Shrunk", "scenario_yaml", "shrink", "to_scenario", "write_scenario"]


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
            plan = {k: c["plan"][k] for k in ("action", "recovery_state", "reused_state")}
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


def write_scenario(shrunk: Shrunk, folder: Path) -> Path:
    path = folder / f"{kept_name(shrunk.schedule.seed)}.yaml"
    path.write_text(scenario_yaml(to_scenario(shrunk)))
    return path
