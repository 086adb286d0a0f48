"""CLI start-up: whole processes, timed from `fork` to exit, against the interpreter floor.

Contenders, each a fresh process per run, many runs per round, interleaved:
- `lifecycle --db F status ID` (the installed console script: imports the CLI, opens
  the ledger file, folds one candidate's 2 events, prints a table);
- the same with `--json`;
- `python -c "import lifecycle_fsm"` (the library import alone; target <= 2x the floor,
  issue #12: the package's public names load on first use);
- the floor: `python -c "import sqlite3"` (interpreter start, site, one C extension).

All run with the same interpreter (this virtualenv's), so `site` and the `.pth` files of
the editable install are paid by every contender alike: the ratio is our imports and
our work. Each figure is the CPU time (user + system) of the child processes, from
`getrusage(RUSAGE_CHILDREN)`: on a machine whose load is several times its core count,
wall time is mostly waiting for a core.

Bytecode is cached, as an installed CLI's is (`_child_env`); info row: the same command in
the environment as given (with `PYTHONDONTWRITEBYTECODE=1` and an editable tree, our
sources compiled on every run: how this benchmark measured before 2026-12-01's third round).

Info rows since 2026-12-02: `status ID` of a candidate that has a checkpoint copy (a second
ledger file, the same events plus `take_checkpoint`: the read judges the copy, imports
`snapshots`); and, when valgrind is installed, the instructions each process executes
(callgrind, `PYTHONHASHSEED=0`, bytecode cached): the same ratio without the machine's load,
so two runs on a busy machine can be compared.
"""

from __future__ import annotations

import os
import re
import resource
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench_append import cid_of, seed_candidates
from bench_common import Row, fmt_spread, interleaved, median, per_round_ratio, remove_db, summary

from lifecycle_fsm.ledger import Ledger, utc_now
from lifecycle_fsm.replay import take_checkpoint


def _cli() -> list[str]:
    script = Path(sys.executable).with_name("lifecycle")
    return [str(script)] if script.exists() else [sys.executable, "-m", "lifecycle_fsm"]


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _child_env(folder: Path, *, bytecode: bool = True) -> dict[str, str]:
    """The children's environment: bytecode read from (and written to) the work folder.

    A pip-installed wheel has its `.pyc` files; an editable tree has none until a run
    writes them, and under `PYTHONDONTWRITEBYTECODE=1` (set in some shells and CI) no
    run ever does, so every `status` would compile our ~20 modules from source (~30% of
    the process), which no installed CLI does. `PYTHONPYCACHEPREFIX` keeps the source
    trees untouched; every contender, the floor too, reads its bytecode from there after
    the warm-up run. `bytecode=False`: the environment as given (the info row).
    """
    if not bytecode:
        return dict(os.environ)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env["PYTHONPYCACHEPREFIX"] = str(folder / "pycache")
    return env


def _timed(argv: list[str], runs: int, env: dict[str, str]) -> float:
    t0 = _children_cpu()
    for _ in range(runs):
        subprocess.run(argv, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return (_children_cpu() - t0) / runs


def _ledger(db: Path, *, checkpoint: bool) -> None:
    """100 candidates; the probe (`cid_of(7)`) has 2 events. `checkpoint`: then a checkpoint at the head."""
    remove_db(db)
    with Ledger.open(db, synchronous="NORMAL") as ledger:
        seed_candidates(ledger.store, [cid_of(i) for i in range(100)])
        state = db.parent / "prompt_queue.jsonl"
        state.write_text('{"prompt_id": "p-0001"}\n')
        ledger.record_trusted_state(cid_of(7), "prompt_queue", str(state))
        if checkpoint:
            take_checkpoint(ledger.store, clock=utc_now)


def run(workdir: Path, rounds: int, quick: bool) -> tuple[list[Row], dict[str, Any]]:
    folder = workdir / "startup"
    folder.mkdir(parents=True, exist_ok=True)
    db = folder / "ledger.db"
    _ledger(db, checkpoint=False)
    checkpointed = folder / "ledger-checkpointed.db"
    _ledger(checkpointed, checkpoint=True)
    cli = _cli()
    runs = 5 if quick else 10
    argv = {
        "status": [*cli, "--db", str(db), "status", cid_of(7)],
        "status_json": [*cli, "--db", str(db), "--json", "status", cid_of(7)],
        "status_checkpointed": [*cli, "--db", str(checkpointed), "status", cid_of(7)],
        "import": [sys.executable, "-c", "import lifecycle_fsm"],
        "floor": [sys.executable, "-c", "import sqlite3"],
        "status_as_given": [*cli, "--db", str(db), "status", cid_of(7)],
    }
    env = {k: _child_env(folder, bytecode=k != "status_as_given") for k in argv}
    for k, args in argv.items():  # warm the page cache and the bytecode; a broken command fails here, loudly
        subprocess.run(args, check=True, capture_output=True, env=env[k])
    times = interleaved({k: (lambda k=k, a=a: _timed(a, runs, env[k])) for k, a in argv.items()}, rounds)
    ratios = {k: per_round_ratio(times[k], times["floor"]) for k in argv if k != "floor"}
    ms = {k: fmt_spread([x * 1e3 for x in v], 1) for k, v in times.items()}
    rows = [
        Row("startup", "whole-process `lifecycle status ID` / `python -c 'import sqlite3'`", "<= 2.5x",
            f"status {ms['status']} ms, floor {ms['floor']} ms", median(ratios["status"]),
            median(ratios["status"]) <= 2.5),
        Row("startup", "whole-process `lifecycle --json status ID` / floor (info)", "-",
            f"{ms['status_json']} ms", median(ratios["status_json"])),
        Row("startup", "whole-process `lifecycle status ID`, a candidate with a checkpoint copy / floor (info)", "-",
            f"{ms['status_checkpointed']} ms", median(ratios["status_checkpointed"])),
        Row("startup", "`python -c 'import lifecycle_fsm'` / floor", "<= 2x", f"{ms['import']} ms",
            median(ratios["import"]), median(ratios["import"]) <= 2.0),
        Row("startup", "`lifecycle status ID`, the environment's own bytecode setting / floor (info)", "-",
            f"{ms['status_as_given']} ms", median(ratios["status_as_given"])),
    ]  # fmt: skip
    counted = _instructions({k: argv[k] for k in ("floor", "status", "status_checkpointed")}, env["status"])
    if counted:
        rows.append(Row("startup", "instructions (callgrind): `lifecycle status ID` / floor (info)", "-",
                        f"status {counted['status'] / 1e6:.0f}M, with a checkpoint copy "
                        f"{counted['status_checkpointed'] / 1e6:.0f}M, floor {counted['floor'] / 1e6:.0f}M",
                        counted["status"] / counted["floor"]))  # fmt: skip
    detail = {
        "argv": {k: [Path(a).name if a.startswith("/") else a for a in v] for k, v in argv.items()},
        "runs_per_round": runs,
        "clock": "CPU time (user + system) of the child processes",
        "bytecode": "cached in PYTHONPYCACHEPREFIX under the work folder (status_as_given: the environment as given)",
        "environment_dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE"),
        "ms": {k: summary(v, 1e3, 1) for k, v in times.items()},
        "ratios": {k: summary(v) for k, v in ratios.items()},
        "interpreter": _in_checkout(sys.executable),
        "cli": _in_checkout(shutil.which("lifecycle")),
        "instructions": counted,
    }
    return rows, detail


def _instructions(argv: dict[str, list[str]], env: dict[str, str]) -> dict[str, int]:
    """Instructions each process executes under callgrind (deterministic; {} without valgrind)."""
    valgrind = shutil.which("valgrind")
    if valgrind is None:
        return {}
    counted = {}
    for name, args in argv.items():
        done = subprocess.run(
            [valgrind, "--tool=callgrind", "--callgrind-out-file=/dev/null", *args],
            capture_output=True, text=True, check=True, env={**env, "PYTHONHASHSEED": "0"},
        )  # fmt: skip
        found = re.search(r"Collected : (\d+)", done.stderr)
        if found is None:
            return {}
        counted[name] = int(found.group(1))
    return counted


def _in_checkout(path: str | None) -> str | None:
    """A path inside this checkout relative to it: result files name no machine's folders."""
    if path is None:
        return None
    root = Path(__file__).resolve().parents[1]
    absolute = Path(path).absolute()
    return str(absolute.relative_to(root)) if absolute.is_relative_to(root) else path
