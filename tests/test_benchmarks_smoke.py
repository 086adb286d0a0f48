"""The benchmark runner still runs: a tiny run of every suite writes every row.

Only that it ran is checked, never a figure: timings belong to `benchmarks/run.py`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from backends import require_postgres

ROOT = Path(__file__).resolve().parents[1]
ROWS = {
    *(f"append.{row}.{sync}" for row in ("one", "es_one", "mix", "table", "es_mix") for sync in ("normal", "full")),
    "replay.fold",
    "replay.verify_parallel",
    "replay.checkpoint",
    *(f"writers.{backend}.{row}" for backend in ("sqlite", "pg") for row in ("4", "8", "lost")),
    *(f"postgres.{row}.{setting}" for row in ("one", "es_one") for setting in ("off", "on")),
    "startup.status",
    "startup.status_cpu",
}


@pytest.mark.slow
@pytest.mark.postgres
def test_every_suite_runs_and_writes_every_row(tmp_path: Path) -> None:
    require_postgres()
    out = tmp_path / "smoke.json"
    done = subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "run.py"), "--smoke", "--json", str(out)],
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    rows = json.loads(out.read_text())["rows"]
    assert {row["id"] for row in rows} == ROWS
    assert all(row["ratio"] is not None or row["figures"] for row in rows)
    assert [row["met"] for row in rows if row["id"].endswith(".lost")] == [True, True]
    assert out.with_suffix(".md").read_text().count("\n") == len(ROWS) + 2
