"""Markdown to one self-contained HTML page, with Mermaid diagrams drawn in the browser offline.

markdown-it-py (CommonMark, already installed with rich) renders the report's
Markdown, so the HTML can never say less than the Markdown. A ```mermaid fence
becomes `<pre class="mermaid">` and the vendored Mermaid build (`assets/`, see its
README) is inlined: the page fetches nothing, so it renders on an air-gapped machine
and its bytes depend only on the Markdown.
"""

from __future__ import annotations

import html
from functools import cache
from importlib import resources
from typing import Any

from markdown_it import MarkdownIt
from markdown_it.renderer import RendererHTML

__all__ = ["MERMAID_ASSET", "markdown_to_html", "mermaid_js"]

MERMAID_ASSET = "mermaid.tiny.js"

_STYLE = """
body { font-family: system-ui, sans-serif; max-width: 72rem; margin: 2rem auto; padding: 0 1rem; color: #1b1b1b; }
table { border-collapse: collapse; margin: 1rem 0; }
th, td { border: 1px solid #c8c8c8; padding: .3rem .6rem; text-align: left; vertical-align: top; }
code { overflow-wrap: anywhere; }
li { overflow-wrap: anywhere; }
blockquote { border-left: .4rem solid #c00; background: #fff0f0; margin: 1rem 0; padding: .5rem 1rem; }
pre.mermaid { background: #fafafa; padding: 1rem; }
"""


@cache
def mermaid_js() -> str:
    """The vendored Mermaid build; refused if it could end the inline script early."""
    text = resources.files("replay").joinpath("assets", MERMAID_ASSET).read_text(encoding="utf-8")
    if "</script" in text.lower() or "<script" in text.lower():
        raise ValueError(f"{MERMAID_ASSET} contains a script tag: it cannot be inlined safely")
    return text


def _fence(renderer: RendererHTML, tokens: Any, idx: int, options: Any, env: Any) -> str:
    """A ```mermaid fence is a diagram for the browser; any other fence stays a code block."""
    token = tokens[idx]
    if token.info.strip() == "mermaid":
        return f'<pre class="mermaid">{html.escape(token.content)}</pre>\n'
    return RendererHTML.fence(renderer, tokens, idx, options, env)


def markdown_to_html(markdown: str, *, title: str) -> str:
    """A complete HTML document for `markdown` (raw HTML in it is escaped, not passed through)."""
    md = MarkdownIt("commonmark", {"html": False}).enable("table")
    md.add_render_rule("fence", _fence)
    body = md.render(markdown)
    return (
        '<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
        f"<title>{html.escape(title)}</title>\n<style>{_STYLE}</style>\n</head>\n<body>\n{body}"
        f"<script>\n{mermaid_js()}\n</script>\n"
        "<script>mermaid.initialize({startOnLoad: true, securityLevel: 'strict'});</script>\n"
        "</body>\n</html>\n"
    )
