"""`status` draws its table without rich when rich's layout is plain: the text must be rich's own.

rich is the oracle here: for any rows, `plain_table` either declines (None: rich prints) or
returns exactly what `console().print(table)` writes into a pipe.
"""

from __future__ import annotations

import io
import string

from hypothesis import given, settings
from hypothesis import strategies as st
from rich.console import Console

from lifecycle_fsm.cli.render import PIPE_WIDTH, _table, cells, plain_table

COLUMNS = ("id", "kind", "state", "version", "reasons")
ascii_cell = st.text(alphabet=string.printable, max_size=40)  # printable ASCII plus \t \n \r \x0b \x0c
any_cell = st.text(max_size=30)
rows = st.lists(st.tuples(*[st.one_of(ascii_cell, any_cell)] * len(COLUMNS)), max_size=6)


def rich_text(rows: list[tuple[str, ...]]) -> str:
    table = _table(*COLUMNS)
    for row in rows:
        table.add_row(*cells(*row))
    out = io.StringIO()
    Console(file=out, width=PIPE_WIDTH).print(table)
    return out.getvalue()


@settings(max_examples=300, deadline=None)
@given(rows)
def test_plain_table_is_rich_s_text_or_declines(rows: list[tuple[str, ...]]) -> None:
    text = plain_table(COLUMNS, rows)
    if text is not None:
        assert text + "\n" == rich_text(rows)


def test_a_usual_status_row_is_drawn_without_rich_and_a_wide_one_is_not() -> None:
    usual = [("grpo-v7-lr3e-6", "grpo", "ready_for_independent_eval", "7", "fresh_baseline, trusted_inputs")]
    assert plain_table(COLUMNS, usual) == rich_text(usual).rstrip("\n")
    assert plain_table(COLUMNS, [("x" * 300, "grpo", "received", "1", "")]) is None  # rich folds it
    assert plain_table(COLUMNS, [("候选-1", "grpo", "received", "1", "")]) is None  # wide cells: rich measures


def test_the_pipe_width_is_the_edge() -> None:
    """A table exactly as wide as the pipe is drawn plain; one column more and rich folds the widest cell."""
    fits = [("x" * 198, "grpo", "received", "1", "")]  # 198 + 4 + 8 + 7 + 7 + 16 borders/padding = 240
    assert max(len(line) for line in rich_text(fits).splitlines()) == PIPE_WIDTH
    assert plain_table(COLUMNS, fits) == rich_text(fits).rstrip("\n")
    wider = [("x" * 199, "grpo", "received", "1", "")]
    assert plain_table(COLUMNS, wider) is None
    assert len(rich_text(wider).splitlines()) > 5  # rich folded the id onto a second line
