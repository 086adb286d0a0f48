"""Hostile input fails closed, fast: special files, oversized files, YAML bombs, huge seeds, escape-laden ids."""

from __future__ import annotations

import json
import os
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from conftest import Workspace, cli, count_events, invoke, run_cli

from lifecycle_fsm.cli import main
from lifecycle_fsm.errors import InputError, ScenarioError
from lifecycle_fsm.limits import MAX_CANDIDATE_ID_LENGTH, MAX_INT64, check_candidate_id, display, read_regular_file
from lifecycle_fsm.replay.drills.loader import load_scenario

SCENARIO = """\
name: hostile
seed: {seed}
artifacts:
  sft: {{type: baseline}}
  dpo-v5: {{type: dpo{extra}}}
steps:
  - activate_baseline: sft
  - receive: dpo-v5
  - expect: {{events: 3}}
"""


def _one_error_line(stderr: str) -> str:
    lines = stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("Error: "), stderr
    assert "Traceback" not in stderr
    return lines[0]


@pytest.mark.parametrize("command", [["receive"], ["baseline", "activate"]])
def test_a_fifo_manifest_is_refused_without_blocking(ws: Workspace, command: list[str]) -> None:
    """Nobody writes to the FIFO: a plain open() would block forever (run_cli's timeout would fail the test)."""
    fifo = ws.root / "m.json"
    os.mkfifo(fifo)
    result = run_cli(ws.db, *command, str(fifo))
    assert result.returncode == 3
    assert "not a regular file" in _one_error_line(result.stderr)
    assert not ws.db.exists()


@pytest.mark.parametrize("special", ["/dev/zero", "/dev/urandom"])
def test_a_device_manifest_is_refused_before_reading(ws: Workspace, special: str) -> None:
    result = run_cli(ws.db, "receive", special)
    assert result.returncode == 3
    assert "not a regular file" in _one_error_line(result.stderr)


def test_a_sparse_10_gb_manifest_is_refused_by_its_size(ws: Workspace) -> None:
    big = ws.root / "big.json"
    with big.open("wb") as fh:
        fh.truncate(10 * 1024**3)  # sparse: no disk used
    result = invoke(ws.db, "receive", str(big))
    assert result.exit_code == 3
    assert "over the 16777216-byte limit" in result.stderr
    assert count_events(ws.db) == 0


def test_the_read_cap_holds_even_when_the_size_lies(tmp_path: Path) -> None:
    """The cap is enforced on the bytes read, not only on st_size."""
    f = tmp_path / "f"
    f.write_bytes(b"x" * 100)
    assert read_regular_file(f, what="file", limit=100) == b"x" * 100
    with pytest.raises(InputError, match="over the 99-byte limit"):
        read_regular_file(f, what="file", limit=99)


def test_a_symlink_loop_and_a_directory_are_input_errors(ws: Workspace) -> None:
    (ws.root / "a").symlink_to(ws.root / "b")
    (ws.root / "b").symlink_to(ws.root / "a")
    assert invoke(ws.db, "receive", str(ws.root / "a")).exit_code == 3
    with pytest.raises(InputError, match="directory"):
        read_regular_file(ws.root, what="manifest", limit=10)


def test_yaml_aliases_are_refused_before_expansion(tmp_path: Path) -> None:
    """A billion-laughs bomb inside an artifact's manifest fields: refused at the first alias."""
    lol = ["a: &a [lol, lol, lol, lol, lol, lol, lol, lol, lol]"]
    lol += [
        f"{chr(98 + i)}: &{chr(98 + i)} [*{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}, *{chr(97 + i)}]"
        for i in range(9)
    ]
    text = SCENARIO.format(seed=1, extra=", manifest: {notes: *j}")
    text = text.replace("artifacts:", "\n".join(lol) + "\nartifacts:")
    path = tmp_path / "bomb.yaml"
    path.write_text(text)
    with pytest.raises(ScenarioError, match=r"aliases \(\*name\) are not allowed"):
        load_scenario(path)
    result = cli(tmp_path / "x.db", "drill", "--json", str(path))
    assert result.returncode == 3
    assert "aliases" in _one_error_line(result.stderr)


@pytest.mark.slow
def test_deeply_nested_yaml_is_a_scenario_error(tmp_path: Path) -> None:
    path = tmp_path / "deep.yaml"
    path.write_text("name: deep\nseed: 1\nsteps: " + "[" * 5000 + "]" * 5000 + "\n")
    with pytest.raises(ScenarioError):
        load_scenario(path)


@pytest.mark.parametrize("seed", [10**30, -1, 2**63])
def test_a_seed_beyond_64_bits_is_a_validation_error(tmp_path: Path, seed: int) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(seed=seed, extra=""))
    result = cli(tmp_path / "x.db", "drill", "--json", str(path))
    assert result.returncode == 3
    assert "key 'seed'" in _one_error_line(result.stderr)


def test_the_largest_seed_runs(tmp_path: Path) -> None:
    path = tmp_path / "s.yaml"
    path.write_text(SCENARIO.format(seed=2**63 - 1, extra=""))
    result = cli(tmp_path / "x.db", "drill", "--json", str(path))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["scenarios"][0]["seed"] == 2**63 - 1


def test_drill_seed_option_is_bounded(tmp_path: Path) -> None:
    result = cli(tmp_path / "x.db", "drill", "--seed", str(10**30), str(tmp_path))
    assert result.returncode == 2
    _one_error_line(result.stderr)


@pytest.mark.parametrize(
    "bad",
    ["evil\x1b[2J", "a\x07b", "x\u202ey", "zero\u200bwidth", "nl\nx", "", "   ", "x" * (MAX_CANDIDATE_ID_LENGTH + 1)],
)
def test_candidate_ids_are_printable_and_bounded(ws: Workspace, bad: str) -> None:
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        before = count_events(ws.db)
        with pytest.raises(InputError):
            ledger.receive(ws.dpo(), candidate_id=bad)
    assert count_events(ws.db) == before


def test_an_escape_laden_policy_version_is_refused_as_an_id(ws: Workspace) -> None:
    """The default id comes from the manifest: a 200 kB or escape-laden policy_version is not stored."""
    assert invoke(ws.db, "baseline", "activate", str(ws.baseline())).exit_code == 0
    before = count_events(ws.db)
    for version in ("x" * 200_000,):
        result = cli(ws.db, "receive", str(ws.dpo(policy_version=version)))
        assert result.returncode == 3
        assert len(_one_error_line(result.stderr)) < 500
    assert count_events(ws.db) == before


def test_printable_ids_are_accepted() -> None:
    for good in ("dpo-v5", "候选 模型/v1", "x" * MAX_CANDIDATE_ID_LENGTH, "caf\u00e9", "한국어"):
        assert check_candidate_id(good) == good


def test_an_id_not_in_nfc_is_refused_as_it_prints_like_another(ws: Workspace) -> None:
    """`café` composed (NFC, what keyboards type) and decomposed (NFD: `e` + a combining accent, what
    macOS file names hold) are different strings that print alike: both were received, as two
    candidates an auditor could not tell apart. Only NFC is accepted; the error names the NFC form."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        assert ledger.receive(ws.dpo("nfc"), candidate_id="caf\u00e9").candidate_id == "caf\u00e9"
        before = count_events(ws.db)
        with pytest.raises(InputError, match="not in Unicode NFC form: it prints like 'caf\u00e9'"):
            ledger.receive(ws.dpo("nfd"), candidate_id="cafe\u0301")
        result = cli(ws.db, "receive", str(ws.dpo("nfd2", policy_version="re\u0301sume\u0301")))
        assert result.returncode == 3 and "NFC" in _one_error_line(result.stderr)
    assert count_events(ws.db) == before


def test_untrusted_text_is_escaped_in_text_output(ws: Workspace) -> None:
    """A manifest path with an escape ends in an Error line that shows `\\x1b`, never the raw byte."""
    evil = ws.root / "evil\x1b[31m.json"
    result = cli(ws.db, "receive", str(evil))
    assert result.returncode == 3
    line = _one_error_line(result.stderr)
    assert "\x1b" not in line and "\\x1b[31m" in line
    assert display("a\x1bb\nc") == "a\\x1bb\\nc"
    assert display("a\nb", keep_newlines=True) == "a\nb"


def test_rich_markup_in_an_id_is_shown_literally(ws: Workspace) -> None:
    """`[/x]` is rich markup that would raise if a table rendered it as markup."""
    with ws.ledger() as ledger:
        ledger.activate_baseline(ws.baseline())
        ledger.receive(ws.dpo(), candidate_id="[/bold]odd[red]")
    result = cli(ws.db, "status")
    assert result.returncode == 0, result.stderr
    assert "[/bold]odd[red]" in result.stdout


@pytest.mark.parametrize(
    "args",
    [
        ["replay", "--to", str(10**30)],
        ["status", "--as-of", str(10**30)],
        ["log", "--after", str(10**30)],
        ["log", "--limit", str(10**30)],
        ["init", "--active-window", str(10**30)],
    ],
)
def test_integers_beyond_64_bits_are_usage_errors(ws: Workspace, args: list[str]) -> None:
    """SQLite raised OverflowError (a traceback) for `replay --to 10**30`."""
    assert invoke(ws.db, "init").exit_code == 0
    result = invoke(ws.db, *args)
    assert result.exit_code in (2, 3)
    _one_error_line(result.stderr)


def _commands(group: click.Group, prefix: str = "") -> Iterator[tuple[str, click.Command]]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None
        yield f"{prefix}{name}", command
        if isinstance(command, click.Group):
            yield from _commands(command, f"{prefix}{name} ")


def test_every_integer_option_and_argument_stops_at_2_63() -> None:
    """`window` took a plain `type=int`: no CLI integer may be unbounded or reach past 2^63 - 1."""
    unbounded = []
    for name, command in _commands(main):
        for param in command.params:
            kind = param.type
            if isinstance(kind, click.IntRange):
                if kind.max is None or kind.max > MAX_INT64 or (kind.min is not None and kind.min < -MAX_INT64 - 1):
                    unbounded.append(f"{name} {param.name}: {kind!r}")
            elif isinstance(kind, click.types.IntParamType):
                unbounded.append(f"{name} {param.name}: plain int")
    assert unbounded == []


@pytest.mark.parametrize("n", [str(2**64 - 1), str(2**63), str(10**30), "-1"])
def test_a_window_past_64_bits_is_refused_and_nothing_is_appended(ws: Workspace, n: str) -> None:
    """`window 18446744073709551615` was stored, after which the window could never go lower."""
    assert invoke(ws.db, "init").exit_code == 0
    before = count_events(ws.db)
    result = cli(ws.db, "window", "--", n)
    assert result.returncode == 2, result.stderr
    assert "is not in the range 0<=x<=9223372036854775807" in _one_error_line(result.stderr)
    assert count_events(ws.db) == before
    assert cli(ws.db, "window", "2").returncode == 0  # the ledger still takes an ordinary window


def test_the_largest_window_is_accepted(ws: Workspace) -> None:
    assert invoke(ws.db, "init").exit_code == 0
    result = cli(ws.db, "--json", "window", str(MAX_INT64))
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["settings"]["active_window"] == MAX_INT64


@pytest.mark.parametrize("bad", [2**64 - 1, 2**63, -1, True, False, 2.0, "3", None])
def test_the_api_refuses_an_integer_setting_out_of_range_or_not_an_int(ws: Workspace, bad: object) -> None:
    """`Ledger.advance_window(2**64 - 1)` was stored; a bool is not an int here."""
    with ws.ledger() as ledger:
        ledger.init()
        before = count_events(ws.db)
        with pytest.raises(InputError, match="window"):
            ledger.advance_window(bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="max window age"):
            ledger.init(max_window_age=bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="active window"):
            ledger.init(active_window=bad)  # type: ignore[arg-type]
        assert count_events(ws.db) == before
        assert ledger.advance_window(MAX_INT64).settings.active_window == MAX_INT64


@pytest.mark.parametrize("bad", [2**63, 10**30, -1, True, 1.5, "x"])
def test_events_after_a_seq_past_64_bits_is_an_input_error(ws: Workspace, bad: object) -> None:
    """`ledger.events(after=2**63)` leaked sqlite3's OverflowError; `after="x"` silently gave nothing."""
    with ws.ledger() as ledger:
        ledger.init()
        with pytest.raises(InputError, match="after"):
            ledger.events(after=bad)  # type: ignore[arg-type]
        with pytest.raises(InputError, match="after"):
            ledger.follow(after=bad)  # type: ignore[arg-type]
        assert [e.seq for e in ledger.events(after=0)] == [1]
        assert list(ledger.events(after=MAX_INT64)) == []


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (["evaluation", "activate", "eval-\udcff"], "evaluation version 'eval-\\udcff'"),
        (["untrust", "dpo-v5", "prompt_queue", "--reason", "\udcff\udcfe"], "reason '\\udcff\\udcfe'"),
    ],
    ids=["evaluation", "untrust-reason"],
)
def test_text_that_is_not_utf8_names_the_argument(ws: Workspace, args: list[str], named: str) -> None:
    """Bytes that are not UTF-8 (a shell's $'\\xff') as an evaluation version or an untrust reason were refused
    as "payload is not JSON-serialisable: str is not valid UTF-8", naming neither the argument nor the value;
    they are refused (exit 3) naming both, as an actor, an event id or a candidate id is."""
    assert invoke(ws.db, "init").exit_code == 0
    result = invoke(ws.db, *args)
    assert (result.exit_code, result.stdout) == (3, "")
    assert result.stderr == f"Error: {named} is not valid Unicode text (it holds a lone surrogate)\n"
    assert count_events(ws.db) == 1


def test_display_s_fast_path_is_its_per_character_rule() -> None:
    """`display` returns a printable text as it is through `str.isprintable` (in C: a `log` line is ~0.2 µs, not
    ~9 µs); that must be exactly the per-character rule for every code point, or a character would slip through."""
    import sys

    from lifecycle_fsm.limits import _is_printable

    assert all(chr(c).isprintable() == _is_printable(chr(c)) for c in range(0, sys.maxunicode + 1, 7))
    for text in ("plain", "ü ok", "a\nb", "esc\x1b[31m", "bidi\u202e", "nbsp\xa0", "zwj\u200d", ""):
        escaped = "".join(ch if _is_printable(ch) else ch.encode("unicode_escape").decode() for ch in text)
        assert display(text) == escaped
    assert display("a\nb", keep_newlines=True) == "a\nb" and display("a\n\x1b", keep_newlines=True) == "a\n\\x1b"
