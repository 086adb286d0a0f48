"""Drills: drive commands against a fresh ledger, inject real faults, and judge the outcomes.

Drills are not replay. The rest of `replay` rebuilds state from a log that already
exists; a drill *writes* one: it builds a scenario's artifacts, runs its steps as
`Ledger` commands, damages real files on purpose and checks what the ledger promised
(`lifecycle drill`, `scenarios/README.md`). It uses replay only to verify.

    schema.py, steps.py  the scenario format: attrs classes for the sections and the steps
    convert.py    the strict cattrs converter; its errors become one-line `ScenarioError`s
    loader.py     reading scenario files and checking references between their sections
    workspace.py  the temporary folder: artifacts and manifests
    faults.py     garbled checkpoints, edited events, tampered or deleted artifacts
    writers.py    commands in the drill's ledger, in killed child processes, in concurrent writers
    runner.py     running the steps against the ledger
    report.py     results, drill-report.json and drill-report.md
    model.py, schedule.py, simulate.py, shrink.py  `drill --simulate`
"""

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
