"""Drills: run a scenario's steps as `Ledger` commands against a fresh ledger, inject real faults and judge
what the ledger promised (`lifecycle drill`). Unlike the rest of `replay`, a drill writes a log."""

from __future__ import annotations

from lifecycle_fsm.errors import ScenarioError
from lifecycle_fsm.replay.drills.loader import find_scenarios, load_scenario, load_scenarios
from lifecycle_fsm.replay.drills.report import DrillResult, Failure, StepResult, build_report, report_markdown
from lifecycle_fsm.replay.drills.runner import run_drills, run_scenario
from lifecycle_fsm.replay.drills.schema import Scenario

__all__ = [
    "DrillResult",
    "Failure",
    "Scenario",
    "ScenarioError",
    "StepResult",
    "build_report",
    "find_scenarios",
    "load_scenario",
    "load_scenarios",
    "report_markdown",
    "run_drills",
    "run_scenario",
]
