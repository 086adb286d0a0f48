"""README's "A tour" runs as written: every line, in order, as real processes, in a fresh folder.

The code block right after `## A tour` is parsed line by line (comments dropped, `&&`
splitting a line into commands) and each command runs as a user's shell would run it:
its first line activates the venv the README's first command made (here: this
interpreter's), `python` is this interpreter, `lifecycle` is `python -m lifecycle_fsm`
from it, and `cd` moves the following commands into a folder. The temporary folder stands in for the
checkout the tour starts from, holding only a copy of `examples/`. Every command must
exit 0 (none in the tour is documented to exit otherwise), so the tour cannot drift
from the tool: a renamed command, option, path or candidate id fails here.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import REPO


def tour_lines() -> list[str]:
    """The lines of the first ```bash block after `## A tour` in README.md."""
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    section = readme[readme.index("\n## A tour\n") :]
    match = re.search(r"```bash\n(.*?)```", section, re.S)
    assert match is not None, "the tour's code block must follow its heading"
    return [line for line in match.group(1).splitlines() if line.strip()]


def commands(line: str) -> list[list[str]]:
    """A line's commands: shell words without the comment, split at `&&`."""
    words = shlex.split(line, comments=True)
    assert not {"|", ";", ">", "<", "||"} & set(words) and not any("$" in w for w in words), line
    parts: list[list[str]] = [[]]
    for word in words:
        if word == "&&":
            parts.append([])
        else:
            parts[-1].append(word)
    assert all(parts), line
    return parts


@pytest.mark.slow
def test_every_line_of_the_tour_runs(tmp_path: Path) -> None:
    activate, *lines = tour_lines()
    assert activate == "source .venv/bin/activate"  # after the first command, `lifecycle` is on the PATH
    assert lines[0].startswith("python examples/make_fixtures.py --tour ")  # the tour makes its own files
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("LIFECYCLE_")} | {"LIFECYCLE_LOG_LEVEL": "error"}
    cwd, outputs = tmp_path, {}
    for line in lines:
        for argv in commands(line):
            program, *args = argv
            if program == "cd":
                assert len(args) == 1, line
                cwd = cwd / args[0]
                assert cwd.is_dir(), line
                continue
            assert program in ("python", "lifecycle"), line
            full = [sys.executable, *args] if program == "python" else [sys.executable, "-m", "lifecycle_fsm", *args]
            done = subprocess.run(full, cwd=cwd, env=env, capture_output=True, text=True, check=False, timeout=300)
            assert done.returncode == 0, f"{line!r} exited {done.returncode}:\n{done.stdout}\n{done.stderr}"
            assert "Traceback" not in done.stderr, line
            outputs[shlex.join(argv)] = done.stdout

    tour = tmp_path / "tour"
    assert cwd == tour and (tour / "lifecycle.db").is_file()
    # What the comments promise.
    assert "state ready" in outputs["lifecycle handoff dpo-v5"]
    planned = outputs["lifecycle fail grpo-v7 --stage reward"]
    assert "-> resume_reward_from_saved_trajectories (reuse trajectories)" in planned
    assert "state received" in outputs["lifecycle recovered grpo-v7"]
    explained = json.loads(outputs["lifecycle explain dpo-v5 --json"])
    assert (explained["id"], explained["state"], explained["reason_codes"]) == ("dpo-v5", "ready", [])
    sft = json.loads((tour / "sft" / "manifest.json").read_text())
    assert outputs["lifecycle hash sft/adapter"].split()[0] == sft["artifacts"]["adapter"]["sha256"]
    status = subprocess.run(
        [sys.executable, "-m", "lifecycle_fsm", "status", "--json"],
        cwd=tour,
        env=env,
        capture_output=True,
        text=True,
        check=True,
        timeout=120,
    )
    assert {c["id"]: c["state"] for c in json.loads(status.stdout)} == {"dpo-v5": "ready", "grpo-v7": "received"}


def test_the_tour_fixtures_refuse_a_folder_in_use(tmp_path: Path) -> None:
    """`--tour` into a folder that already holds files (an earlier tour's ledger): usage error, nothing written."""
    (tmp_path / "tour").mkdir()
    (tmp_path / "tour" / "lifecycle.db").write_bytes(b"")
    done = subprocess.run(
        [sys.executable, str(REPO / "examples" / "make_fixtures.py"), "--tour", "tour"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )
    assert done.returncode == 2 and "not an empty folder" in done.stderr
    assert [p.name for p in (tmp_path / "tour").iterdir()] == ["lifecycle.db"]
