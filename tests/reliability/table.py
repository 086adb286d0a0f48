"""README's reliability table, from the tally the campaign wrote.

    LIFECYCLE_RELIABILITY_JSON=reliability.json pytest -m reliability --reliability-long --no-cov
    python tests/reliability/table.py reliability.json

Prints a Markdown table: campaign, runs, faults injected, events lost, wrong states,
result. Campaigns of one kind (e.g. every structural damage case) are summed into
one row.
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
    ("disk full", "disk full (a 4 MiB tmpfs)"),
)


def table(rows: list[dict[str, Any]]) -> str:
    merged: dict[str, dict[str, Any]] = {}
    for row in rows:
        label = next((text for prefix, text in GROUPS if row["campaign"].startswith(prefix)), row["campaign"])
        into = merged.setdefault(label, {"runs": 0, "faults": 0, "lost": 0, "wrong": 0, "failed": False})
        for key in ("runs", "faults", "lost", "wrong"):
            into[key] += int(row.get(key, 0)) + (int(row.get("torn", 0)) if key == "wrong" else 0)
        into["failed"] |= row.get("result", "pass") != "pass"
    lines = ["| campaign | runs | faults injected | events lost | wrong states | result |", "|---|---|---|---|---|---|"]
    for label, m in merged.items():
        result = "FAIL" if m["failed"] or m["lost"] or m["wrong"] else "pass"
        lines.append(f"| {label} | {m['runs']} | {m['faults']} | {m['lost']} | {m['wrong']} | {result} |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(table(json.loads(Path(sys.argv[1]).read_text())))
