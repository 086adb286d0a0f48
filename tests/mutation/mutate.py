"""A small mutation check: does the suite notice when a guarantee is broken?

    python tests/mutation/mutate.py [--target NAME ...] [--limit N] [--json FILE]

For each target (a module, the functions in it that carry a guarantee, and the tests
that should defend them) the script walks the functions' syntax tree and makes one
mutant per site: a comparison flipped (`==` <-> `!=`, `<` <-> `>=`, `in` <-> `not in`),
`and` <-> `or`, a boolean constant inverted, a `not` dropped, a statement that
raises, asserts or calls something deleted (replaced by `pass`). Each mutant is
written into a scratch copy of the repository and the target's tests run against it
(`-x`, no coverage); a failing run kills the mutant. Surviving mutants are listed
with their line: each is either a missing test or an equivalent mutant (say which).

Not part of the CI run (a few minutes on 2 cores); run it when changing a guarantee.
"""

from __future__ import annotations

import argparse
import ast
import json
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    name: str
    module: str  # path from the repository root
    functions: tuple[str, ...]  # "Class.method" or "function"
    tests: tuple[str, ...]


TARGETS = (
    Target(
        "chain",
        "store/chain.py",
        ("verify_events", "match_retry", "chain_rows", "canonical_json"),
        ("tests/test_store_chain.py", "tests/test_chain_format.py", "tests/test_store_contract.py"),
    ),
    Target(
        "command_path",
        "lifecycle_fsm/command_path.py",
        (
            "CommandPath.run",
            "CommandPath._append",
            "CommandPath._fan_out",
            "CommandPath._replayed",
            "require_command",
            "state_after",
        ),
        ("tests/test_command_path.py", "tests/test_ledger.py"),
    ),
    Target(
        "fold",
        "lifecycle_fsm/state.py",
        ("step_candidate_at", "_candidate_step", "kept_payload", "apply_settings"),
        ("tests/test_state.py", "tests/test_replay_corruption.py"),
    ),
    Target(
        "decisions",
        "lifecycle_fsm/decisions.py",
        (
            "receive",
            "init",
            "activate_baseline",
            "advance_window",
            "activate_evaluation",
            "_with_defaults",
            "invalidate_trusted_state",
            "fail_stage",
        ),
        ("tests/test_decisions.py", "tests/test_ledger.py"),
    ),
    Target(
        "rules",
        "lifecycle_fsm/rules.py",
        ("check_candidate_freshness", "choose_recovery_action", "decide_lifecycle_handoff", "_age_within"),
        ("tests/test_rules.py",),
    ),
    Target(
        "snapshots",
        "lifecycle_fsm/snapshots.py",
        ("snapshot_problem",),
        ("tests/test_checkpoints.py", "tests/test_stream_snapshots.py"),
    ),
)

_FLIP = {
    ast.Eq: ast.NotEq,
    ast.NotEq: ast.Eq,
    ast.Lt: ast.GtE,
    ast.GtE: ast.Lt,
    ast.Gt: ast.LtE,
    ast.LtE: ast.Gt,
    ast.In: ast.NotIn,
    ast.NotIn: ast.In,
    ast.Is: ast.IsNot,
    ast.IsNot: ast.Is,
}


@dataclass(frozen=True)
class Mutant:
    target: str
    line: int
    what: str
    source: str


def _functions(tree: ast.Module, wanted: tuple[str, ...]) -> Iterator[ast.FunctionDef]:
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            yield node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and f"{node.name}.{item.name}" in wanted:
                    yield item


def _sites(func: ast.FunctionDef) -> Iterator[tuple[ast.AST, str]]:
    """Every node a mutant can change, with a description of the change."""
    for node in ast.walk(func):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    yield node, f"compare:{i}:{type(op).__name__}->{_FLIP[type(op)].__name__}"
        elif isinstance(node, ast.BoolOp):
            yield node, f"boolop:{type(node.op).__name__}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "drop-not"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, f"const:{node.value}->{not node.value}"
        elif isinstance(node, (ast.Raise, ast.Assert)) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        ):
            yield node, f"delete:{type(node).__name__}"


class _Apply(ast.NodeTransformer):
    """Apply one mutation to the node at `index` in walk order of the whole module."""

    def __init__(self, target: ast.AST, what: str) -> None:
        self.target, self.what = target, what

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        kind = self.what.split(":")[0]
        if kind == "compare":
            assert isinstance(node, ast.Compare)
            i = int(self.what.split(":")[1])
            node.ops[i] = _FLIP[type(node.ops[i])]()
        elif kind == "boolop":
            assert isinstance(node, ast.BoolOp)
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "drop-not":
            assert isinstance(node, ast.UnaryOp)
            return node.operand
        elif kind == "const":
            assert isinstance(node, ast.Constant)
            node.value = not node.value
        elif kind == "delete":
            return ast.copy_location(ast.Pass(), node)
        return node


def mutants(target: Target) -> Iterator[Mutant]:
    text = (REPO / target.module).read_text()
    count = sum(1 for f in _functions(ast.parse(text), target.functions) for _ in _sites(f))
    for index in range(count):
        tree = ast.parse(text)  # a fresh tree per mutant: the transformer changes it in place
        sites = [s for f in _functions(tree, target.functions) for s in _sites(f)]
        node, what = sites[index]
        line = getattr(node, "lineno", 0)
        mutated = ast.unparse(ast.fix_missing_locations(_Apply(node, what).visit(tree)))
        yield Mutant(target.name, line, what, mutated)


def run(targets: list[Target], limit: int | None, timeout: float) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        copy = Path(scratch) / "repo"
        shutil.copytree(REPO, copy, ignore=shutil.ignore_patterns(".venv", ".git", "*.db", "__pycache__", ".*cache"))
        for target in targets:
            original = (copy / target.module).read_text()
            for n, mutant in enumerate(mutants(target)):
                if limit is not None and n >= limit:
                    break
                (copy / target.module).write_text(mutant.source)
                started = time.monotonic()
                try:
                    done = subprocess.run(
                        [
                            sys.executable,
                            "-m",
                            "pytest",
                            "-x",
                            "-q",
                            "--no-cov",
                            "-p",
                            "no:cacheprovider",
                            *target.tests,
                        ],
                        cwd=copy,
                        capture_output=True,
                        text=True,
                        timeout=timeout,
                        check=False,
                    )
                    killed = done.returncode != 0
                except subprocess.TimeoutExpired:
                    killed = True  # a hang is noticed too
                finally:
                    (copy / target.module).write_text(original)
                results.append(
                    {
                        "target": target.name,
                        "line": mutant.line,
                        "mutation": mutant.what,
                        "killed": killed,
                        "seconds": round(time.monotonic() - started, 1),
                    }
                )
                mark = "killed " if killed else "SURVIVED"
                print(f"{mark} {target.module}:{mutant.line} {mutant.what}", flush=True)
    return results


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--target", nargs="+", choices=[t.name for t in TARGETS], help="only these targets")
    parser.add_argument("--limit", type=int, help="at most N mutants per target")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    chosen = [t for t in TARGETS if args.target is None or t.name in args.target]
    results = run(chosen, args.limit, args.timeout)
    killed = sum(1 for r in results if r["killed"])
    print(f"\n{killed}/{len(results)} mutants killed ({100 * killed / max(1, len(results)):.0f}%)")
    for name in dict.fromkeys(str(r["target"]) for r in results):
        mine = [r for r in results if r["target"] == name]
        print(f"  {name}: {sum(1 for r in mine if r['killed'])}/{len(mine)}")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
