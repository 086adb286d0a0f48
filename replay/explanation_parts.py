"""The parts of an explanation (`replay.explain`), typed: `to_json` gives the `explain --json` shapes; text (a
terminal) and Markdown (a ticket) render one list of sections, so neither drops what the other (or the JSON)
shows. Values read from the log (evidence payloads, settings, what a manifest claimed) stay JSON, as recorded.
"""

from __future__ import annotations

from typing import Any

import attrs
import orjson

from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.rules import RULES
from lifecycle_fsm.state import CandidateState


@attrs.frozen
class PathStep:
    """One event of the candidate and the state it moved the candidate from (None: new) and to."""

    seq: int
    type: str
    trigger: str
    from_state: str | None
    to: str
    recorded_at: str
    actor: str

    def to_json(self) -> JSON:
        return {("from" if k == "from_state" else k): v for k, v in attrs.asdict(self).items()}


@attrs.frozen
class DecisiveEvent:
    """The event that moved the candidate into its state, with its whole payload as evidence."""

    seq: int
    type: str
    version: int
    recorded_at: str
    actor: str
    hash: str
    evidence: JSON

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen
class CheckRow:
    """One check: passed or not, what the candidate claimed, what it was checked against, and what only
    some checks have (`detail`, shown inline: a hash check's `error`, the upstream check's `reason_codes`)."""

    check: str
    passed: bool
    claimed: Any
    checked_against: Any
    detail: JSON = attrs.Factory(dict)

    def to_json(self) -> JSON:
        found = attrs.asdict(self, recurse=False)
        detail: JSON = found.pop("detail")
        return found | detail


@attrs.frozen
class FileChanges:
    """The files of a folder added, removed or changed since they were recorded; `note` says why not compared."""

    compared: bool
    note: str | None
    added: list[str]
    removed: list[str]
    changed: list[JSON]  # {path, recorded: {size, sha256}, checked: {size, sha256}}

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen(kw_only=True)
class HashCheck:
    """An adapter re-hashed for a check: the recorded and the actual sha256, and the files that differ."""

    path: Any
    expected: Any
    actual: Any
    verified: Any
    error: Any
    files: FileChanges

    def to_json(self) -> JSON:
        found = attrs.asdict(self, recurse=False)
        files = found.pop("files")  # shown last, after a subclass's fields
        return found | {"files": files.to_json()}


@attrs.frozen(kw_only=True)
class ArtifactCheck(HashCheck):
    """The candidate's adapter, beside how it was at receipt."""

    at_receipt: JSON | None


@attrs.frozen(kw_only=True)
class RollbackCheck(HashCheck):
    """The baseline's adapter, beside how it was when the baseline was activated (at `activated_seq`)."""

    activated_seq: int | None


@attrs.frozen
class Considered:
    """A trusted state a recovery looked at: as the plan saw it (`seen`), and why it was used or passed over."""

    kind: str
    seen: JSON
    outcome: str
    detail: str

    def to_json(self) -> JSON:
        return {"kind": self.kind, **self.seen, "outcome": self.outcome, "detail": self.detail}


@attrs.frozen(kw_only=True)
class Recovery:
    """The latest recovery plan and each trusted state it considered, nearest first."""

    seq: int
    stage: str
    action: str
    recovery_state: str | None
    reused_state: bool
    blocking: bool
    considered: list[Considered]

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False) | {"considered": [c.to_json() for c in self.considered]}


@attrs.frozen
class Invalidation:
    """The setting change that sent a decided candidate back to `received`."""

    seq: int
    cause: str
    previous: Any
    current: Any

    def to_json(self) -> JSON:
        return attrs.asdict(self, recurse=False)


@attrs.frozen(kw_only=True)
class Explanation:
    """Why `candidate` is in its state as of seq `as_of`: the decisive event and the evidence behind it."""

    candidate: CandidateState
    as_of: int
    decisive_event: DecisiveEvent
    claimed: JSON
    evidence_seq: int | None
    settings: JSON | None
    checks: list[CheckRow]
    artifact: ArtifactCheck | None
    rollback: RollbackCheck | None
    recovery: Recovery | None
    invalidation: Invalidation | None
    path: list[PathStep]
    stale_rules: JSON | None = None  # the rules the decision was made under, when they are not today's
    inconclusive: JSON | None = None  # the latest check that could not read an artifact, since the decision

    @property
    def last_check_seq(self) -> int | None:
        last = self.candidate.last_check
        return None if last is None else int(last["seq"])

    def to_json(self) -> JSON:
        c = self.candidate
        parts = (self.artifact, self.rollback, self.recovery, self.invalidation)
        artifact, rollback, recovery, invalidation = (None if p is None else p.to_json() for p in parts)
        return {
            "id": c.candidate_id,
            "kind": c.kind,
            "state": str(c.state),
            "version": c.version,
            "revision": c.revision,
            "as_of": self.as_of,
            "reason_codes": list(c.reason_codes),
            "decisive_event": self.decisive_event.to_json(),
            "claimed": self.claimed,
            "manifest": {"path": c.manifest_path, "sha256": c.manifest_sha256},
            "evidence_seq": self.evidence_seq,
            "settings": self.settings,
            "checks": [check.to_json() for check in self.checks],
            "artifact": artifact,
            "rollback": rollback,
            "recovery": recovery,
            "invalidation": invalidation,
            "path": [step.to_json() for step in self.path],
            "last_check_seq": self.last_check_seq,
            "trusted_states": c.trusted_states,
            "stale_rules": self.stale_rules,
            "inconclusive": self.inconclusive,
            "provenance": c.provenance,
            "pending": c.pending,
            "history": [{k: getattr(s, k) for k in ("seq", "type", "recorded_at", "actor")} for s in self.path],
        }


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
    sections += [_hash_section(n, c) for n, c in (("Artifact", x.artifact), ("Rollback", x.rollback)) if c is not None]
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
