"""`explain` as text (for a terminal) or Markdown (for a ticket), both from one list of sections, so neither
can drop what the other (or the JSON) shows. Pure: an explanation in, a string out."""

from __future__ import annotations

from typing import Any

import orjson

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.replay.explanation_parts import (
    ArtifactCheck,
    CheckRow,
    Explanation,
    HashCheck,
    Recovery,
    RollbackCheck,
)
from lifecycle_fsm.rules import RULES

__all__ = ["explain_markdown", "explain_text", "format_value", "markdown_text", "rules_warning"]

Section = tuple[str, list[str]]  # a heading and its lines (Markdown-safe inline text)


def format_value(value: Any) -> str:
    """One value as an auditor reads it: `none` for null, `k=v` pairs for an object."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, dict):
        return ", ".join(f"{k}={format_value(v)}" for k, v in value.items())
    if isinstance(value, list):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    return str(value)


def _claim(value: Any) -> str:
    """A manifest's value as written: a string bare, `none` when missing, anything else as JSON (`true`,
    `7`): a version that is not a string must not read as `yes`."""
    if value is None or isinstance(value, str):
        return format_value(value)
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def rules_warning(candidate_id: str, recorded: JSON) -> str:
    """The line that says a decision was made under rules that are not today's."""
    return (
        f"decided under rules version {format_value(recorded.get('version'))}, not today's "
        f"(version {RULES['version']}): `lifecycle check {candidate_id}` decides it under today's"
    )


def _check_line(check: CheckRow) -> str:
    claim = check.claimed
    if check.check == "branch_evidence" and isinstance(claim, dict):  # the fields the check read, by name
        shown = ", ".join(f"{k}={_claim(v)}" for k, v in claim.items())
    else:
        shown = _claim(claim)
    mark = "ok" if check.passed else "FAILED"
    line = f"{check.check}: {mark}; claimed {shown}; checked against {format_value(check.checked_against)}"
    return line + (f" (error: {check.detail['error']})" if check.detail.get("error") else "")


def _summary(x: Explanation) -> Section:
    c, event = x.candidate, x.decisive_event
    lines = [
        f"{c.candidate_id} ({format_value(c.kind)}) is {c.state} as of seq {x.as_of} "
        f"(revision {c.revision}, stream version {c.version})",
        f"reason codes: {', '.join(c.reason_codes) or 'none'}",
        f"decided by seq {event.seq} {event.type}, recorded {event.recorded_at} by {event.actor} (hash {event.hash})",
        "no check recorded" if x.last_check_seq is None else f"last check at seq {x.last_check_seq}",
    ]
    if isinstance(rules := event.evidence.get("rules"), dict):
        version, digest = format_value(rules.get("version")), format_value(rules.get("digest"))
        lines.append(f"decided under rules version {version} (digest {digest})")
    if x.stale_rules is not None:
        lines.append(rules_warning(c.candidate_id, x.stale_rules))
    if (found := x.inconclusive) is not None:
        why = "; ".join(f"{name}: {error}" for name, error in found["checks"].items())
        lines.append(f"the {found['command']} at seq {found['seq']} was inconclusive (nothing decided): {why}")
    if c.pending:
        lines.append("registered: its adapter was not received yet (it cannot be checked)")
    return "Summary", lines


def _claims(x: Explanation) -> list[Section]:
    c = x.candidate
    claimed = [f"manifest: {c.manifest_path} (sha256 {c.manifest_sha256})"]
    claimed += [f"{k}: {_claim(v)}" for k, v in x.claimed.items()]
    if not x.checks:
        return [("What the candidate claimed", claimed), ("Checks", ["no check recorded yet"])]
    return [
        ("What the candidate claimed", claimed),
        (f"Checks at seq {x.evidence_seq} (claimed vs checked against)", [_check_line(k) for k in x.checks]),
        ("Settings read", [f"{k}: {format_value(v)}" for k, v in sorted((x.settings or {}).items())]),
    ]


def _hash_section(name: str, check: HashCheck) -> Section:
    lines = [
        f"path: {format_value(check.path)}",
        f"expected (recorded): {format_value(check.expected)}",
        f"actual (re-hashed): {format_value(check.actual)}",
    ]
    if check.error:
        lines.append(f"error: {check.error}")
    if isinstance(check, ArtifactCheck):
        what = "at receipt"
        if check.at_receipt is not None:
            lines.append(f"at receipt: {format_value(check.at_receipt)}")
    else:
        what = "when the baseline was activated"
        if isinstance(check, RollbackCheck) and check.activated_seq is not None:
            lines.append(f"baseline activated at seq {check.activated_seq}")
    files = check.files
    if not files.compared:
        lines.append(f"files: not compared ({files.note})")
    elif not (files.added or files.removed or files.changed):
        lines.append(f"files: none differ from those recorded {what}")
    for c in files.changed:
        was, now = c["recorded"], c["checked"]
        sizes = f"size {was['size']} -> {now['size']}"
        lines.append(f"file changed: {c['path']} ({sizes}, sha256 {was['sha256']} -> {now['sha256']})")
    lines += [f"file added: {p}" for p in files.added] + [f"file removed: {p}" for p in files.removed]
    return f"{name} ({'ok' if check.verified else 'FAILED'})", lines


def _recovery_section(r: Recovery) -> Section:
    blocking = ", blocking" if r.blocking else ""
    lines = [f"recovery: {r.stage} -> {r.action} (seq {r.seq}{blocking}; reuses {format_value(r.recovery_state)})"]
    for c in r.considered:
        where = f"source {format_value(c.seen.get('source'))}, path {format_value(c.seen.get('path'))}"
        lines.append(f"considered {c.kind}: {c.outcome} ({c.detail}); {where}")
    if not r.considered:
        lines.append("no trusted state could serve this stage")
    return "Recovery", lines


def _explain_sections(x: Explanation) -> list[Section]:
    """The explanation as ordered sections; the renderers only format them."""
    sections = [_summary(x), *_claims(x)]
    sections += [
        _hash_section(name, c) for name, c in (("Artifact", x.artifact), ("Rollback", x.rollback)) if c is not None
    ]
    if x.recovery is not None:
        sections.append(_recovery_section(x.recovery))
    if (inv := x.invalidation) is not None:
        change = f"{format_value(inv.previous)} -> {format_value(inv.current)}"
        line = f"{inv.cause} changed: {change} (seq {inv.seq}); the candidate must be checked again"
        sections.append(("Evidence invalidated", [line]))
    if card := x.candidate.provenance:
        sections.append(("Provenance", [f"{k}: {format_value(v)}" for k, v in sorted(card.items())]))
    trusted = [
        f"{kind}: {t['path']} (sha256 {t['sha256']}, recorded at seq {t['seq']})"
        for kind, t in sorted(x.candidate.trusted_states.items())
    ]
    moves = " -> ".join(f"{s.to} (seq {s.seq} {s.trigger})" for s in x.path if s.from_state != s.to)
    steps = [
        f"seq {s.seq} {s.type} ({s.trigger}): {s.from_state or 'new'} -> {s.to}, {s.recorded_at} by {s.actor}"
        for s in x.path
    ]
    sections += [("Trusted states recorded now", trusted or ["none"]), ("Path of states", [moves]), ("Events", steps)]
    # Each line is one line: a value holding a newline (a manifest's version, an actor) would print a line of
    # its own that reads as evidence. Control characters are spelled out (`\n`, `\x1b`), as in tables.
    return [(heading, [display(line) for line in lines]) for heading, lines in sections]


def explain_text(x: Explanation) -> str:
    """Plain text: the summary lines, then each section as a heading and indented lines."""
    sections = _explain_sections(x)
    out = list(sections[0][1])
    for heading, lines in sections[1:]:
        out += [f"{heading}:", *(f"  {line}" for line in lines)]
    return "\n".join(out) + "\n"


def markdown_text(text: str) -> str:
    """Inline text from the log safe in Markdown: no table pipes, emphasis, code spans, HTML or entity
    (`dpo&#45;v5` would print as `dpo-v5`), link or image (the reader's browser would fetch it). `_` stays:
    reason codes read as they are, and it makes nothing worse than italics."""
    for ch in "\\`*|<[]!&":
        text = text.replace(ch, "\\" + ch)
    return text


def explain_markdown(x: Explanation, *, level: int = 2) -> str:
    """Markdown for a ticket: a heading per candidate, a bullet per line."""
    hashes = "#" * level
    out = [f"{hashes} {markdown_text(x.candidate.candidate_id)}: {x.candidate.state}", ""]
    for heading, lines in _explain_sections(x):
        out += [f"{hashes}# {heading}", "", *(f"- {markdown_text(line)}" for line in lines), ""]
    return "\n".join(out)
