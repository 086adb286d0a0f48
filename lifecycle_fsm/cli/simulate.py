"""`lifecycle drill --simulate`: seeded schedules against real ledgers, invariants after every step.

Holds no logic: `replay.drills.schedule` expands a seed, `simulate` runs it, `shrink`
makes a failure small and writes it as a scenario. This module prints the seed and the
schedule, shows progress on long runs, writes the report and picks the exit code.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson

from lifecycle_fsm.cli.app import wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import emit
from lifecycle_fsm.json_types import JSON

__all__ = ["simulate_command"]

_REPORT_FILE = "simulation-report.json"


def _shrunk_name(seed: int) -> str:
    """The scenario a failing seed is shrunk to, in --report DIR."""
    return f"simulated-seed-{seed}.yaml"


def _run_json(result: Any, schedule: Any, steps: int, with_schedule: bool) -> JSON:
    from lifecycle_fsm.replay.drills.schedule import describe

    failure = result.failure
    return {
        "seed": result.seed,
        "steps": steps,
        "steps_run": result.steps_run,
        "events": result.events,
        "head": result.head,
        "ok": result.ok,
        "seconds": round(result.seconds, 3),
        "failure": None
        if failure is None
        else {
            "step": failure.step,
            "op": describe(failure.op),
            "problems": [{"key": k, "expected": e, "actual": a} for k, e, a in failure.problems],
        },
        "schedule": [describe(op) for op in schedule.ops] if with_schedule else None,
    }


def simulate_command(
    *,
    seed: int | None,
    steps: int,
    candidates: int,
    runs: int,
    keep_dir: Path | None,
    report_dir: Path | None,
    replace: bool,
) -> None:
    """Run `runs` seeds from `seed`; on the first failure shrink it, write the report, exit 8."""
    from rich.progress import Progress

    from lifecycle_fsm.replay.drills.report import write_report_files
    from lifecycle_fsm.replay.drills.schedule import generate
    from lifecycle_fsm.replay.drills.simulate import simulate

    first = _first_seed(seed, runs, keep_dir, report_dir, replace)
    as_json, started = wants_json(), time.perf_counter()
    docs: list[JSON] = []
    failed = None
    with Progress(transient=True, disable=runs == 1 or as_json or not sys.stderr.isatty()) as progress:
        for n in progress.track(range(first, first + runs), description="simulating"):
            schedule = generate(n, steps, candidates)
            if not as_json and runs == 1:
                _print_schedule(schedule, candidates)
            result = simulate(schedule, keep=keep_dir)
            docs.append(_run_json(result, schedule, steps, with_schedule=as_json and runs == 1))
            if not result.ok:
                failed = (schedule, result)
                break
    doc: JSON = {"ok": failed is None, "seed": first, "runs": docs, "steps_run": sum(d["steps_run"] for d in docs)}
    doc |= {"head": docs[-1]["head"], "seconds": round(time.perf_counter() - started, 3), "shrunk": None}
    files = {} if failed is None else _shrunk(doc, *failed)
    if report_dir is not None:
        files[_REPORT_FILE] = orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"
        write_report_files(report_dir, files, replace=replace)
    if as_json:
        emit(doc)
    else:
        _print(doc, report_dir)
    if failed is not None:
        sys.exit(int(ExitCode.DRILL_FAILED))


def _shrunk(doc: JSON, schedule: Any, result: Any) -> dict[str, str]:
    """Shrink the failing schedule into `doc["shrunk"]`; the scenario file's name and text."""
    from lifecycle_fsm.replay.drills.shrink import scenario_yaml, shrink, to_scenario

    shrunk = shrink(schedule, result)
    scenario = to_scenario(shrunk)
    name = _shrunk_name(schedule.seed)
    doc["shrunk"] = {"file": name, "operations": len(shrunk.schedule.ops), "runs": shrunk.runs}
    doc["shrunk"] |= {"seconds": round(shrunk.seconds, 3), "scenario": scenario}
    return {name: scenario_yaml(scenario)}


def _first_seed(seed: int | None, runs: int, keep_dir: Path | None, report_dir: Path | None, replace: bool) -> int:
    """`--seed`, or a random one; a ledger one of the runs would keep that is already there, and a
    report that would be refused, are refused now (exit 3), before anything runs."""
    from lifecycle_fsm.replay.drills.report import refuse_report_files
    from lifecycle_fsm.replay.drills.simulate import kept_name
    from lifecycle_fsm.replay.drills.workspace import refuse_kept

    first = seed if seed is not None else int.from_bytes(os.urandom(4), "big")
    refuse_kept(keep_dir, (kept_name(n) for n in range(first, first + runs)))
    if report_dir is not None:
        names = [_REPORT_FILE, *(_shrunk_name(n) for n in range(first, first + runs))]
        refuse_report_files(report_dir, names, replace=replace)
    return first


def _print_schedule(schedule: Any, candidates: int) -> None:
    from lifecycle_fsm.replay.drills.schedule import describe

    click.echo(f"seed {schedule.seed}: {len(schedule.ops)} operations over {candidates} candidate artifacts")
    for i, op in enumerate(schedule.ops, 1):
        click.echo(f"  {i:>5}  {describe(op)}")


def _print(doc: JSON, report_dir: Path | None) -> None:
    for run in doc["runs"]:
        if run["failure"] is not None:
            f = run["failure"]
            click.echo(f"seed {run['seed']}: FAILED at step {f['step']} ({f['op']})")
            for p in f["problems"]:
                click.echo(f"  {p['key']}: expected {p['expected']!s}, actual {p['actual']!s}")
    head = doc["head"]
    click.echo(
        f"{len(doc['runs'])} seed(s) from {doc['seed']}, {doc['steps_run']} steps in {doc['seconds']:.1f}s; "
        f"head seq {head['seq']} {head['hash']}"
    )
    if doc["shrunk"] is not None:
        s = doc["shrunk"]
        where = f" written to {report_dir / s['file']}" if report_dir is not None else " (give --report DIR to keep it)"
        click.echo(f"shrunk to {s['operations']} operations in {s['runs']} runs:{where}")
    else:
        click.echo("every invariant held")
