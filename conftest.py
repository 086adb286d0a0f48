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
