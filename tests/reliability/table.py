"""The reliability campaign's table, from the tally it wrote.

    LIFECYCLE_RELIABILITY_JSON=reliability.json pytest -m reliability --reliability-long --no-cov
    python tests/reliability/table.py reliability.json

Prints a Markdown table: campaign, backend, filesystem, runs, faults injected, events
lost, wrong states, result. Campaigns of one kind (e.g. every structural damage case)
are summed into one row. A row that names no backend ran on SQLite, in the test's
temporary folder on the local disk.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

GROUPS = (
    ("crash consistency", "crash consistency (SIGKILL at random, or at a commit's fault point)"),
    ("concurrent writers", "concurrent writers (real processes, shared and own candidates)"),
    ("damaged files: byte flips", "damaged files: seeded byte flips and truncations"),
    ("damaged files:", "damaged files: dropped tables, renamed columns"),
    ("hostile input: special files", "hostile input: FIFO, device, symlink loop, folder, sparse 10 GB"),
    ("hostile input:", "hostile input: generated manifests, scenario files, CLI arguments"),
    ("disk full", "disk full"),
    ("filesystem remounted", "filesystem remounted read-only under the ledger"),
    ("postgres: backends terminated during keyed", "backends terminated (pg_terminate_backend) during keyed appends"),
    ("postgres: backends terminated during follow", "backends terminated during a follow, a writer appending"),
    ("postgres: writer processes", "writer processes SIGKILLed"),
)
DEFAULT_FILESYSTEM = "local disk (temporary folder)"


def table(rows: list[dict[str, Any]]) -> str:
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        label = next((text for prefix, text in GROUPS if row["campaign"].startswith(prefix)), row["campaign"])
        where = row.get("backend", "sqlite"), row.get("filesystem", DEFAULT_FILESYSTEM)
        into = merged.setdefault(
            label, {"runs": 0, "faults": 0, "lost": 0, "wrong": 0, "failed": False, "where": where}
        )
        for key in ("runs", "faults", "lost", "wrong"):
            into[key] += int(row.get(key, 0)) + (int(row.get("torn", 0)) if key == "wrong" else 0)
        into["failed"] |= row.get("result", "pass") != "pass"
    lines = [
        "| campaign | backend | filesystem | runs | faults injected | events lost | wrong states | result |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for label, m in merged.items():
        result = "FAIL" if m["failed"] or m["lost"] or m["wrong"] else "pass"
        cells = [label, *m["where"], m["runs"], m["faults"], m["lost"], m["wrong"], result]
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
