"""`explain` as text (for a terminal) or Markdown (for a ticket): everything the JSON says.

Both are rendered from one list of sections, so neither can drop what the other
shows: the decisive event, each check's claimed and checked-against values, the
files that differ, every trusted state a recovery considered and why it was passed
over, the settings read and the path of states. Pure: a document in, a string out.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import orjson

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.replay.explanation_parts import (
    ArtifactCheck,
    CheckRow,
    Explanation,
    FileChanges,
    HashCheck,
    Recovery,
    RollbackCheck,
)
from lifecycle_fsm.rules import RULES

__all__ = [
    "explain_markdown",
    "explain_sections",
    "explain_text",
    "format_claim",
    "format_value",
    "markdown_text",
    "path_line",
    "rules_warning",
]

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


def format_claim(value: Any) -> str:
    """A manifest's value as it was written: a string bare, `none` when missing, anything else as
    JSON (`true`, `7`, `{"k":0}`): a version that is not a string must not read as `yes`."""
    if value is None:
        return "none"
    if isinstance(value, str):
        return value
    return orjson.dumps(value, option=orjson.OPT_SORT_KEYS).decode()


def path_line(moves: Iterable[tuple[str, int, str]]) -> str:
    """The states a candidate went through, from its moves `(to, seq, trigger)`: `received (seq 3 receive) -> …`."""
    return " -> ".join(f"{to} (seq {seq} {trigger})" for to, seq, trigger in moves)


def rules_warning(candidate_id: str, recorded: JSON) -> str:
    """The line that says a decision was made under rules that are not today's."""
    return (
        f"decided under rules version {format_value(recorded.get('version'))}, not today's "
        f"(version {RULES['version']}): `lifecycle check {candidate_id}` decides it under today's"
    )


def _files_lines(files: FileChanges, what: str) -> list[str]:
    if not files.compared:
        return [f"files: not compared ({files.note})"]
    if not (files.added or files.removed or files.changed):
        return [f"files: none differ from those recorded {what}"]
    lines = [
        f"file changed: {c['path']} (size {c['recorded']['size']} -> {c['checked']['size']}, "
        f"sha256 {c['recorded']['sha256']} -> {c['checked']['sha256']})"
        for c in files.changed
    ]
    lines += [f"file added: {p}" for p in files.added]
    lines += [f"file removed: {p}" for p in files.removed]
    return lines


def _check_line(check: CheckRow) -> str:
    mark = "ok" if check.passed else "FAILED"
    claim = check.claimed
    if check.check == "branch_evidence" and isinstance(claim, dict):  # the fields the check read, by name
        shown = ", ".join(f"{k}={format_claim(v)}" for k, v in claim.items())
    else:
        shown = format_claim(claim)
    line = f"{check.check}: {mark}; claimed {shown}; checked against {format_value(check.checked_against)}"
    if check.detail.get("error"):
        line += f" (error: {check.detail['error']})"
    return line


def _summary(x: Explanation) -> Section:
    c, event = x.candidate, x.decisive_event
    return "Summary", [
        f"{c.candidate_id} ({format_value(c.kind)}) is {c.state} as of seq {x.as_of} "
        f"(revision {c.revision}, stream version {c.version})",
        f"reason codes: {', '.join(c.reason_codes) or 'none'}",
        f"decided by seq {event.seq} {event.type}, recorded {event.recorded_at} by {event.actor} (hash {event.hash})",
        "no check recorded" if x.last_check_seq is None else f"last check at seq {x.last_check_seq}",
        *([] if not isinstance(rules := event.evidence.get("rules"), dict) else [_rules_line(rules)]),
        *([] if x.stale_rules is None else [rules_warning(c.candidate_id, x.stale_rules)]),
        *([] if x.inconclusive is None else [_inconclusive_line(x.inconclusive)]),
        *(["registered: its adapter was not received yet (it cannot be checked)"] if c.pending else []),
    ]


def _rules_line(rules: JSON) -> str:
    version, digest = format_value(rules.get("version")), format_value(rules.get("digest"))
    return f"decided under rules version {version} (digest {digest})"


def _inconclusive_line(found: JSON) -> str:
    why = "; ".join(f"{name}: {error}" for name, error in found["checks"].items())
    return f"the {found['command']} at seq {found['seq']} was inconclusive (nothing decided): {why}"


def _claims(x: Explanation) -> list[Section]:
    c = x.candidate
    claimed = [f"manifest: {c.manifest_path} (sha256 {c.manifest_sha256})"]
    claimed += [f"{k}: {format_claim(v)}" for k, v in x.claimed.items()]
    sections = [("What the candidate claimed", claimed)]
    if not x.checks:
        return [*sections, ("Checks", ["no check recorded yet"])]
    sections.append(
        (f"Checks at seq {x.evidence_seq} (claimed vs checked against)", [_check_line(k) for k in x.checks])
    )
    sections.append(("Settings read", [f"{k}: {format_value(v)}" for k, v in sorted((x.settings or {}).items())]))
    return sections


def _hash_section(name: str, check: HashCheck) -> Section:
    lines = [f"path: {format_value(check.path)}", f"expected (recorded): {format_value(check.expected)}"]
    lines.append(f"actual (re-hashed): {format_value(check.actual)}")
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
    lines += _files_lines(check.files, what)
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


def _history(x: Explanation) -> list[Section]:
    trusted = [
        f"{kind}: {t['path']} (sha256 {t['sha256']}, recorded at seq {t['seq']})"
        for kind, t in sorted(x.candidate.trusted_states.items())
    ]
    steps = [
        f"seq {s.seq} {s.type} ({s.trigger}): {s.from_state or 'new'} -> {s.to}, {s.recorded_at} by {s.actor}"
        for s in x.path
    ]
    moves = [(step.to, step.seq, step.trigger) for step in x.path if step.from_state != step.to]
    return [
        ("Trusted states recorded now", trusted or ["none"]),
        ("Path of states", [path_line(moves)]),
        ("Events", steps),
    ]


def explain_sections(x: Explanation) -> list[Section]:
    """The explanation as ordered sections; the renderers only format them."""
    sections = [_summary(x), *_claims(x)]
    sections += [
        _hash_section(name, check)
        for name, check in (("Artifact", x.artifact), ("Rollback", x.rollback))
        if check is not None
    ]
    if x.recovery is not None:
        sections.append(_recovery_section(x.recovery))
    if (inv := x.invalidation) is not None:
        change = f"{format_value(inv.previous)} -> {format_value(inv.current)}"
        sections.append(
            (
                "Evidence invalidated",
                [f"{inv.cause} changed: {change} (seq {inv.seq}); the candidate must be checked again"],
            )
        )
    if x.candidate.provenance:
        card = x.candidate.provenance
        sections.append(("Provenance", [f"{k}: {format_value(v)}" for k, v in sorted(card.items())]))
    sections += _history(x)
    # Each line is one line: a value holding a newline (a manifest's version, an actor) would print a line of
    # its own that reads as evidence. Control characters are spelled out (`\n`, `\x1b`), as in tables.
    return [(heading, [display(line) for line in lines]) for heading, lines in sections]


def explain_text(x: Explanation) -> str:
    """Plain text: the summary lines, then each section as a heading and indented lines."""
    sections = explain_sections(x)
    out = list(sections[0][1])
    for heading, lines in sections[1:]:
        out.append(f"{heading}:")
        out += [f"  {line}" for line in lines]
    return "\n".join(out) + "\n"


def markdown_text(text: str) -> str:
    """Inline text from the log (an id, a reason) safe in Markdown: no table pipes, no emphasis, no
    code spans, no HTML or entity (`dpo&#45;v5` would print as `dpo-v5`), and no link or image (an id
    `![x](http://...)` would make the reader's browser fetch it). `_` stays: reason codes read as
    they are, and it makes nothing worse than italics."""
    for ch in "\\`*|<[]!&":
        text = text.replace(ch, "\\" + ch)
    return text


def explain_markdown(x: Explanation, *, level: int = 2) -> str:
    """Markdown for a ticket: a heading per candidate, a bullet per line."""
    sections = explain_sections(x)
    hashes = "#" * level
    out = [f"{hashes} {markdown_text(x.candidate.candidate_id)}: {x.candidate.state}", ""]
    for heading, lines in sections:
        out += [f"{hashes}# {heading}", ""] + [f"- {markdown_text(line)}" for line in lines] + [""]
    return "\n".join(out)
