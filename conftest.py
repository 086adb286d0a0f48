"""pytest also collects the code examples of the docs site's pages (tests/doc_examples.py runs them).

The tests' files (tmp_path, and every temporary folder a command or a child process makes) go
to /dev/shm when TMPDIR is not set: the code under test still fsyncs every write, but a memory
file system makes each fsync free instead of a wait on a shared disk. `TMPDIR=/tmp pytest`
runs them on the disk.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

from tests.doc_examples import DOCS

pytest_collect_file = DOCS.pytest()

MEMORY = Path("/dev/shm")


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    """Point TMPDIR at /dev/shm (inherited by xdist's workers and every subprocess) unless it is set."""
    if "TMPDIR" not in os.environ and MEMORY.is_dir() and os.access(MEMORY, os.W_OK | os.X_OK):
        os.environ["TMPDIR"] = str(MEMORY)
        tempfile.tempdir = None  # gettempdir() reads TMPDIR again
