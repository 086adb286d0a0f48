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

from lifecycle_fsm.limits import display

__all__ = ["explain_markdown", "explain_sections", "explain_text", "format_claim", "format_value", "path_line"]

JSON = dict[str, Any]
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


def path_line(path: Iterable[JSON]) -> str:
    """The states a candidate went through: `received (seq 3) -> verified (seq 5) -> …` (moves only)."""
    moves = [f"{step['to']} (seq {step['seq']} {step['trigger']})" for step in path if step["from"] != step["to"]]
    return " -> ".join(moves)


def _files_lines(files: JSON, what: str) -> list[str]:
    if not files["compared"]:
        return [f"files: not compared ({files['note']})"]
    if not (files["added"] or files["removed"] or files["changed"]):
        return [f"files: none differ from those recorded {what}"]
    lines = [f"file changed: {c['path']} (size {c['recorded']['size']} -> {c['checked']['size']}, "
             f"sha256 {c['recorded']['sha256']} -> {c['checked']['sha256']})" for c in files["changed"]]  # fmt: skip
    lines += [f"file added: {p}" for p in files["added"]]
    lines += [f"file removed: {p}" for p in files["removed"]]
    return lines


def _check_line(check: JSON) -> str:
    mark = "ok" if check["passed"] else "FAILED"
    claim = check["claimed"]
    if check["check"] == "branch_evidence" and isinstance(claim, dict):  # the fields the check read, by name
        shown = ", ".join(f"{k}={format_claim(v)}" for k, v in claim.items())
    else:
        shown = format_claim(claim)
    line = f"{check['check']}: {mark}; claimed {shown}; "
    line += f"checked against {format_value(check['checked_against'])}"
    if check.get("error"):
        line += f" (error: {check['error']})"
    return line


def explain_sections(doc: JSON) -> list[Section]:
    """The document as ordered sections; the renderers only format them."""
    event = doc["decisive_event"]
    head = [
        f"{doc['id']} ({format_value(doc['kind'])}) is {doc['state']} as of seq {doc['as_of']} "
        f"(revision {doc['revision']}, stream version {doc['version']})",
        f"reason codes: {', '.join(doc['reason_codes']) or 'none'}",
        f"decided by seq {event['seq']} {event['type']}, recorded {event['recorded_at']} by {event['actor']} "
        f"(hash {event['hash']})",
        "no check recorded" if doc["last_check_seq"] is None else f"last check at seq {doc['last_check_seq']}",
    ]
    sections: list[Section] = [("Summary", head)]
    manifest = doc["manifest"]
    claimed = [f"manifest: {manifest['path']} (sha256 {manifest['sha256']})"]
    claimed += [f"{k}: {format_claim(v)}" for k, v in doc["claimed"].items()]
    sections.append(("What the candidate claimed", claimed))
    if doc["checks"]:
        sections.append((f"Checks at seq {doc['evidence_seq']} (claimed vs checked against)",
                         [_check_line(c) for c in doc["checks"]]))  # fmt: skip
        settings = doc["settings"] or {}
        sections.append(("Settings read", [f"{k}: {format_value(v)}" for k, v in sorted(settings.items())]))
    else:
        sections.append(("Checks", ["no check recorded yet"]))
    for name, what in (("artifact", "at receipt"), ("rollback", "when the baseline was activated")):
        a = doc[name]
        if a is None:
            continue
        lines = [f"path: {a['path']}", f"expected (recorded): {a['expected']}", f"actual (re-hashed): {a['actual']}"]
        if a.get("error"):
            lines.append(f"error: {a['error']}")
        if name == "artifact" and a["at_receipt"] is not None:
            lines.append(f"at receipt: {format_value(a['at_receipt'])}")
        elif name == "rollback" and a.get("activated_seq") is not None:
            lines.append(f"baseline activated at seq {a['activated_seq']}")
        lines += _files_lines(a["files"], what)
        sections.append((f"{name.capitalize()} ({'ok' if a['verified'] else 'FAILED'})", lines))
    recovery = doc["recovery"]
    if recovery is not None:
        lines = [
            f"recovery: {recovery['stage']} -> {recovery['action']} (seq {recovery['seq']}"
            f"{', blocking' if recovery['blocking'] else ''}; reuses {format_value(recovery['recovery_state'])})"
        ]
        for c in recovery["considered"]:
            lines.append(f"considered {c['kind']}: {c['outcome']} ({c['detail']}); source {format_value(c['source'])}, "
                         f"path {format_value(c['path'])}")  # fmt: skip
        if not recovery["considered"]:
            lines.append("no trusted state could serve this stage")
        sections.append(("Recovery", lines))
    if doc["invalidation"] is not None:
        inv = doc["invalidation"]
        sections.append(("Evidence invalidated", [
            f"{inv['cause']} changed: {format_value(inv['previous'])} -> {format_value(inv['current'])} "
            f"(seq {inv['seq']}); the candidate must be checked again"]))  # fmt: skip
    trusted = [f"{kind}: {t['path']} (sha256 {t['sha256']}, recorded at seq {t['seq']})"
               for kind, t in sorted(doc["trusted_states"].items())]  # fmt: skip
    sections.append(("Trusted states recorded now", trusted or ["none"]))
    sections.append(("Path of states", [path_line(doc["path"])]))
    steps = [f"seq {s['seq']} {s['type']} ({s['trigger']}): {s['from'] or 'new'} -> {s['to']}, "
             f"{s['recorded_at']} by {s['actor']}" for s in doc["path"]]  # fmt: skip
    sections.append(("Events", steps))
    # Each line is one line: a value holding a newline (a manifest's version, an actor) would print a line of
    # its own that reads as evidence. Control characters are spelled out (`\n`, `\x1b`), as in tables.
    return [(heading, [display(line) for line in lines]) for heading, lines in sections]


def explain_text(doc: JSON) -> str:
    """Plain text: the summary lines, then each section as a heading and indented lines."""
    sections = explain_sections(doc)
    out = list(sections[0][1])
    for heading, lines in sections[1:]:
        out.append(f"{heading}:")
        out += [f"  {line}" for line in lines]
    return "\n".join(out) + "\n"


def _md(text: str) -> str:
    """Inline text safe in Markdown: no table pipes, no emphasis, no code spans, no HTML.

    `_` stays (intraword underscores, as in reason codes, never make emphasis); `>` and
    brackets are harmless inside a bullet.
    """
    for ch in "\\`*|<":
        text = text.replace(ch, "\\" + ch)
    return text


def explain_markdown(doc: JSON, *, level: int = 2) -> str:
    """Markdown for a ticket: a heading per candidate, a bullet per line."""
    sections = explain_sections(doc)
    hashes = "#" * level
    out = [f"{hashes} {_md(doc['id'])}: {doc['state']}", ""]
    for heading, lines in sections:
        out += [f"{hashes}# {heading}", ""] + [f"- {_md(line)}" for line in lines] + [""]
    return "\n".join(out)
