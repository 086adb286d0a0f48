"""Drill results and the report: `drill --json`, drill-report.json and drill-report.md.

Reports are deterministic: the same files and seed give the same report, apart from
the `timings` field (wall-clock durations live only there, and in the Markdown's last
section).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import attrs

__all__ = ["DrillResult", "Failure", "StepResult", "build_report", "report_markdown"]

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
