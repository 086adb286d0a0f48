"""The ledger report: one document an auditor can hand over (`lifecycle report`).

It says what the log proves and what it decided: the head (seq and hash), the
`verify` result and seals, the candidates by state, each rejection with its decisive
evidence (`explain`), the recoveries by stage and action, the machine and each
candidate's path as Mermaid diagrams. It holds no clock reading and no host name, so
the same ledger (and the same as-of position) gives the same bytes. When `verify`
fails, the report says so first and shows no state folded from the log it could not
trust (a broken checkpoint alone does not count: the states come from a full replay).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import attrs

from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.machine import State
from lifecycle_fsm.replay.asof import AsOf, position_of
from lifecycle_fsm.replay.diagrams import machine_flowchart, path_flowchart
from lifecycle_fsm.replay.explain import baseline_activations, explanation
from lifecycle_fsm.replay.explain_text import explain_markdown, format_value, markdown_text
from lifecycle_fsm.replay.explanation_parts import Explanation
from lifecycle_fsm.replay.report_html import markdown_to_html
from lifecycle_fsm.replay.verify import verify_with_state
from lifecycle_fsm.store.base import EventStore, select_events
from lifecycle_fsm.store.records import EventFilter
from lifecycle_fsm.upcasting import decoded_payload

__all__ = ["LedgerReport", "RecoveryGroup", "VerifySummary", "build_report", "report_html", "report_markdown"]

PATHS = "Candidate paths"  # the section of one diagram per candidate: folded in the HTML, drawn when opened


@attrs.frozen(kw_only=True)
class VerifySummary:
    """`verify`'s verdict on the whole log; `checkpoints` counts ok/stale/broken (None: not checked)."""

    ok: bool
    bad_seq: int | None
    reason: str | None
    checkpoints: dict[str, int] | None


@attrs.frozen
class RecoveryGroup:
    """The recovery plans of one stage and action: (candidate id, seq) each."""

    stage: str
    action: str
    candidates: list[tuple[str, int]]


@attrs.frozen(kw_only=True)
class LedgerReport:
    """What the report says; `candidates` is None when the log could not be trusted."""

    head: JSON  # {seq, hash}: the ledger's head, verified
    events: int
    verify: VerifySummary
    seals: JSON | None
    trusted: bool
    as_of: int | None = None  # the position the candidates are shown at (None: the head)
    candidates: dict[str, Explanation] | None = None
    recoveries: list[RecoveryGroup] = attrs.Factory(list)

    def by_state(self) -> dict[str, list[str]]:
        found = self.candidates or {}
        return {s.value: [cid for cid, x in found.items() if x.candidate.state is s] for s in State}

    def to_json(self) -> JSON:
        explained = None if self.candidates is None else {cid: x.to_json() for cid, x in self.candidates.items()}
        return attrs.asdict(self, recurse=True, filter=lambda a, _: a.name != "candidates") | {
            "candidates": explained,
            "by_state": self.by_state(),
        }


def build_report(store: EventStore, *, as_of: AsOf | None = None) -> LedgerReport:
    """The report's content (what both renderers format), read in one snapshot: its head, verify
    result, states and recoveries describe the same log while writers go on. `as_of` shows the
    candidates and recoveries as they were then; the whole log is verified either way."""
    with store.read_snapshot():
        return _build_report(store, as_of)


def _verify_summary(checked: JSON) -> VerifySummary:
    found = checked["checkpoints"]
    counts = None if found is None else {s: sum(c["status"] == s for c in found) for s in ("ok", "stale", "broken")}
    return VerifySummary(
        ok=checked["ok"], bad_seq=checked.get("bad_seq"), reason=checked.get("reason"), checkpoints=counts
    )


def _build_report(store: EventStore, as_of: AsOf | None) -> LedgerReport:
    from lifecycle_fsm.findings import TRUST_CODES
    from lifecycle_fsm.seals import add_trust_findings

    verified, full = verify_with_state(store)
    checked = add_trust_findings(store, verified)  # seal hashes vs the chain; signatures need --pubkey
    # States may be shown when the chain, a full replay and the index hold (a broken checkpoint is
    # not used; a broken guard changes no row) and no seal contradicts the chain.
    trusted = full is not None and not any(p["code"] in TRUST_CODES for p in checked["problems"])
    report = LedgerReport(
        head=checked["head"],
        events=checked["events"],
        verify=_verify_summary(checked),
        seals=checked.get("seals"),
        trusted=trusted,
    )
    position = position_of(store, as_of)
    if not trusted or full is None:
        return attrs.evolve(report, as_of=None if as_of is None else position)
    activations = baseline_activations(store)  # once, not once per candidate
    explained = {}
    for cid in sorted(full.candidates):
        try:
            explained[cid] = explanation(store, cid, as_of=position, activations=activations)
        except NotFoundError:  # received after the as-of position
            continue
    recoveries: dict[tuple[str, str], list[tuple[str, int]]] = defaultdict(list)
    for event in select_events(store, EventFilter(types=("RecoveryPlanned",), before=position + 1)):
        plan = decoded_payload(event)
        recoveries[(str(plan["stage"]), str(plan["action"]))].append(
            (event.stream_id.removeprefix("candidate:"), event.seq)
        )
    groups = [RecoveryGroup(stage, action, items) for (stage, action), items in sorted(recoveries.items())]
    return attrs.evolve(report, as_of=None if as_of is None else position, candidates=explained, recoveries=groups)


def _md_cell(text: Any) -> str:
    return markdown_text(display(format_value(text)))  # one line: a newline would end the table row


def _seals_text(seals: JSON | None) -> str:
    if seals is None:
        return "not reported: this version of `verify` does not check sealed heads"
    if not seals.get("count"):
        return "none recorded (`lifecycle seal` signs the head)"
    return (
        f"{seals.get('count')} seal(s), keys {_md_cell(seals.get('keys'))}, last at seq "
        f"{format_value(seals.get('last_seq'))} (each sealed hash checked against the chain; "
        "signatures: `lifecycle verify --pubkey`)"
    )


def _summary(doc: LedgerReport) -> list[str]:
    """The verdict first (when verify failed), then the summary table."""
    v, head = doc.verify, doc.head
    at = "" if v.bad_seq is None else f" at seq {v.bad_seq}"  # the index or a guard: no position
    out = []
    if not v.ok:
        shown = (
            "Candidate states below come from a full replay (only a checkpoint is broken)."
            if doc.trusted
            else "No candidate state is shown: it would be folded from untrusted rows."
        )
        out += [
            f"> **VERIFY FAILED**{at}: {markdown_text(str(v.reason))}",
            ">",
            f"> The log cannot be trusted as it stands. {shown}",
            "",
        ]
    cp = v.checkpoints
    cp_text = (
        "not checked (the chain or the replay broke first)"
        if cp is None
        else f"{cp['ok']} ok, {cp['stale']} stale (not used), {cp['broken']} broken"
    )
    out += ["| item | value |", "|---|---|", f"| head seq | {head['seq']} |", f"| head hash | `{head['hash']}` |"]
    if doc.as_of is not None:
        out.append(f"| candidates as of | seq {doc.as_of} (every state below is as it was then) |")
    out += [
        f"| events | {doc.events} |",
        f"| verify | {'ok' if v.ok else 'FAILED' + at} |",
        f"| checkpoints | {cp_text} |",
        f"| seals | {_seals_text(doc.seals)} |",
        "",
    ]
    return out


def _recoveries(groups: list[RecoveryGroup]) -> list[str]:
    if not groups:
        return ["No stage failed."]
    out = ["| stage | action | count | candidates (seq) |", "|---|---|---|---|"]
    for g in groups:
        listed = _md_cell(", ".join(f"{cid} ({seq})" for cid, seq in g.candidates))
        out.append(f"| {g.stage} | {g.action} | {len(g.candidates)} | {listed} |")
    return out


def report_markdown(doc: LedgerReport) -> str:
    """The report as Markdown (GitHub and most tickets draw the Mermaid blocks)."""
    title = "# Ledger report" if doc.as_of is None else f"# Ledger report as of seq {doc.as_of}"
    out = [title, "", *_summary(doc)]
    if doc.candidates is None:
        return "\n".join(out)
    out += ["## Candidates by state", "", "| state | count | candidates |", "|---|---|---|"]
    out += [f"| {state} | {len(ids)} | {_md_cell(', '.join(ids)) or '-'} |" for state, ids in doc.by_state().items()]
    rejected = [x for x in doc.candidates.values() if x.candidate.state is State.REJECT]
    out += ["", "## Rejections", ""]
    if not rejected:
        out += ["No candidate was rejected.", ""]
    out += [explain_markdown(x, level=3) for x in rejected]
    out += ["## Recoveries by stage and action", "", *_recoveries(doc.recoveries)]
    out += ["", "## The machine", "", "```mermaid", machine_flowchart(), "```", "", f"## {PATHS}", ""]
    for cid, x in doc.candidates.items():
        flowchart = path_flowchart(x.path)
        out += [f"### {_md_cell(cid)}: {x.candidate.state}", "", "```mermaid", flowchart, "```", ""]
    return "\n".join(out)


def report_html(doc: LedgerReport) -> str:
    """The same report as one self-contained HTML file (Mermaid inlined, nothing fetched).

    The machine is drawn on load; each candidate's path is a closed block whose diagram is
    drawn when it is opened, so the page is ready at once however many candidates there are.
    """
    title = f"Ledger report at seq {doc.head['seq']}" if doc.as_of is None else f"Ledger report as of seq {doc.as_of}"
    return markdown_to_html(report_markdown(doc), title=title, folded=(PATHS,))
