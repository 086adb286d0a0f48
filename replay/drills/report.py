"""Drill results and the report (`drill --json`, drill-report.json and .md): only `timings` varies between runs."""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import attrs

from lifecycle_fsm.audit_records import publish
from lifecycle_fsm.errors import InputError
from lifecycle_fsm.folders import make_folder
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.replay.explanation_parts import markdown_text


@attrs.frozen
class Failure:
    """An expectation that did not hold: where, what was expected, what was found."""

    step: int
    action: str
    key: str
    expected: Any
    actual: Any

    def message(self) -> str:
        """Values as a scenario file would write them (JSON: true, null, double quotes), not Python reprs."""
        expected, actual = (json.dumps(v, ensure_ascii=False, default=str) for v in (self.expected, self.actual))
        return f"step {self.step} ({self.action}): {self.key}: expected {expected}, actual {actual}"

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
    inconclusive: tuple[str, ...] = ()  # faults this platform could not inject: never a pass

    @property
    def ok(self) -> bool:
        return not self.failures and not self.inconclusive and len(self.steps) == self.steps_total

    @property
    def result(self) -> str:
        return "fail" if self.failures else "inconclusive" if self.inconclusive else "pass"

    def to_json(self) -> JSON:
        """Everything but the duration (the report's `timings`)."""
        return {
            "name": self.name,
            "file": self.file,
            "seed": self.seed,
            "result": self.result,
            "steps": self.steps_total,
            "steps_run": len(self.steps),
            "events": self.events,
            "failures": [f.to_json() for f in self.failures],
            "inconclusive": list(self.inconclusive),
            "kept": self.kept,
            "step_results": [attrs.asdict(s) for s in self.steps],
        }


def build_report(results: Sequence[DrillResult]) -> JSON:
    """The report `drill --json` prints and `--report` writes."""
    total, passed = len(results), sum(1 for r in results if r.ok)
    unsure = sum(1 for r in results if r.result == "inconclusive")
    summary = {"scenarios": total, "passed": passed, "failed": total - passed - unsure, "inconclusive": unsure}
    seconds = {r.name: round(r.seconds, 3) for r in results}
    timings = {"total_seconds": round(sum(r.seconds for r in results), 3), "scenarios": seconds}
    return {"ok": passed == total, "summary": summary, "scenarios": [r.to_json() for r in results], "timings": timings}


def report_markdown(report: JSON) -> str:
    """drill-report.md: the same facts for people; timings in the last section only."""
    s = report["summary"]
    lines = [
        "# Drill report",
        "",
        f"**{'PASS' if report['ok'] else 'FAIL'}**: {s['passed']} of {s['scenarios']} scenarios passed"
        f"{', ' + str(s.get('inconclusive')) + ' inconclusive' if s.get('inconclusive') else ''}.",
        "",
        "| scenario | file | seed | steps | events | result |",
        "|---|---|---|---|---|---|",
    ]
    for r in report["scenarios"]:
        steps = f"{r['steps_run']}/{r['steps']}"
        name, file = markdown_text(r["name"]), markdown_text(r["file"])
        lines.append(f"| {name} | {file} | {r['seed']} | {steps} | {r['events']} | {r['result']} |")
    failures = [(r["name"], f["message"]) for r in report["scenarios"] for f in r["failures"]]
    unsure = [(r["name"], why) for r in report["scenarios"] for why in r["inconclusive"]]
    for title, items in (("Failures", failures), ("Inconclusive", unsure)):
        if items:
            lines += ["", f"## {title}", "", *(f"- {markdown_text(n)}: {markdown_text(t)}" for n, t in items)]
    lines += ["", "## Timings", "", "| scenario | seconds |", "|---|---|"]
    lines += [f"| {markdown_text(name)} | {sec:.3f} |" for name, sec in report["timings"]["scenarios"].items()]
    lines.append(f"| **total** | {report['timings']['total_seconds']:.3f} |")
    return "\n".join(lines) + "\n"


def refuse_report_files(folder: Path, names: Iterable[str], *, replace: bool) -> list[Path]:
    """The report files in `folder` (created if missing) that `replace` may move aside; refused (exit 3)
    without `replace` or when a `.previous` is there. Called before a drill runs anything."""
    make_folder(folder, "report folder")
    existing = [folder / name for name in names if os.path.lexists(folder / name)]  # a dangling link too
    if existing and not replace:
        raise InputError(f"{existing[0]} exists: use --replace to keep it as {existing[0].name}.previous")
    for path in existing:
        previous = path.with_name(path.name + ".previous")
        if os.path.lexists(previous):
            raise InputError(f"{previous} exists: move it away first (one .previous generation is kept)")
    return existing


def write_report_files(folder: Path, files: Mapping[str, str], *, replace: bool) -> list[Path]:
    """Write report files into `folder`, each whole before any is put in place (`replace` keeps the
    old one as `<file>.previous`)."""
    refuse_report_files(folder, files, replace=replace)
    written = [(folder / name, text.encode("utf-8")) for name, text in files.items()]
    publish(written, replace=replace)
    return [path for path, _ in written]
