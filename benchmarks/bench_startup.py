"""startup: `lifecycle status` as a whole process against `sqlite-utils tables FILE`.

Both are click CLIs on the same interpreter reading a small ledger file (10 candidates);
each round runs each command several times, in turn. Wall time is the point (what a
user waits for); the CPU of the child processes is given beside it, as it is steadier
on a busy machine. Bytecode is cached for both, as an installed CLI's is.

Both commands are taken from the venv named by LIFECYCLE_BENCH_VENV when it is set: a lean
one (`pip install -e .`, no extras) measures the CLI as a user installs it (in the dev venv
sqlite-utils' own start-up carries plugins and extras, and the ratio means little).
"""

from __future__ import annotations

import os
import resource
import subprocess
import time
from pathlib import Path

from bench_common import Row, Settings, interleaved, new_ledger, per_round, script, sized, spread

VENV = os.environ.get("LIFECYCLE_BENCH_VENV")


def _command(name: str) -> str:
    """The console script in LIFECYCLE_BENCH_VENV's bin/, else beside this interpreter."""
    if not VENV:
        return script(name)
    found = Path(VENV, "bin", name)
    if not found.exists():
        raise RuntimeError(f"{name} is not installed in LIFECYCLE_BENCH_VENV={VENV}")
    return str(found)


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def run(s: Settings) -> list[Row]:
    folder = s.workdir / "startup"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "ledger.db"
    new_ledger(db, s.ws, "NORMAL", 10).close()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    argv = {
        "status": [_command("lifecycle"), "--db", str(db), "status"],
        "sqlite_utils": [_command("sqlite-utils"), "tables", str(db)],
    }
    for args in argv.values():  # bytecode written, page cache warm; a broken command fails here
        subprocess.run(args, check=True, capture_output=True, env=env)
    runs = sized(20, s, least=1)
    cpu: dict[str, list[float]] = {name: [] for name in argv}

    def timed(name: str) -> float:
        c0, t0 = _children_cpu(), time.perf_counter()
        for _ in range(runs):
            subprocess.run(argv[name], check=True, stdout=subprocess.DEVNULL, env=env)
        cpu[name].append((_children_cpu() - c0) / runs)
        return (time.perf_counter() - t0) / runs

    wall = interleaved({name: (lambda name=name: timed(name)) for name in argv}, s)
    cpu = {name: values[-len(wall[name]) :] for name, values in cpu.items()}  # the warm-up's dropped too
    return [
        Row(
            "startup.status",
            "`lifecycle status` / `sqlite-utils tables FILE`, whole process",
            "wall",
            per_round(wall["status"], wall["sqlite_utils"]),
            ("<=", 1.0),
            f"status {spread(wall['status'], 'ms', 1e3)}, sqlite-utils {spread(wall['sqlite_utils'], 'ms', 1e3)}",
        ),
        Row(
            "startup.status_cpu",
            "the same, CPU of the child processes",
            "CPU",
            per_round(cpu["status"], cpu["sqlite_utils"]),
            None,
            f"status {spread(cpu['status'], 'ms', 1e3)}, sqlite-utils {spread(cpu['sqlite_utils'], 'ms', 1e3)}",
        ),
    ]
