"""The docs site's code examples, run by pytest (collected through conftest.py at the top).

Each page of docs/ runs top to bottom in a folder of its own that looks like a fresh
checkout after the README's first command: a copy of `examples/` and `scenarios/`, and
`.venv` pointing at the interpreter running the tests (so `source .venv/bin/activate`
works). A page's first example starts in that folder.

- A ```python block runs in the page's namespace, in the page's current folder.
- A ```bash block runs in a real `bash` with `set -e -o pipefail`, `lifecycle` and
  `python` on the PATH; it must exit 0 (an example that shows a failing command says
  `|| echo …`). A `cd` carries over to the page's next example.
- `<!-- invisible-code-block: bash … -->` runs without being shown (a page's set-up);
  `<!-- skip: next -->` before a block leaves it out (a command that needs a remote
  server or a GPU); other languages (text, yaml, sql, json) are never run.

Prose is not asserted.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from sybil import Example, Sybil
from sybil.parsers.markdown import CodeBlockParser, PythonCodeBlockParser, SkipParser

REPO = Path(__file__).resolve().parent.parent
TIMEOUT = 300


def _setup(namespace: dict[str, Any]) -> None:
    """A fresh checkout-like folder, the page's current folder."""
    root = Path(tempfile.mkdtemp(prefix="lifecycle-docs-"))
    for folder in ("examples", "scenarios"):
        shutil.copytree(REPO / folder, root / folder, ignore=shutil.ignore_patterns("__pycache__"))
    (root / ".venv").symlink_to(sys.prefix, target_is_directory=True)
    namespace["_docs_root"], namespace["_docs_back"] = root, os.getcwd()
    os.chdir(root)


def _teardown(namespace: dict[str, Any]) -> None:
    os.chdir(namespace["_docs_back"])
    shutil.rmtree(namespace["_docs_root"], ignore_errors=True)


def _environment(cwd_file: Path) -> dict[str, str]:
    """The user's environment without the ledger's variables, this interpreter's bin first on the PATH."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")}
    return env | {
        "PATH": str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", ""),
        "LIFECYCLE_LOG_LEVEL": "error",
        "DOCS_CWD_FILE": str(cwd_file),
    }


def run_shell(example: Example) -> str | None:
    """Run a bash block as a user would paste it; the folder it ends in is the page's next one."""
    cwd_file = Path(example.namespace["_docs_root"]) / ".docs-cwd"
    script = "set -e -o pipefail\ntrap 'pwd > \"$DOCS_CWD_FILE\"' EXIT\n" + str(example.parsed)
    done = subprocess.run(
        ["bash", "-c", script],
        env=_environment(cwd_file),
        capture_output=True,
        text=True,
        check=False,
        timeout=TIMEOUT,
    )
    if cwd_file.is_file():
        os.chdir(cwd_file.read_text().strip())
    if done.returncode != 0 or "Traceback" in done.stderr:
        return (
            f"{example.path}:{example.line}: exit {done.returncode}\n--- stdout\n{done.stdout}--- stderr\n{done.stderr}"
        )
    return None


DOCS = Sybil(
    parsers=[PythonCodeBlockParser(), CodeBlockParser(language="bash", evaluator=run_shell), SkipParser()],
    patterns=["*.md"],
    path=str(REPO / "docs"),
    setup=_setup,
    teardown=_teardown,
    name="docs",
)
