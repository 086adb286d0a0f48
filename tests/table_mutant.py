"""Run the simulator against a ledger whose transition table has one row changed.

    python tests/table_mutant.py '{"row": 15, "drop": "tune"}' [SEEDS [STEPS [CANDIDATES]]]
    python tests/table_mutant.py '{"row": 4, "dest": null}'

Row 15 is `invalidate_evidence`: dropping `tune` from it is the broken invalidation the simulator must find.

The child executes `lifecycle_fsm/machine.py` itself with `MOVES` replaced right after it is
defined, before the package (or anything else) imports the module, so every table derived from
it (the live machine, the replay table, the command checks) is the mutant's: the real simulator
runs against the real ledger. It prints one JSON line: the first failure (seed and step) or none.
"""

from __future__ import annotations

import ast
import importlib.util
import json
import sys
from pathlib import Path
from typing import Any

MODULE = "lifecycle_fsm.machine"


def mutated(moves: tuple[Any, ...], state: Any, change: dict[str, Any]) -> tuple[Any, ...]:
    """`moves` with row `change["row"]` missing one source state, or leading elsewhere."""
    rows = list(moves)
    row = rows[change["row"]]
    if "drop" in change:
        rows[change["row"]] = row._replace(sources=tuple(s for s in row.sources if s != change["drop"]))
    else:
        rows[change["row"]] = row._replace(dest=None if change["dest"] is None else state(change["dest"]))
    return tuple(rows)


def _assigned(node: ast.stmt) -> list[str]:
    targets = node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
    return [t.id for t in targets if isinstance(t, ast.Name)]


def install(change: dict[str, Any]) -> None:
    """Load the machine module with its table mutated, before the package (which imports it) is loaded."""
    spec = importlib.util.find_spec("lifecycle_fsm")  # finds the package without running it
    assert spec is not None and spec.submodule_search_locations
    if MODULE in sys.modules:
        raise SystemExit(f"{MODULE} is imported already: cannot mutate its table first")
    path = Path(spec.submodule_search_locations[0]) / "machine.py"
    tree = ast.parse(path.read_text(), str(path))
    at = next(i for i, node in enumerate(tree.body) if "MOVES" in _assigned(node))
    tree.body.insert(at + 1, ast.parse("MOVES = __mutated__(MOVES, State, __change__)").body[0])
    machine = importlib.util.spec_from_file_location(MODULE, path)
    assert machine is not None
    module = importlib.util.module_from_spec(machine)
    module.__dict__.update(__mutated__=mutated, __change__=change)
    sys.modules[MODULE] = module
    exec(compile(ast.fix_missing_locations(tree), str(path), "exec"), module.__dict__)
    import lifecycle_fsm

    lifecycle_fsm.machine = module  # type: ignore[attr-defined]


def main(argv: list[str]) -> int:
    change = json.loads(argv[0])
    seeds, steps, candidates = (int(a) for a in [*argv[1:], "5", "300", "6"][:3])
    install(change)
    from lifecycle_fsm.logs import configure_logging
    from lifecycle_fsm.replay.drills.schedule import generate
    from lifecycle_fsm.replay.drills.simulate import simulate

    configure_logging("error")  # the faults' warnings are expected
    for seed in range(1, seeds + 1):
        result = simulate(generate(seed, steps, candidates))
        if result.failure is not None:
            problems = [list(map(str, p)) for p in result.failure.problems]
            print(json.dumps({"seed": seed, "step": result.failure.step, "problems": problems}))
            return 0
    print(json.dumps(None))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
