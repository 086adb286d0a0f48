"""Two `run.py` result files side by side, as the Markdown table the README shows.

    python benchmarks/compare.py BEFORE.json AFTER.json [--only SECTION ...] [--targets-only]

Rows are matched by section and measure name; a row only one file has is shown with a
dash on the other side. The ratio columns are each run's own same-run ratio (ours
against its baseline in that run), so two runs taken minutes apart compare fairly even
when the machine's speed drifted between them; the absolute figures do not.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any


def _rows(path: Path) -> dict[tuple[str, str], dict[str, Any]]:
    data = json.loads(path.read_text())
    return {(r["section"], r["name"]): r for r in data["results"]}


def _ratio(row: dict[str, Any] | None) -> str:
    if row is None or row.get("ratio") is None:
        return "-"
    return f"{row['ratio']:.2f}"


def _met(row: dict[str, Any] | None) -> str:
    if row is None or row.get("met") is None:
        return "-"
    return "yes" if row["met"] else "**no**"


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def table(before: Path, after: Path, *, only: list[str] | None = None, targets_only: bool = False) -> str:
    """The Markdown table: measure, target, before ratio, after ratio, after figures, met."""
    old, new = _rows(before), _rows(after)
    keys = list(new) + [k for k in old if k not in new]
    lines = [
        "| section | measure | target | before (ratio) | after (ratio) | after, measured | met |",
        "|---|---|---|---|---|---|---|",
    ]
    for key in keys:
        b, a = old.get(key), new.get(key)
        shown = a or b
        assert shown is not None
        if only and key[0] not in only:
            continue
        if targets_only and shown.get("met") is None:
            continue
        lines.append(
            f"| {key[0]} | {_cell(key[1])} | {_cell(shown['target'])} | {_ratio(b)} | {_ratio(a)} | "
            f"{_cell(a['measured']) if a else '-'} | {_met(a)} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("before", type=Path)
    p.add_argument("after", type=Path)
    p.add_argument("--only", nargs="+", help="only these sections")
    p.add_argument("--targets-only", action="store_true", help="only rows with a target")
    args = p.parse_args(argv)
    print(table(args.before, args.after, only=args.only, targets_only=args.targets_only))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
