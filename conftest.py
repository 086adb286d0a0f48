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


@pytest.hookimpl(trylast=True)
def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Files holding a test marked `slow` first, then docs pages (each runs real shells), then the other
    files, most tests first; a file's own order is kept. xdist (--dist=loadfile with pyproject's
    --no-loadscope-reorder) hands files out in this order as workers free up: a long file handed out
    last would run alone while the other worker idles."""
    files: dict[str, list[pytest.Item]] = {}
    for item in items:
        files.setdefault(item.nodeid.split("::", 1)[0], []).append(item)

    def rank(entry: tuple[str, list[pytest.Item]]) -> tuple[int, int]:
        path, tests = entry
        slow = any(test.get_closest_marker("slow") for test in tests)
        return (0 if slow else 1 if path.startswith("docs/") else 2, -len(tests))

    items[:] = [item for _, tests in sorted(files.items(), key=rank) for item in tests]
