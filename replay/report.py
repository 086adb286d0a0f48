"""The ledger report an auditor can hand over (`lifecycle report`): head, `verify` and seals, candidates by
state, each rejection's evidence, recoveries, and Mermaid diagrams of the machine and each candidate's path.

No clock reading or host name: the same ledger (and as-of) gives the same bytes. When `verify` fails the
report says so first and shows no state folded from a log it could not trust. The HTML page (markdown-it-py)
inlines the vendored Mermaid build (`assets/`), so it fetches nothing and its bytes depend only on the Markdown.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from collections.abc import Sequence
from functools import cache
from importlib import resources
from typing import Any

import attrs
from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token

from lifecycle_fsm.errors import NotFoundError
from lifecycle_fsm.findings import TRUST_CODES
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.limits import display
from lifecycle_fsm.machine import INITIAL_TRIGGERS, MOVES, State
from lifecycle_fsm.replay.explain import baseline_activations, explanation
from lifecycle_fsm.replay.explanation_parts import Explanation, PathStep, explain_markdown, format_value, markdown_text
from lifecycle_fsm.replay.log import AsOf, position_of
from lifecycle_fsm.replay.verify import verify_with_state
from lifecycle_fsm.store.base import EventStore, select_events
from lifecycle_fsm.store.records import EventFilter
from lifecycle_fsm.upcasting import decoded_payload

PATHS = "Candidate paths"  # the section of one diagram per candidate: folded in the HTML, drawn when opened
MAX_PATH_MOVES = 60  # a path diagram shows the last moves of a very long life
STATE_STYLES = {  # hand-off outcomes coloured alike in every diagram
    State.READY: "fill:#d7f0d8,stroke:#2e7d32,color:#1b5e20",
    State.TUNE: "fill:#fff1c2,stroke:#b38600,color:#5c4400",
    State.REJECT: "fill:#fbd5d5,stroke:#c62828,color:#7f1010",
    State.RECOVERING: "fill:#dce9f7,stroke:#1e5aa8,color:#0d3266",
}
STYLES = [f"  classDef {state.value} {style}" for state, style in STATE_STYLES.items()]


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
    """The report's content, read in one snapshot so its parts describe the same log while writers go on.
    `as_of` shows the candidates and recoveries as they were then; the whole log is verified either way."""
    from lifecycle_fsm.seals import add_trust_findings

    with store.read_snapshot():
        verified, full = verify_with_state(store)
        checked = add_trust_findings(store, verified)  # seal hashes vs the chain; signatures need --pubkey
        found = checked["checkpoints"]
        counts = None if found is None else {s: sum(c["status"] == s for c in found) for s in ("ok", "stale", "broken")}
        summary = VerifySummary(
            ok=checked["ok"], bad_seq=checked.get("bad_seq"), reason=checked.get("reason"), checkpoints=counts
        )
        # States are shown when the chain, a full replay and the indexes hold (a broken checkpoint is not
        # used; a broken guard changes no row) and no seal contradicts the chain.
        trusted = full is not None and not any(p["code"] in TRUST_CODES for p in checked["problems"])
        position = position_of(store, as_of)
        report = LedgerReport(
            head=checked["head"],
            events=checked["events"],
            verify=summary,
            seals=checked.get("seals"),
            trusted=trusted,
            as_of=None if as_of is None else position,
        )
        if not trusted or full is None:
            return report
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
            where = (event.stream_id.removeprefix("candidate:"), event.seq)
            recoveries[(str(plan["stage"]), str(plan["action"]))].append(where)
        groups = [RecoveryGroup(stage, action, items) for (stage, action), items in sorted(recoveries.items())]
        return attrs.evolve(report, candidates=explained, recoveries=groups)


def machine_flowchart() -> str:
    """The transition table as a top-down flowchart: one edge per pair of states, its triggers stacked in
    the label, and the moves that keep a state listed in its node (so no loop label lands on an edge)."""
    edges: dict[tuple[State, State], list[str]] = {}
    stays: dict[State, list[str]] = {state: [] for state in State}
    for move in MOVES:
        for source in move.sources:
            if move.dest is None or move.dest is source:
                stays[source].append(move.trigger)
            else:
                edges.setdefault((source, move.dest), []).append(move.trigger)
    lines = ["flowchart TB", '  start(["new candidate"])']
    for state in State:
        kept = f"<br/><small>stays on: {', '.join(dict.fromkeys(stays[state]))}</small>" if stays[state] else ""
        lines.append(f'  {state.value}["<b>{state.value}</b>{kept}"]')
    lines.append(f'  start -->|"{"<br/>".join(INITIAL_TRIGGERS)}"| {State.RECEIVED.value}')
    lines += [f'  {source.value} -->|"{"<br/>".join(ts)}"| {dest.value}' for (source, dest), ts in edges.items()]
    return "\n".join([*lines, *STYLES, *(f"  class {state.value} {state.value}" for state in STATE_STYLES)])


def path_flowchart(path: Sequence[PathStep]) -> str:
    """One candidate's moves as a left-to-right flowchart (state-changing events only), each state coloured."""
    moves = [s for s in path if s.from_state != s.to]
    skipped = max(0, len(moves) - MAX_PATH_MOVES)
    lines = ["flowchart LR", f'  s0(["... {skipped} earlier moves"])' if skipped else '  s0(["start"])']
    shown = moves[skipped:]
    lines += [f'  s{n - 1} -->|"{s.trigger} (seq {s.seq})"| s{n}["{s.to}"]' for n, s in enumerate(shown, start=1)]
    if shown:
        coloured = {state.value for state in STATE_STYLES}
        lines += STYLES
        lines += [f"  class s{n} {step.to}" for n, step in enumerate(shown, start=1) if step.to in coloured]
        lines += [f"  class s{len(shown)} current", "  classDef current stroke-width:3px"]
    return "\n".join(lines)


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


def report_markdown(doc: LedgerReport) -> str:
    """The report as Markdown (GitHub and most tickets draw the Mermaid blocks)."""
    title = "# Ledger report" if doc.as_of is None else f"# Ledger report as of seq {doc.as_of}"
    out = [title, "", *_summary(doc)]
    if doc.candidates is None:
        return "\n".join(out)
    out += ["## Candidates by state", "", "| state | count | candidates |", "|---|---|---|"]
    out += [f"| {state} | {len(ids)} | {_md_cell(', '.join(ids)) or '-'} |" for state, ids in doc.by_state().items()]
    rejected = [x for x in doc.candidates.values() if x.candidate.state is State.REJECT]
    out += ["", "## Rejections", "", *([] if rejected else ["No candidate was rejected.", ""])]
    out += [explain_markdown(x, level=3) for x in rejected]
    out += ["## Recoveries by stage and action", ""]
    if doc.recoveries:
        out += ["| stage | action | count | candidates (seq) |", "|---|---|---|---|"]
    else:
        out.append("No stage failed.")
    for g in doc.recoveries:
        listed = _md_cell(", ".join(f"{cid} ({seq})" for cid, seq in g.candidates))
        out.append(f"| {g.stage} | {g.action} | {len(g.candidates)} | {listed} |")
    out += ["", "## The machine", "", "```mermaid", machine_flowchart(), "```", "", f"## {PATHS}", ""]
    for cid, x in doc.candidates.items():
        out += [f"### {_md_cell(cid)}: {x.candidate.state}", "", "```mermaid", path_flowchart(x.path), "```", ""]
    return "\n".join(out)


MERMAID_ASSET = "mermaid.tiny.js"

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #c8c8c8; padding: .3rem .6rem; text-align: left; vertical-align: top; }
code { overflow-wrap: anywhere; }
li { overflow-wrap: anywhere; }
blockquote { border-left: .4rem solid #c00; background: #fff0f0; margin: 1rem 0; padding: .5rem 1rem; }
.failed { color: #c00; font-weight: 600; }
nav.toc { border: 1px solid #c8c8c8; background: #fafafa; padding: .3rem 1rem; margin: 1rem 0; }
nav.toc ul { margin: .2rem 0; padding-left: 1.2rem; }
pre.mermaid { background: #fafafa; padding: 1rem; }
details.folded { margin: .3rem 0; }
details.folded > summary { cursor: pointer; }
details.folded > summary > h3 { display: inline; font-size: 1.05rem; overflow-wrap: anywhere; }
"""

# Diagrams outside a closed <details> are drawn now; a block's when it is opened. Each
# mermaid.run waits for the one before (Mermaid names each diagram by the clock: two
# runs at once could give two diagrams the same id) and an error does not stop the next.
_DRAW = """
mermaid.initialize({startOnLoad: false, securityLevel: 'strict'});
(function () {
  let drawing = Promise.resolve();
  function draw(nodes) {
    const todo = Array.from(nodes).filter((n) => !n.hasAttribute('data-processed'));
    if (todo.length) drawing = drawing.then(() => mermaid.run({nodes: todo})).catch((e) => console.error(e));
  }
  document.addEventListener('toggle', (event) => {
    const block = event.target;
    if (block instanceof HTMLDetailsElement && block.open) draw(block.querySelectorAll('pre.mermaid'));
  }, true);
  draw(Array.from(document.querySelectorAll('pre.mermaid')).filter((n) => !n.closest('details:not([open])')));
})();
"""


@cache
def mermaid_js() -> str:
    """The vendored Mermaid build; refused if it could end the inline script early."""
    text = resources.files("lifecycle_fsm.replay").joinpath("assets", MERMAID_ASSET).read_text(encoding="utf-8")
    if "</script" in text.lower() or "<script" in text.lower():
        raise ValueError(f"{MERMAID_ASSET} contains a script tag: it cannot be inlined safely")
    return text


def _fence(renderer: RendererHTML, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """A ```mermaid fence is a diagram for the browser; any other fence stays a code block."""
    token = tokens[idx]
    if token.info.strip() == "mermaid":
        return f'<pre class="mermaid">{html.escape(token.content)}</pre>\n'
    return RendererHTML.fence(renderer, tokens, idx, options, env)


_FAILED = re.compile(r"\b(FAILED|failed)\b")


def _text(renderer: RendererHTML, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """Plain text, escaped, with FAILED / failed marked for colour."""
    return _FAILED.sub(r'<span class="failed">\1</span>', escapeHtml(tokens[idx].content))


def _anchor(tokens: Sequence[Token]) -> list[tuple[int, str, str]]:
    """Give every heading a unique `id`; return (level, id, text) of each, in order."""
    found: list[tuple[int, str, str]] = []
    used: dict[str, int] = {}
    for n, token in enumerate(tokens):
        if token.type != "heading_open":
            continue
        text = "".join(c.content for c in tokens[n + 1].children or () if c.type in ("text", "code_inline"))
        slug = re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-") or "section"
        used[slug] = used.get(slug, 0) + 1
        anchor = slug if used[slug] == 1 else f"{slug}-{used[slug]}"
        token.attrSet("id", anchor)
        found.append((int(token.tag[1]), anchor, text))
    return found


def _contents(headings: list[tuple[int, str, str]]) -> str:
    """A table of contents: the level-2 sections, each with its level-3 ones unless it is `PATHS`."""
    sections: list[tuple[str, list[str]]] = []
    in_folded = False
    for level, anchor, text in headings:
        link = f'<a href="#{anchor}">{escapeHtml(text)}</a>'
        if level == 2:
            sections.append((link, []))
            in_folded = text == PATHS
        elif level == 3 and sections and not in_folded:
            sections[-1][1].append(f"<li>{link}</li>")
    items = [f"<li>{link}" + (f"<ul>{''.join(subs)}</ul>" if subs else "") + "</li>" for link, subs in sections]
    return '<nav class="toc"><strong>Contents</strong>\n<ul>\n' + "\n".join(items) + "\n</ul>\n</nav>\n"


def _raw(text: str) -> Token:
    return Token("html_block", "", 0, content=text)


def _fold(tokens: Sequence[Token]) -> list[Token]:
    """Each level-3 section under `PATHS` as a closed <details> (drawing hundreds on load takes minutes)."""
    out: list[Token] = []
    in_folded = block_open = False
    for n, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag in ("h1", "h2", "h3"):
            if block_open:
                out.append(_raw("</details>\n"))
                block_open = False
            if token.tag != "h3":
                in_folded = token.tag == "h2" and tokens[n + 1].content == PATHS
            elif in_folded:
                out.append(_raw('<details class="folded">\n<summary>'))
                block_open = True
        out.append(token)
        if token.type == "heading_close" and token.tag == "h3" and block_open:
            out.append(_raw("</summary>\n"))
    if block_open:
        out.append(_raw("</details>\n"))
    return out


def report_html(doc: LedgerReport) -> str:
    """The same report as one self-contained HTML page (raw HTML in its text escaped, nothing fetched); each
    candidate's path is a closed block whose diagram is drawn when opened, so the page is ready at once."""
    title = f"Ledger report at seq {doc.head['seq']}" if doc.as_of is None else f"Ledger report as of seq {doc.as_of}"
    # The report makes no links or images: any in its text came from the log, so none is drawn.
    md = MarkdownIt("commonmark", {"html": False}).enable("table").disable(["link", "image", "autolink"])
    md.add_render_rule("fence", _fence)
    md.add_render_rule("text", _text)
    env: JSON = {}
    tokens = md.parse(report_markdown(doc), env)
    headings = _anchor(tokens)
    first = next((n for n, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"), None)
    if first is not None:  # after the title and the summary, before the first section
        tokens.insert(first, _raw(_contents(headings)))
    body = md.renderer.render(_fold(tokens), md.options, env)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}"
        f"<script>\n{mermaid_js()}\n</script>\n<script>{_DRAW}</script>\n</body>\n</html>\n"
    )
