"""`lifecycle drill`: run failure scenarios, or seeded simulations (`--simulate`), against fresh ledgers
and report; `replay.drills`, imported only when the command runs, does the work."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Any

import click
import orjson
from click.core import ParameterSource

from lifecycle_fsm.cli.app import json_option, root_obj, wants_json
from lifecycle_fsm.cli.exit_codes import ExitCode
from lifecycle_fsm.cli.render import console, emit
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import MAX_INT64

__all__ = ["drill"]

# Where the project's own scenarios are, from a source checkout or an editable install.
_SHIPPED_SCENARIOS = Path(__file__).resolve().parents[2] / "scenarios"
_REPORT_FILES = ("drill-report.json", "drill-report.md")
_SIMULATION_REPORT = "simulation-report.json"
_FOLDER = click.Path(file_okay=False, path_type=Path)


def _json_text(doc: JSON) -> str:
    return orjson.dumps(doc, option=orjson.OPT_INDENT_2).decode() + "\n"


def _print_table(report: JSON) -> None:
    from rich.table import Table  # at print time: rich costs ~30 ms of start-up

    table = Table("scenario", "steps", "result", "time")
    for r in report["scenarios"]:
        result = {"pass": "[green]pass[/green]", "inconclusive": "[yellow]inconclusive[/yellow]"}.get(
            r["result"], "[bold red]FAIL[/bold red]"
        )
        seconds = report["timings"]["scenarios"].get(r["name"], 0.0)
        table.add_row(r["name"], f"{r['steps_run']}/{r['steps']}", result, f"{seconds:.2f}s")
    out = console()
    out.print(table)
    for r in report["scenarios"]:
        for f in r["failures"]:
            out.print(f"[red]{r['name']}[/red] {f['message']}", markup=True, highlight=False)
    s = report["summary"]
    out.print(f"{s['passed']} of {s['scenarios']} scenarios passed", highlight=False)


def _default_scenarios() -> Path:
    """./scenarios when there is one, else the project's own (a source or editable install)."""
    here = Path("scenarios")
    return here if here.is_dir() or not _SHIPPED_SCENARIOS.is_dir() else _SHIPPED_SCENARIOS


def _refuse_misplaced(paths: tuple[Path, ...], simulate: bool) -> None:
    """Scenario paths with --simulate, or a simulation's option without it: a usage error (exit 2)."""
    if simulate and paths:
        raise click.UsageError("--simulate takes no scenario paths")
    for name in () if simulate else ("steps", "candidates", "runs"):
        if click.get_current_context().get_parameter_source(name) is not ParameterSource.DEFAULT:
            raise click.UsageError(f"--{name} applies only with --simulate")


@click.command(context_settings={"show_default": True})
@click.argument("paths", nargs=-1, type=click.Path(path_type=Path))
@click.option("--report", "report_dir", type=_FOLDER, help="Write drill-report.json and drill-report.md into DIR.")
@click.option(
    "--keep",
    "keep_dir",
    type=_FOLDER,
    help="Keep each scenario's ledger as DIR/<scenario-name>.db, 0600 (inspect it with status, history, "
    "explain); an existing one is refused.",
)
@click.option(
    "--seed",
    type=click.IntRange(0, MAX_INT64),
    help="Override every scenario's seed (with --simulate: the first seed).",
)
@click.option("--replace", is_flag=True, help="Keep an existing report as <file>.previous instead of refusing.")
@click.option("--simulate", is_flag=True, help="Run seeded random schedules with invariants checked after every step.")
@click.option("--steps", type=click.IntRange(1, 1_000_000), default=200, help="With --simulate: operations per seed.")
@click.option(
    "--candidates", type=click.IntRange(1, 50), default=6, help="With --simulate: candidate artifacts per seed."
)
@click.option(
    "--runs", type=click.IntRange(1, 100_000), default=1, help="With --simulate: how many seeds, from --seed on."
)
@json_option
def drill(
    paths: tuple[Path, ...],
    report_dir: Path | None,
    keep_dir: Path | None,
    seed: int | None,
    replace: bool,
    simulate: bool,
    steps: int,
    candidates: int,
    runs: int,
) -> None:
    """Run failure scenarios (YAML) against fresh ledgers, with faults injected.

    PATHS are scenario files or folders (their *.yaml, not subfolders); default: ./scenarios,
    else the scenarios shipped with the project.
    Every scenario is validated before any runs. Exit 0 when every expectation held,
    8 when one did not or a fault could not be injected (inconclusive), 3 when a scenario
    file is malformed, the report exists (unless --replace) or a ledger to --keep exists.

    With --simulate: seeded schedules of commands and faults against real ledgers, checked
    against a reference model after every step; a failure exits 8 and is shrunk to a scenario
    written to --report DIR. --simulate takes no PATHS, and --steps, --candidates and --runs
    are refused without it (exit 2).
    """
    from lifecycle_fsm.replay.drills import build_report, load_scenarios, report_markdown, run_drills
    from lifecycle_fsm.replay.drills.report import refuse_report_files, write_report_files
    from lifecycle_fsm.replay.drills.workspace import refuse_kept

    if root_obj().get("log_level", "warning") == "warning":
        # Faults are injected on purpose: the report says what each one caused, so the
        # warnings they trigger (checkpoint_skipped, ...) would only be noise here.
        from lifecycle_fsm.logs import configure_logging

        configure_logging("error")
    _refuse_misplaced(paths, simulate)
    if simulate:
        _simulate(seed, steps, candidates, runs, keep_dir, report_dir, replace)
        return
    scenarios = load_scenarios(list(paths) or [_default_scenarios()])
    refuse_kept(keep_dir, (s.name for s in scenarios))  # before any runs: a kept ledger is never overwritten
    if report_dir is not None:  # and a report that would be refused is refused now, not after every run
        refuse_report_files(report_dir, _REPORT_FILES, replace=replace)
    report = build_report(run_drills(scenarios, seed=seed, keep_dir=keep_dir))
    if report_dir is not None:
        files = dict(zip(_REPORT_FILES, (_json_text(report), report_markdown(report)), strict=True))
        write_report_files(report_dir, files, replace=replace)
    if wants_json():
        emit(report)
    else:
        _print_table(report)
    if not report["ok"]:
        sys.exit(int(ExitCode.DRILL_FAILED))


def _simulate(
    seed: int | None,
    steps: int,
    candidates: int,
    runs: int,
    keep_dir: Path | None,
    report_dir: Path | None,
    replace: bool,
) -> None:
    """Run `runs` seeds from `seed`; on the first failure shrink it, write the report, exit 8. A ledger a
    run would keep that is already there, and a report that would be refused, are refused first (exit 3)."""
    from rich.progress import Progress

    from lifecycle_fsm.replay.drills.report import refuse_report_files, write_report_files
    from lifecycle_fsm.replay.drills.schedule import describe, generate
    from lifecycle_fsm.replay.drills.simulate import kept_name, simulate
    from lifecycle_fsm.replay.drills.workspace import refuse_kept

    first = seed if seed is not None else int.from_bytes(os.urandom(4), "big")
    seeds = range(first, first + runs)
    refuse_kept(keep_dir, map(kept_name, seeds))
    if report_dir is not None:
        names = [_SIMULATION_REPORT, *(f"{kept_name(n)}.yaml" for n in seeds)]
        refuse_report_files(report_dir, names, replace=replace)
    as_json, started = wants_json(), time.perf_counter()
    docs: list[JSON] = []
    failed = None
    with Progress(transient=True, disable=runs == 1 or as_json or not sys.stderr.isatty()) as progress:
        for n in progress.track(seeds, description="simulating"):
            schedule = generate(n, steps, candidates)
            if not as_json and runs == 1:
                click.echo(f"seed {n}: {len(schedule.ops)} operations over {candidates} candidate artifacts")
                for i, op in enumerate(schedule.ops, 1):
                    click.echo(f"  {i:>5}  {describe(op)}")
            result = simulate(schedule, keep=keep_dir)
            docs.append(result.to_json(steps, schedule if as_json and runs == 1 else None))
            if not result.ok:
                failed = (schedule, result)
                break
    doc: JSON = {"ok": failed is None, "seed": first, "runs": docs, "steps_run": sum(d["steps_run"] for d in docs)}
    doc |= {"head": docs[-1]["head"], "seconds": round(time.perf_counter() - started, 3), "shrunk": None}
    files = {} if failed is None else _shrunk(doc, *failed)
    if report_dir is not None:
        write_report_files(report_dir, files | {_SIMULATION_REPORT: _json_text(doc)}, replace=replace)
    if as_json:
        emit(doc)
    else:
        _print_simulation(doc, report_dir)
    if failed is not None:
        sys.exit(int(ExitCode.DRILL_FAILED))


def _shrunk(doc: JSON, schedule: Any, result: Any) -> dict[str, str]:
    """Shrink the failing schedule into `doc["shrunk"]`; the scenario file's name and text."""
    from lifecycle_fsm.replay.drills.simulate import scenario_yaml, shrink, to_scenario

    shrunk = shrink(schedule, result)
    scenario = to_scenario(shrunk)
    name = f"{scenario['name']}.yaml"
    doc["shrunk"] = {"file": name, "operations": len(shrunk.schedule.ops), "runs": shrunk.runs}
    doc["shrunk"] |= {"seconds": round(shrunk.seconds, 3), "scenario": scenario}
    return {name: scenario_yaml(scenario)}


def _print_simulation(doc: JSON, report_dir: Path | None) -> None:
    for run in doc["runs"]:
        if (f := run["failure"]) is not None:
            click.echo(f"seed {run['seed']}: FAILED at step {f['step']} ({f['op']})")
            for p in f["problems"]:
                click.echo(f"  {p['key']}: expected {p['expected']!s}, actual {p['actual']!s}")
    head = doc["head"]
    click.echo(
        f"{len(doc['runs'])} seed(s) from {doc['seed']}, {doc['steps_run']} steps in {doc['seconds']:.1f}s; "
        f"head seq {head['seq']} {head['hash']}"
    )
    if (s := doc["shrunk"]) is None:
        click.echo("every invariant held")
        return
    where = f" written to {report_dir / s['file']}" if report_dir is not None else " (give --report DIR to keep it)"
    click.echo(f"shrunk to {s['operations']} operations in {s['runs']} runs:{where}")
