"""Markdown to one self-contained HTML page (markdown-it-py), Mermaid diagrams drawn in the browser offline.

The vendored Mermaid build (`assets/`) is inlined, so the page fetches nothing and its bytes depend only on
the Markdown. The level-3 sections of the `folded` level-2 sections become closed `<details>` blocks whose
diagrams are drawn when opened: drawing hundreds on load would take minutes. Every heading gets an anchor,
the unfolded ones a line in the table of contents, and FAILED / failed is set in red.
"""

from __future__ import annotations

import html
import re
from collections.abc import Collection, Sequence
from functools import cache
from importlib import resources
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.renderer import RendererHTML
from markdown_it.token import Token

from lifecycle_fsm.json_types import JSON

__all__ = ["MERMAID_ASSET", "markdown_to_html", "mermaid_js"]

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


def _contents(headings: list[tuple[int, str, str]], folded: Collection[str]) -> str:
    """A table of contents: the level-2 sections, each with its level-3 ones unless it is folded."""
    sections: list[tuple[str, list[str]]] = []
    in_folded = False
    for level, anchor, text in headings:
        link = f'<a href="#{anchor}">{escapeHtml(text)}</a>'
        if level == 2:
            sections.append((link, []))
            in_folded = text in folded
        elif level == 3 and sections and not in_folded:
            sections[-1][1].append(f"<li>{link}</li>")
    items = [f"<li>{link}" + (f"<ul>{''.join(subs)}</ul>" if subs else "") + "</li>" for link, subs in sections]
    return '<nav class="toc"><strong>Contents</strong>\n<ul>\n' + "\n".join(items) + "\n</ul>\n</nav>\n"


def _raw(text: str) -> Token:
    return Token("html_block", "", 0, content=text)


def _fold(tokens: Sequence[Token], folded: Collection[str]) -> list[Token]:
    """Each level-3 section under a level-2 heading named in `folded` as a closed <details>, its heading the summary."""
    out: list[Token] = []
    in_folded = block_open = False
    for n, token in enumerate(tokens):
        if token.type == "heading_open" and token.tag in ("h1", "h2", "h3"):
            if block_open:
                out.append(_raw("</details>\n"))
                block_open = False
            if token.tag != "h3":
                in_folded = token.tag == "h2" and tokens[n + 1].content in folded
            elif in_folded:
                out.append(_raw('<details class="folded">\n<summary>'))
                block_open = True
        out.append(token)
        if token.type == "heading_close" and token.tag == "h3" and block_open:
            out.append(_raw("</summary>\n"))
    if block_open:
        out.append(_raw("</details>\n"))
    return out


def markdown_to_html(markdown: str, *, title: str, folded: Collection[str] = ()) -> str:
    """A complete HTML document for `markdown` (raw HTML in it escaped), the sections under `folded` closed."""
    # The report makes no links or images: any in its text came from the log, so none is drawn.
    md = MarkdownIt("commonmark", {"html": False}).enable("table").disable(["link", "image", "autolink"])
    md.add_render_rule("fence", _fence)
    md.add_render_rule("text", _text)
    env: JSON = {}
    tokens = md.parse(markdown, env)
    headings = _anchor(tokens)
    first = next((n for n, t in enumerate(tokens) if t.type == "heading_open" and t.tag == "h2"), None)
    if first is not None:  # after the title and the summary, before the first section
        tokens.insert(first, _raw(_contents(headings, folded)))
    body = md.renderer.render(_fold(tokens, folded), md.options, env)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}"
        f"<script>\n{mermaid_js()}\n</script>\n"
        f"<script>{_DRAW}</script>\n"
        "</body>\n</html>\n"
    )
