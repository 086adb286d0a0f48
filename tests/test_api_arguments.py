"""Arguments a supervisor passes to `Ledger.open` and the commands: a bad one is one clear
`InputError` naming it, before anything is opened or appended, the same on every backend."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from lifecycle_fsm import InputError, Ledger

BAD_BUSY_TIMEOUTS = ["30", None, True, math.nan, math.inf, -math.inf, -1, -0.5, 10**30]


@pytest.mark.parametrize("bad", BAD_BUSY_TIMEOUTS, ids=repr)
def test_a_bad_busy_timeout_is_an_input_error_on_sqlite(tmp_path: Path, bad: object) -> None:
    """It was int()'s ValueError, an OverflowError for infinity, or (negative) silently no wait at all."""
    db = tmp_path / "ledger.db"
    with pytest.raises(InputError, match="busy_timeout"):
        Ledger.open(db, busy_timeout=bad)  # type: ignore[arg-type]
    assert not db.exists()


@pytest.mark.parametrize("bad", BAD_BUSY_TIMEOUTS, ids=repr)
def test_a_bad_busy_timeout_is_an_input_error_on_postgres(pg_url: str, bad: object) -> None:
    with pytest.raises(InputError, match="busy_timeout"):
        Ledger.open(pg_url, busy_timeout=bad)  # type: ignore[arg-type]


@pytest.mark.parametrize("bad", [1, None, b"FULL"], ids=repr)
def test_a_synchronous_mode_that_is_not_a_string_is_an_input_error(tmp_path: Path, pg_url: str, bad: object) -> None:
    """It was `'int' object has no attribute 'upper'`."""
    for target in (tmp_path / "ledger.db", pg_url):
        with pytest.raises(InputError, match="synchronous"):
            Ledger.open(target, synchronous=bad)  # type: ignore[arg-type]
    assert not (tmp_path / "ledger.db").exists()


@pytest.mark.parametrize("ok", [0, 0.25, 30, 3600.0])
def test_good_busy_timeouts_still_open(tmp_path: Path, pg_url: str, ok: float) -> None:
    for target in (tmp_path / "ledger.db", pg_url):
        with Ledger.open(target, busy_timeout=ok) as ledger:
            assert ledger.init().appended or True
