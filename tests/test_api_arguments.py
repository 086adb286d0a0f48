"""Arguments a supervisor passes to `Ledger.open` and the commands: a bad one is one clear
`InputError` naming it, before anything is opened or appended, the same on every backend."""

from __future__ import annotations

import gc
import inspect
import math
import re
import warnings
from pathlib import Path

import pytest
from backends import pg_execute
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from lifecycle_fsm import InputError, Ledger, RetryPolicy
from lifecycle_fsm.candidate_events import TrustedStateInvalidated
from tests.conftest import Workspace, count_events

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
    """Accepted and usable: the ledger opens, creates its tables and reads. (No append under a
    zero timeout: on PostgreSQL a commit's NOTIFY takes a database-wide lock that any other
    session of the test run may hold for longer than that.)"""
    for target in (tmp_path / "ledger.db", pg_url):
        with Ledger.open(target, busy_timeout=ok) as ledger:
            assert ledger.settings() is not None
            if ok:
                ledger.init()
                assert ledger.settings().initialized


@pytest.mark.parametrize("bad", [5, None, b"stale", ["stale"]], ids=repr)
def test_an_invalidation_reason_that_is_not_a_string_is_refused(ws: Workspace, bad: object) -> None:
    """It was recorded as given (a number, null, a list) in the auditor's log, forever."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        cid = ledger.receive(ws.grpo()).candidate_id
        saved = ws.root / "trajectories.jsonl"
        saved.write_text("{}\n")
        ledger.record_trusted_state(cid, "trajectories", saved)
        before = count_events(ws.db)
        with pytest.raises(InputError, match="reason"):
            ledger.invalidate_trusted_state(cid, "trajectories", bad)  # type: ignore[arg-type]
        assert count_events(ws.db) == before
        assert "trajectories" in ledger.candidate(cid).trusted_states
        ledger.invalidate_trusted_state(cid, "trajectories", "reward model changed")
        _, event = ledger.history(cid)[-1]
        assert isinstance(event, TrustedStateInvalidated) and event.reason == "reward model changed"


@pytest.mark.parametrize("bad", [5, 30.0, None, {"deadline": 1}], ids=repr)
def test_a_retry_that_is_not_a_retry_policy_is_refused_when_opened(tmp_path: Path, bad: object) -> None:
    """It was accepted, and every later command failed with `'int' object has no attribute 'deadline'`."""
    with pytest.raises(InputError, match="retry"):
        Ledger.open(tmp_path / "ledger.db", retry=bad)


@pytest.mark.parametrize("field", ["deadline", "base", "cap"])
@pytest.mark.parametrize("bad", ["1", None, -1, math.nan], ids=repr)
def test_a_bad_retry_policy_is_an_input_error(field: str, bad: object) -> None:
    """A string or None was a TypeError from the comparison; a negative or NaN value a bare ValueError."""
    with pytest.raises(InputError, match=field):
        RetryPolicy(**{field: bad})  # type: ignore[arg-type]


def test_ledger_open_spells_out_every_keyword_the_constructor_takes() -> None:
    """`Ledger.open(..., **kwargs: Any)` let mypy --strict pass a misspelt keyword (`cached_candiates=5`,
    `artifact_rot=...`) or a wrong type (`cached_candidates="10"`), found only at run time as a bare
    TypeError. `open` now names each one, typed as the constructor types it."""
    opened = inspect.signature(Ledger.open).parameters
    made = inspect.signature(Ledger.__init__).parameters
    assert all(p.kind is not inspect.Parameter.VAR_KEYWORD for p in opened.values())
    for name, param in made.items():
        if name in ("self", "store"):
            continue
        assert name in opened, name
        assert opened[name].kind is inspect.Parameter.KEYWORD_ONLY
        assert (opened[name].annotation, opened[name].default) == (param.annotation, param.default), name


REFUSED_OPENS = [
    {"actor": 5},
    {"actor": "\ud800"},
    {"retry": 5},
    {"cached_candidates": 0},
    {"artifact_root": 5},
]


@pytest.mark.parametrize("bad", REFUSED_OPENS, ids=repr)
def test_a_refused_open_creates_no_ledger_and_leaves_no_connection_open(
    tmp_path: Path, pg_url: str, bad: dict[str, object]
) -> None:
    """The constructor's arguments were checked after the store was opened: the refused call had
    already created the ledger file (or the PostgreSQL tables) and left its connection open, to be
    found by the garbage collector ("ResourceWarning: ... was deleted while still open")."""
    db = tmp_path / "ledger.db"
    with warnings.catch_warnings():
        warnings.simplefilter("error", ResourceWarning)
        for target in (db, pg_url):
            with pytest.raises(InputError):
                Ledger.open(target, **bad)  # type: ignore[arg-type]
            gc.collect()
    assert not db.exists()
    assert pg_execute(
        pg_url, "SELECT count(*) FROM information_schema.tables WHERE table_schema = current_schema()"
    ) == [(0,)]


def test_a_nul_in_an_id_key_or_actor_is_the_same_input_error_on_every_backend(tmp_path: Path, pg_url: str) -> None:
    """No candidate id, key or actor can hold a NUL (PostgreSQL text cannot): a look-up of one was
    "unknown candidate" on SQLite and a long "read failed" error from the driver on PostgreSQL."""
    for target in (str(tmp_path / "ledger.db"), pg_url):
        with Ledger.open(target, synchronous="NORMAL") as ledger:
            ledger.init()
            for call in (
                lambda: ledger.check("a\x00b"),
                lambda: ledger.candidate("a\x00b"),
                lambda: ledger.wait_for("a\x00b", "ready", timeout=0),
                lambda: list(ledger.events(stream="a\x00b")),
            ):
                with pytest.raises(InputError, match=r"candidate id 'a\\x00b' holds a NUL character") as e:
                    call()
                assert "\n" not in str(e.value)
            with pytest.raises(InputError, match="event_id 'k\\\\x00' holds a NUL"):
                ledger.init(event_id="k\x00")
            with pytest.raises(InputError, match="actor 'a\\\\x00' holds a NUL"):
                Ledger.open(target, actor="a\x00")
            assert ledger.store.count_events() == 1


@pytest.mark.parametrize(
    ("bad", "says"),
    [
        ("eval-v1 ", "starts or ends with whitespace"),
        (" eval-v1", "starts or ends with whitespace"),
        ("eval\x00v1", "NUL character"),
        ("eval\x1bv1", "control or format"),
        ("eval\u200bv1", "control or format"),
        ("e" * 257, "257 characters"),
        ("", "non-empty"),
        ("   ", "non-empty"),
        (5, "non-empty"),
    ],
    ids=repr,
)
def test_an_evaluation_version_no_manifest_could_name_is_refused(ws: Workspace, bad: object, says: str) -> None:
    """`activate_evaluation("eval-v1 ")` was stored: every later check then failed `evaluation_identity`
    against manifests naming `eval-v1`, and the two print alike. Refused, nothing appended."""
    with ws.ledger() as ledger:
        ledger.init()
        with pytest.raises(InputError, match=says):
            ledger.activate_evaluation(bad)  # type: ignore[arg-type]
        assert ledger.store.count_events() == 1
        assert ledger.activate_evaluation("e" * 256).settings.evaluation_version == "e" * 256


@pytest.mark.parametrize(
    "reading",
    [
        "2026-01-01T00:00:00Z",
        "2026-01-01T00:00:00.000000+00:00",
        "2026-13-01T00:00:00.000000Z",
        "2026-02-30T25:00:00.000000Z",
        "yesterday",
        "",
        1767225600.0,
        None,
    ],
)
def test_a_clock_that_does_not_give_the_stored_time_form_is_refused(tmp_path: Path, reading: object) -> None:
    """Times are compared as text (`--as-of`): `...00Z` would sort after `...00.5Z`. A clock giving any
    other form is refused before anything is appended."""
    db = tmp_path / "l.db"
    with Ledger.open(db) as ledger:
        ledger.init()
    before = count_events(db)
    refused = pytest.raises(InputError, match=re.escape("an event's time is UTC text like 2026-11-30T12:00:00.000000Z"))
    with Ledger.open(db, clock=lambda: reading) as ledger, refused:  # type: ignore[arg-type, return-value]
        ledger.advance_window(2)
    key = Ed25519PrivateKey.generate()
    with Ledger.open(db, clock=lambda: reading, signing_key=key) as ledger, refused:  # type: ignore[arg-type, return-value]
        ledger.seal()
    assert count_events(db) == before
