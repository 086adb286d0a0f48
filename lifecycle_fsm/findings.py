"""What `verify` found: `problems` by position (none last), each `{code, bad_seq, reason}`, the report's
`ok`, `bad_seq` and `reason` from the first. While a pinned head or a seal fails (`TRUST_CODES`) no repair
is advised: a rebuild would make the damaged log look whole.
"""

from __future__ import annotations

from lifecycle_fsm.json_types import JSON

TRUST_CODES = frozenset({"head_mismatch", "seal_mismatch", "seal_signature"})


def problem(
    code: str, bad_seq: int | None, reason: str, *, advice: str | None = None, message: str | None = None
) -> JSON:
    """One finding; a repair's `advice` is kept apart from the reason so it can be withheld."""
    extra = {"advice": advice, "message": message}
    return {"code": code, "bad_seq": bad_seq, "reason": reason} | {k: v for k, v in extra.items() if v is not None}


def add_problem(report: JSON, found: JSON | None = None) -> JSON:
    """Add `found` (if any) to the problems and settle the report from the first; at one position a broken
    chain goes first, then a pinned head or seal, then what the replay found."""
    problems: list[JSON] = report.setdefault("problems", [])
    if found is not None:
        if found["code"] in TRUST_CODES:
            at = next((i for i, p in enumerate(problems) if p["code"] not in TRUST_CODES | {"chain"}), len(problems))
            problems.insert(at, found)
        else:
            problems.append(found)
        problems.sort(key=lambda p: (p["bad_seq"] is None, p["bad_seq"] or 0))  # stable: the order above at a tie
    if not problems:
        return report
    if any(p["code"] in TRUST_CODES for p in problems):
        for p in problems:
            p.pop("advice", None)
    first = problems[0]
    reason = first["reason"] if "advice" not in first else f"{first['reason']} ({first['advice']})"
    report.update(ok=False, bad_seq=first["bad_seq"], reason=reason)
    report.pop("message", None)
    if "message" in first:
        report["message"] = first["message"]
    return report
