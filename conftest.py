"""pytest also collects the code examples of the docs site's pages (tests/doc_examples.py runs them).

The tests' files (tmp_path, and every temporary folder a command or a child process makes) go
to /dev/shm when TMPDIR is not set: the code under test still fsyncs every write, but a memory
file system makes each fsync free instead of a wait on a shared disk. `TMPDIR=/tmp pytest`
runs them on the disk.

The session also writes bytecode caches (the gitignored __pycache__ folders) even when
PYTHONDONTWRITEBYTECODE is set: the suite starts hundreds of interpreters (`python -m
lifecycle_fsm`, crash children, examples), and without caches each one compiles the package
again and each xdist worker rewrites every test module's asserts again.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest

from tests.doc_examples import DOCS

pytest_collect_file = DOCS.pytest()

MEMORY = Path("/dev/shm")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Point TMPDIR at /dev/shm unless it is set, and let bytecode be written (both inherited by
    xdist's workers and every subprocess)."""
    if "TMPDIR" not in os.environ and MEMORY.is_dir() and os.access(MEMORY, os.W_OK | os.X_OK):
        os.environ["TMPDIR"] = str(MEMORY)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
    # Before xdist starts its workers: they and every subprocess inherit the environment.
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
    sys.dont_write_bytecode = False


# One work unit (one worker) for the trainer tests: only the worker that runs them imports the training
# stack (seconds of start-up; tests/trainer/support.py looks it up without importing it).
TRAINER = "tests/trainer/"


def _unit(nodeid: str) -> str:
    """The work unit xdist hands to one worker: a file, or all of tests/trainer."""
    path = nodeid.split("::", 1)[0]
    return TRAINER if path.startswith(TRAINER) else path


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Units holding a test marked `slow` first, then docs pages (each runs real shells), then the other
    files, most tests first; a unit's own order is kept. xdist (--dist=loadfile with pyproject's
    --no-loadscope-reorder) hands units out in this order as workers free up: a long one handed out
    last would run alone while the other worker idles."""
    units: dict[str, list[pytest.Item]] = {}
    for item in items:
        units.setdefault(_unit(item.nodeid), []).append(item)

    def rank(entry: tuple[str, list[pytest.Item]]) -> tuple[int, int]:
        unit, tests = entry
        slow = any(test.get_closest_marker("slow") for test in tests)
        return (0 if slow else 1 if unit.startswith("docs/") else 2, -len(tests))

    items[:] = [item for _, tests in sorted(units.items(), key=rank) for item in tests]


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config: pytest.Config, log: Any) -> Any:
    """--dist=loadfile with `_unit`'s units instead of files (any other --dist: xdist's own)."""
    if config.getoption("dist") != "loadfile":
        return None
    from xdist.scheduler import LoadFileScheduling

    class UnitScheduling(LoadFileScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return _unit(nodeid)

    return UnitScheduling(config, log)
