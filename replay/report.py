"""The ledger report: one document an auditor can hand over (`lifecycle report`).

It says what the log proves and what it decided: the head (seq and hash), the
`verify` result and seals, the candidates by state, each rejection with its decisive
evidence (`explain`), the recoveries by stage and action, the machine and each
candidate's path as Mermaid diagrams. It holds no clock reading and no host name, so
the same ledger gives the same bytes. When `verify` fails, the report says so first
and shows no state folded from the log it could not trust (a broken checkpoint alone
does not count: the states come from a full replay, never from a checkpoint).
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from lifecycle_fsm.limits import display
from lifecycle_fsm.machine import State, diagram
from lifecycle_fsm.replay.explain import baseline_activations, explain
from lifecycle_fsm.replay.explain_text import explain_markdown, format_value
from lifecycle_fsm.replay.report_html import markdown_to_html
from lifecycle_fsm.replay.verify import verify_with_state
from lifecycle_fsm.store.base import EventStore, select_events
from lifecycle_fsm.store.records import EventFilter

__all__ = ["MAX_PATH_MOVES", "build_report", "path_flowchart", "report_html", "report_markdown"]

JSON = dict[str, Any]
MAX_PATH_MOVES = 60  # a path diagram shows the last moves of a very long life
PATHS = "Candidate paths"  # the section of one diagram per candidate: folded in the HTML, drawn when opened


def build_report(store: EventStore) -> JSON:
    """The report's content as data (what both renderers format), read in one snapshot: its
    head, verify result, states and recoveries describe the same log while writers go on."""
    with store.read_snapshot():
        return _build_report(store)


def _build_report(store: EventStore) -> JSON:
    from lifecycle_fsm.seals import add_trust_findings  # cryptography: only when a report is made

    verified, full = verify_with_state(store)
    verify_ok = verified["ok"]
    checked = add_trust_findings(store, verified)  # seal hashes vs the chain; signatures need --pubkey
    # States may be shown when the chain, a full replay and the index hold (a broken checkpoint is
    # not used; a broken guard changes no row) and no seal contradicts the chain.
    trusted = full is not None and (checked["ok"] or not verify_ok)
    checkpoints = checked["checkpoints"]
    doc: JSON = {
        "head": checked["head"],
        "events": checked["events"],
        "verify": {
            "ok": checked["ok"],
            "bad_seq": checked.get("bad_seq"),
            "reason": checked.get("reason"),
            "checkpoints": None  # not checked: the chain or the replay broke first
            if checkpoints is None
            else {s: sum(c["status"] == s for c in checkpoints) for s in ("ok", "stale", "broken")},
        },
        "seals": checked.get("seals"),  # SPEC §8: count, signing key ids, last seal's seq
        "trusted": trusted,
        "candidates": None,
    }
    if not trusted or full is None:
        return doc
    state = full  # verify's own full replay (never a checkpoint), read in this snapshot
    activations = baseline_activations(store)  # once, not once per candidate (it grew with candidates x settings)
    explained = {cid: explain(store, cid, activations=activations) for cid in sorted(state.candidates)}
    doc["candidates"] = explained
    doc["by_state"] = {s.value: [cid for cid, d in explained.items() if d["state"] == s.value] for s in State}
    recoveries: dict[tuple[str, str], list[JSON]] = defaultdict(list)
    for event in select_events(store, EventFilter(types=("RecoveryPlanned",))):
        plan = explained[event.stream_id.removeprefix("candidate:")]
        recoveries[(_payload_field(event.payload, "stage"), _payload_field(event.payload, "action"))].append(
            {"id": plan["id"], "seq": event.seq}
        )
    doc["recoveries"] = [
        {"stage": stage, "action": action, "count": len(items), "candidates": items}
        for (stage, action), items in sorted(recoveries.items())
    ]
    doc["machine"] = diagram()
    return doc


def _payload_field(payload: str, key: str) -> str:
    import orjson

    return str(orjson.loads(payload)[key])


def path_flowchart(path: list[JSON]) -> str:
    """One candidate's moves as a left-to-right Mermaid flowchart (state-changing events only)."""
    moves = [s for s in path if s["from"] != s["to"]]
    lines = ["flowchart LR", '  s0(["start"])']
    skipped = max(0, len(moves) - MAX_PATH_MOVES)
    if skipped:
        lines[1] = f'  s0(["... {skipped} earlier moves"])'
    for n, step in enumerate(moves[skipped:], start=1):
        lines.append(f'  s{n - 1} -->|"{step["trigger"]} (seq {step["seq"]})"| s{n}["{step["to"]}"]')
    if moves:
        lines.append(f"  class s{len(moves) - skipped} current")
        lines.append("  classDef current fill:#ffd966,stroke:#7f6000,stroke-width:2px")
    return "\n".join(lines)


def _md_cell(text: Any) -> str:
    return display(format_value(text)).replace("|", "\\|")  # one line: a newline would end the table row


def report_markdown(doc: JSON) -> str:
    """The report as Markdown (GitHub and most tickets draw the Mermaid blocks)."""
    v, head = doc["verify"], doc["head"]
    out = ["# Ledger report", ""]
    at = "" if v["bad_seq"] is None else f" at seq {v['bad_seq']}"  # the index or a guard: no position
    if not v["ok"]:
        out += [f"> **VERIFY FAILED**{at}: {v['reason']}", ">",
                "> The log cannot be trusted as it stands. " + (
                    "Candidate states below come from a full replay (only a checkpoint is broken)."
                    if doc["trusted"] else "No candidate state is shown: it would be folded from untrusted rows."),
                ""]  # fmt: skip
    seals = doc["seals"]
    seal_text = (
        "not reported: this version of `verify` does not check sealed heads"
        if seals is None
        else "none recorded (`lifecycle seal` signs the head)"
        if not seals.get("count")
        else f"{seals.get('count')} seal(s), keys {format_value(seals.get('keys'))}, last at seq "
        f"{format_value(seals.get('last_seq'))} (each sealed hash checked against the chain; "
        "signatures: `lifecycle verify --pubkey`)"
    )
    cp = v["checkpoints"]
    cp_text = (
        "not checked (the chain or the replay broke first)"
        if cp is None
        else (f"{cp['ok']} ok, {cp['stale']} stale (not used), {cp['broken']} broken")
    )
    out += [
        "| | |", "|---|---|",
        f"| head seq | {head['seq']} |", f"| head hash | `{head['hash']}` |", f"| events | {doc['events']} |",
        f"| verify | {'ok' if v['ok'] else 'FAILED' + at} |",
        f"| checkpoints | {cp_text} |",
        f"| seals | {_md_cell(seal_text)} |", "",
    ]  # fmt: skip
    if doc["candidates"] is None:
        return "\n".join(out)
    out += ["## Candidates by state", "", "| state | count | candidates |", "|---|---|---|"]
    out += [f"| {state} | {len(ids)} | {_md_cell(', '.join(ids)) or '-'} |" for state, ids in doc["by_state"].items()]
    rejected = [d for d in doc["candidates"].values() if d["state"] == "reject"]
    out += ["", "## Rejections", ""]
    if not rejected:
        out += ["No candidate was rejected.", ""]
    for d in rejected:
        out.append(explain_markdown(d, level=3))
    out += ["## Recoveries by stage and action", ""]
    if doc["recoveries"]:
        out += ["| stage | action | count | candidates (seq) |", "|---|---|---|---|"]
        out += [
            f"| {r['stage']} | {r['action']} | {r['count']} | "
            f"{_md_cell(', '.join(_seq_of(c) for c in r['candidates']))} |"
            for r in doc["recoveries"]
        ]
    else:
        out.append("No stage failed.")
    out += ["", "## The machine", "", "```mermaid", doc["machine"], "```", "", f"## {PATHS}", ""]
    for cid, d in doc["candidates"].items():
        out += [f"### {_md_cell(cid)}: {d['state']}", "", "```mermaid", path_flowchart(d["path"]), "```", ""]
    return "\n".join(out)


def _seq_of(item: JSON) -> str:
    return f"{item['id']} ({item['seq']})"


def report_html(doc: JSON) -> str:
    """The same report as one self-contained HTML file (Mermaid inlined, nothing fetched).

    The machine is drawn on load; each candidate's path is a closed block whose diagram is
    drawn when it is opened, so the page is ready at once however many candidates there are.
    """
    title = f"Ledger report at seq {doc['head']['seq']}"
    return markdown_to_html(report_markdown(doc), title=title, folded=(PATHS,))
