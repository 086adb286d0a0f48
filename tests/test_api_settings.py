"""Settings commands as a supervisor runs them: once per run, on a ledger others also change."""

from __future__ import annotations

from pathlib import Path

import pytest

from lifecycle_fsm import ConflictError, Ledger
from tests.conftest import Workspace


@pytest.fixture(params=["sqlite", "postgres"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("pg_url"))


def test_init_again_with_the_values_it_was_initialised_with_is_a_no_op_after_the_window_moved(target: str) -> None:
    """Every supervisor run starts with `init` (README, examples/supervisor_loop.py): once anyone had
    advanced the window, the next run's `init` was a ConflictError ("already initialized ... active
    window 2"), comparing the values it was initialised with to today's window."""
    with Ledger.open(target, actor="run1") as first:
        assert first.init(event_id="run1/0001/init").appended
        first.advance_window(3, event_id="run1/0002/window")
    with Ledger.open(target, actor="run2") as second:
        again = second.init(event_id="run2/0001/init")
        assert not again.appended and not again.duplicate and again.events == ()
        assert (again.settings.max_window_age, again.settings.active_window) == (2, 3)
        assert not second.init(2, 3).appended  # today's values: a no-op, as before
        for other in ((5, 1), (2, 2), (2, 0), (5, 3)):
            with pytest.raises(ConflictError, match="already initialized"):
                second.init(*other)
        assert [e.type for e in second.events()] == ["LedgerInitialized", "WindowAdvanced"]


def test_the_defaults_a_settings_command_fixed_are_the_values_init_is_compared_with(ws: Workspace) -> None:
    with ws.ledger() as ledger:
        ledger.advance_window(4)  # on a ledger nobody initialised: the seed's defaults (2, 1) first
        assert not ledger.init().appended
        with pytest.raises(ConflictError, match="already initialized"):
            ledger.init(2, 2)
