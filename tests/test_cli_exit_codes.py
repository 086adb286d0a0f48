"""`lifecycle_fsm.cli.exit_codes`: every error class ends in a documented code, the most specific row first."""

from __future__ import annotations

from collections.abc import Iterator

import click
import pytest
from click.testing import CliRunner
from test_errors import ERROR_EXAMPLES

from lifecycle_fsm.cli import EXIT_CODES, main
from lifecycle_fsm.cli.exit_codes import ERROR_EXIT_CODES, ExitCode, exit_code_for
from lifecycle_fsm.decision_pool import DecisionPoolError
from lifecycle_fsm.errors import (
    ArtifactError,
    ArtifactUnreadable,
    ConcurrencyError,
    ConflictError,
    CorruptionError,
    DuplicateEventError,
    IllegalCommandError,
    InputError,
    IntegrityError,
    LedgerClosedError,
    LifecycleError,
    NotFoundError,
    ScenarioError,
    StoreError,
)
from lifecycle_fsm.feed import WaitTimeout
from lifecycle_fsm.state import IllegalTransition

# Transcribed by hand from the documented exit codes: an oracle independent of ERROR_EXIT_CODES.
EXPECTED = {
    InputError: 3,
    ArtifactError: 3,
    ArtifactUnreadable: 3,
    ScenarioError: 3,
    NotFoundError: 4,
    ConflictError: 5,
    IllegalCommandError: 5,
    ConcurrencyError: 5,
    DuplicateEventError: 5,
    IntegrityError: 6,
    CorruptionError: 6,
    IllegalTransition: 6,
    StoreError: 7,
    LedgerClosedError: 7,
    WaitTimeout: 9,
    DecisionPoolError: 3,
    LifecycleError: 1,
}


def test_the_documented_codes_are_the_contract() -> None:
    """0 to 12 and 130 (Ctrl-C), each with a description."""
    assert sorted(EXIT_CODES) == [int(c) for c in ExitCode] == [*range(13), 130]
    assert all(EXIT_CODES[c].strip() for c in EXIT_CODES)


@pytest.mark.parametrize("cls", list(ERROR_EXAMPLES), ids=lambda c: c.__name__)
def test_every_error_class_maps_to_its_documented_code(cls: type[LifecycleError]) -> None:
    """Each error class (test_errors proves the examples cover them all) ends in its documented code."""
    code = exit_code_for(ERROR_EXAMPLES[cls])
    assert code in EXIT_CODES
    assert code == EXPECTED[cls]


def test_no_row_is_shadowed_by_an_earlier_one() -> None:
    """Most specific class first: a row below one of its base classes could never match."""
    classes = [cls for cls, _ in ERROR_EXIT_CODES]
    shadowed = [
        (later, earlier) for i, later in enumerate(classes) for earlier in classes[:i] if issubclass(later, earlier)
    ]
    assert shadowed == []
    assert classes[-1] is LifecycleError


@pytest.fixture
def raising() -> Iterator[str]:
    """A throwaway `lifecycle raise NAME` command that raises the example error of that class."""

    @click.command("raise-for-test")
    @click.argument("name")
    def raise_for_test(name: str) -> None:
        raise next(e for c, e in ERROR_EXAMPLES.items() if c.__name__ == name)

    main.add_command(raise_for_test)
    try:
        yield "raise-for-test"
    finally:
        del main.commands["raise-for-test"]


@pytest.mark.parametrize("cls", list(ERROR_EXAMPLES), ids=lambda c: c.__name__)
def test_cli_exits_with_the_mapped_code_and_one_error_line(raising: str, cls: type[LifecycleError]) -> None:
    """Through the group: one `Error: <message>` line on stderr, nothing on stdout, the mapped exit code."""
    result = CliRunner().invoke(main, [raising, cls.__name__], catch_exceptions=False)
    assert (result.exit_code, result.stdout) == (EXPECTED[cls], "")
    assert result.stderr == f"Error: {ERROR_EXAMPLES[cls]}\n"


@pytest.mark.parametrize(
    ("args", "path", "commands"),
    [
        ([], "lifecycle", "attest, audit, baseline"),
        (["decisions"], "lifecycle decisions", "export, replay"),
        (["attest"], "lifecycle attest", "create, verify"),
        (["key"], "lifecycle key", "new"),
        (["baseline"], "lifecycle baseline", "activate"),
        (["evaluation"], "lifecycle evaluation", "activate"),
    ],
    ids=["lifecycle", "decisions", "attest", "key", "baseline", "evaluation"],
)
def test_a_group_without_its_command_is_one_readable_error_line(args: list[str], path: str, commands: str) -> None:
    """`lifecycle` or `lifecycle decisions` alone printed the whole help as one line, its newlines spelled `\\n`
    ("Error: Usage: lifecycle [OPTIONS] COMMAND [ARGS]...\\n\\n  An event-sourced ledger ..."): unreadable. It is
    one line naming the commands there are and where the help is, exit 2 (a usage error)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", *args], capture_output=True, text=True, timeout=60, check=False
    )
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr.count("\n") == 1 and "\\n" not in done.stderr, done.stderr
    assert done.stderr.startswith("Error: missing command: one of ") and commands in done.stderr
    assert done.stderr.rstrip().endswith(f"(see `{path} --help`)")
