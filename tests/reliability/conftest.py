"""The reliability campaign: its size (bounded for CI, long on request) and its tally.

Every test here is marked `reliability` (run them alone with `-m reliability`). CI runs
a bounded campaign; `--reliability-long` or `LIFECYCLE_RELIABILITY=long` runs the long
one. Each campaign adds a row to the tally, printed at the end of the run and written
as JSON to `LIFECYCLE_RELIABILITY_JSON` when set (`python tests/reliability/table.py`
turns that file into a Markdown table).
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import attrs
import pytest

_TALLY: list[dict[str, Any]] = []


@attrs.frozen
class Campaign:
    """How many runs each campaign makes."""

    long: bool
    crash_runs: int
    crash_commands: int
    writers: int
    writer_commands: int
    byte_flips: int
    hypothesis_examples: int


BOUNDED = Campaign(  # every mode and kind of damage still runs several times; the long campaign runs them at scale
    False, crash_runs=15, crash_commands=24, writers=4, writer_commands=60, byte_flips=24, hypothesis_examples=25
)
LONG = Campaign(
    True, crash_runs=200, crash_commands=40, writers=8, writer_commands=500, byte_flips=150, hypothesis_examples=400
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def campaign(request: pytest.FixtureRequest) -> Campaign:
    long = bool(request.config.getoption("--reliability-long")) or os.environ.get("LIFECYCLE_RELIABILITY") == "long"
    return LONG if long else BOUNDED


@pytest.fixture(scope="session")
def tally() -> list[dict[str, Any]]:
    """Rows of {campaign, runs, faults, lost, wrong, result, …}; each campaign test appends one."""
    return _TALLY


def pytest_terminal_summary(terminalreporter: Any) -> None:
    if not _TALLY:
        return
    terminalreporter.section("reliability tally")
    for row in _TALLY:
        terminalreporter.write_line(json.dumps(row, sort_keys=True))
    out = os.environ.get("LIFECYCLE_RELIABILITY_JSON")
    if out:
        Path(out).write_text(json.dumps(_TALLY, indent=2, sort_keys=True) + "\n")
