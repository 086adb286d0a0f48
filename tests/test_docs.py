"""The README and the docs site stay short, plain and true to the code.

The pages' code examples run as tests of their own (tests/doc_examples.py); these check
what an example cannot: the README's length, no internal shorthand, and the tables and
diagram copied from the code (the exit codes, the machine) still equal it.
"""

from __future__ import annotations

import re

import pytest

from lifecycle_fsm.cli import EXIT_CODES
from lifecycle_fsm.machine import diagram
from tests.conftest import REPO

# The README, the docs site's pages and the files they include.
INCLUDED = [REPO / "README.md", REPO / "ARCHITECTURE.md", REPO / "scenarios" / "README.md"]
PAGES = [*sorted((REPO / "docs").glob("*.md")), *INCLUDED]
SHORTHAND = re.compile(r"\bSPEC\b|(?i:\bseed 0\d\d\b)|\b0\d\d, Step \d|(?<![\w&])#\d+\b|\bstop \d+\b|(?i:\bissue \d+)")


def test_the_readme_is_a_landing_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= 150


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_no_internal_shorthand(page) -> None:  # type: ignore[no-untyped-def]
    """A reader cannot look up an issue number, a spec section or a source document's number."""
    found = [
        f"{n}: {line.strip()}" for n, line in enumerate(page.read_text().splitlines(), 1) if SHORTHAND.search(line)
    ]
    assert found == []


def test_the_concepts_diagram_is_the_machine() -> None:
    page = (REPO / "docs" / "concepts.md").read_text()
    match = re.search(r"```mermaid\n(.*?)```", page, re.S)
    assert match is not None
    assert match.group(1).strip() == diagram().strip()


def test_the_exit_code_table_is_the_cli_s() -> None:
    page = (REPO / "docs" / "cli.md").read_text()
    rows = dict(re.findall(r"^\| (\d+) \| (.*) \|$", page, re.M))
    assert {int(code): text.replace("\\|", "|") for code, text in rows.items()} == {
        int(code): text for code, text in EXIT_CODES.items()
    }
