"""The `lifecycle_fsm.cli` package: every command module wired into the group, small modules, both entry points."""

from __future__ import annotations

import importlib
import pkgutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import click
import pytest
from conftest import REPO

from lifecycle_fsm.cli import main
from lifecycle_fsm.cli.drill import _default_scenarios

CLI = REPO / "lifecycle_fsm" / "cli"


def _reachable(group: click.Group) -> Iterator[click.Command]:
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        assert command is not None, name  # a name in the table that leads nowhere
        yield command
        if isinstance(command, click.Group):
            yield from _reachable(command)


def test_every_command_defined_in_the_package_is_added_to_the_group() -> None:
    """A command module's commands are all reachable from `lifecycle` (a forgotten `add_command` fails here)."""
    reachable = list(_reachable(main))
    defined = [
        (f"{info.name}.{name}", value)
        for info in pkgutil.iter_modules([str(CLI)])
        if info.name != "__main__"  # importing it runs the CLI
        for name, value in vars(importlib.import_module(f"lifecycle_fsm.cli.{info.name}")).items()
        if isinstance(value, click.Command) and value is not main
    ]
    assert len(defined) >= len(main.list_commands(click.Context(main)))
    assert [name for name, command in defined if not any(command is c for c in reachable)] == []


LINKS = (REPO / "lifecycle_fsm" / "store", REPO / "lifecycle_fsm" / "replay")  # links to store/ and replay/
MODULES = sorted(
    path
    for folder in ("lifecycle_fsm", "store", "replay")
    for path in (REPO / folder).rglob("*.py")
    if not any(path.is_relative_to(link) for link in LINKS)
)


@pytest.mark.parametrize("path", MODULES, ids=lambda p: p.relative_to(REPO).as_posix())
def test_modules_stay_small(path: Path) -> None:
    """One concern per module, at most 400 lines: a new concern (a command group, a backend) gets a new module."""
    assert len(path.read_text(encoding="utf-8").splitlines()) <= 400


def test_drill_defaults_to_the_shipped_scenarios(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Without PATHS and without ./scenarios, `drill` finds the project's own scenarios from lifecycle_fsm/cli/."""
    monkeypatch.chdir(tmp_path)
    assert _default_scenarios() == REPO / "scenarios"
    (tmp_path / "scenarios").mkdir()
    assert _default_scenarios() == Path("scenarios")


@pytest.mark.parametrize("module", ["lifecycle_fsm", "lifecycle_fsm.cli"])
def test_python_dash_m_runs_the_cli(module: str) -> None:
    """`python -m lifecycle_fsm` (and `-m lifecycle_fsm.cli`) is the `lifecycle` command."""
    done = subprocess.run([sys.executable, "-m", module, "--help"], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("Usage: lifecycle ") and "Exit codes:" in done.stdout


def test_ctrl_c_while_the_command_line_loads_is_an_interrupt_not_a_traceback() -> None:
    """Ctrl-C lands while the script imports the commands' modules (made certain here: the import of
    the CLI's group raises it): one `Error: interrupted` line and exit 130, as mid-command."""
    code = (
        "import sys\n"
        "class CtrlC:\n"
        "    def find_spec(self, name, path=None, target=None):\n"
        "        if name == 'lifecycle_fsm.cli.app':\n"
        "            raise KeyboardInterrupt\n"
        "sys.meta_path.insert(0, CtrlC())\n"
        "from lifecycle_fsm.cli import run\n"
        "run()\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert (done.returncode, done.stderr, done.stdout) == (130, "Error: interrupted\n", "")
