"""A small mutation check: does the suite notice when a guarantee is broken?

    python tests/mutation/mutate.py [--target NAME ...] [--match TEXT] [--limit N] [--json FILE]

For each target (a module, the functions in it that carry a guarantee, its tables and
SQL text, and the tests that should defend them) the script walks the syntax tree and
makes one mutant per site. In the functions: a comparison flipped (`==` <-> `!=`,
`<` <-> `>=`, `in` <-> `not in`) or moved by one (`<` <-> `<=`, `>` <-> `>=`), an
integer constant moved by one (`+ 1` -> `+ 2`, `[0]` -> `[1]`), `+` <-> `-`, `min`
<-> `max`, `any` <-> `all`, `sorted(x)` -> `x`, one entry of a dict literal dropped,
`and` <-> `or`, a boolean constant inverted, a `not` dropped, a statement that
raises, asserts or calls something deleted (replaced by `pass`). In a module-level
table (a tuple or dict literal): one row dropped, one field of a row (a dict entry's
value) taken from the next row. In module-level SQL text: a `+ 1` moved, `<>` -> `=`,
`>=` -> `>`, `DESC` -> `ASC`, `AND` -> `OR`, a `NOT` or a `CHECK (...)` dropped, one
`|| term` of a concatenation dropped. Each mutant is
written into a scratch copy of the repository and the target's tests run against it
(`-x`, no coverage); a failing run kills the mutant. Surviving mutants are listed
with their line: each is either a missing test or an equivalent mutant (say which).

Not part of the CI run (tens of minutes for every target on 2 cores); run it when changing a guarantee.
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

from mutation_ops import Apply, all_sites

REPO = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class Target:
    name: str
    module: str  # path from the repository root
    functions: tuple[str, ...]  # "Class.method" or "function"
    tests: tuple[str, ...]
    tables: tuple[str, ...] = ()  # module-level tuple or dict literals: rows dropped or changed
    sql: tuple[str, ...] = ()  # module-level assignments holding SQL text


TARGETS = (
    Target(
        "chain",
        "store/chain.py",
        ("event_hash", "header_parts", "chain_rows", "canonical_json", "ChainWalk._next_batch", "check_rows"),
        ("tests/test_store_chain.py", "tests/test_chain_format.py", "tests/test_store_contract.py"),
    ),
    Target(
        "command_path",
        "lifecycle_fsm/command_path.py",
        (
            "CommandPath.run",
            "CommandPath._attempt",
            "CommandPath._append_candidate",
            "CommandPath._fan_out",
            "CommandPath._fire",
            "require_command",
        ),
        (
            "tests/test_command_path.py",
            "tests/test_ledger.py",
            "tests/test_cached_commands.py",
            "tests/test_command_runtime.py",
            "tests/test_properties.py",
            "tests/test_sub_keys.py",
            "tests/test_idempotency.py",
        ),
    ),
    Target(
        "fold",
        "lifecycle_fsm/state.py",
        ("Fold.extend", "Fold._other", "apply", "_settle", "_misplaced", "CandidateStep.step", "check_fields"),
        ("tests/test_state.py", "tests/test_replay_corruption.py"),
    ),
    Target(
        "upcasting",
        "lifecycle_fsm/upcasting.py",
        ("upcast", "parsed_payload"),
        ("tests/test_state.py", "tests/test_replay_corruption.py", "tests/test_events.py"),
    ),
    Target(
        "decisions",
        "lifecycle_fsm/decisions.py",
        (
            "receive",
            "check",
            "hand_off",
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
        ("tests/test_rules.py", "tests/test_rules_version.py"),
        tables=("FRESHNESS_CHECKS", "RECOVERY_STATES_BY_STAGE", "_ACTION_BY_STAGE_AND_STATE", "_FALLBACK_BY_STAGE"),
    ),
    Target(
        "machine",
        "lifecycle_fsm/machine.py",
        ("_build_table",),
        ("tests/test_machine.py", "tests/test_state.py", "tests/test_ledger.py"),
        tables=("MOVES", "INITIAL_TRIGGERS"),
    ),
    Target(
        "checks",
        "lifecycle_fsm/checks.py",
        ("freshness", "CheckEvidence.decide", "CheckEvidence.inconclusive"),
        ("tests/test_rules.py", "tests/test_version_types.py", "tests/test_ledger.py", "tests/test_artifact_root.py"),
    ),
    Target(
        "seals",
        "lifecycle_fsm/seals.py",
        ("seal_message", "check_seals", "check_expected_head", "sealed_under"),
        (
            "tests/test_trust_seals.py",
            "tests/test_trust_forged_seals.py",
            "tests/test_trust_backends.py",
            "tests/test_trust_reads.py",
            "tests/test_sub_keys.py",
        ),
    ),
    Target(
        "pins",
        "lifecycle_fsm/seals.py",
        ("parse_expected_head", "_seq_problem", "_hash_problem"),
        ("tests/test_trust_seals.py", "tests/test_trust_backends.py"),
    ),
    Target(
        "verify",
        "replay/verify.py",
        ("_checkpoint_statuses", "_compare", "_index_problem", "verify_with_state", "_walk", "_walk_here"),
        (
            "tests/test_checkpoints.py",
            "tests/test_verify_one_pass.py",
            "tests/test_verify_problems.py",
            "tests/test_verify_workers.py",
            "tests/test_store_chain.py",
            "tests/test_state_index.py",
        ),
    ),
    Target(
        "postgres_append",
        "store/postgres_schema.py",
        (),
        ("tests/test_store_postgres_append.py",),
        sql=("DDL",),
    ),
    Target(
        "migrate",
        "store/migrate.py",
        ("_refuse_contradicted_log", "_copy_checkpoints", "_resume_point", "_copy"),
        ("tests/test_migrate.py",),
    ),
    Target(
        "strict_json",
        "lifecycle_fsm/json_types.py",
        ("strict_loads", "_unique_keys"),
        ("tests/test_manifests.py", "tests/test_decision_pool.py"),
    ),
    Target(
        "snapshots",
        "lifecycle_fsm/snapshots.py",
        ("snapshot_problem",),
        ("tests/test_checkpoints.py", "tests/test_stream_snapshots.py"),
    ),
)


@dataclass(frozen=True)
class Mutant:
    target: str
    line: int
    what: str
    source: str


def mutants(target: Target) -> Iterator[Mutant]:
    text = (REPO / target.module).read_text()
    where = (target.functions, target.tables, target.sql)
    count = len(all_sites(ast.parse(text), *where))
    for index in range(count):
        tree = ast.parse(text)  # a fresh tree per mutant: the transformer changes it in place
        node, what = all_sites(tree, *where)[index]
        line = getattr(node, "lineno", 0)
        mutated = ast.unparse(ast.fix_missing_locations(Apply(node, what).visit(tree)))
        yield Mutant(target.name, line, what, mutated)


def run(targets: list[Target], limit: int | None, timeout: float, match: str | None = None) -> list[dict[str, object]]:
    results: list[dict[str, object]] = []
    with tempfile.TemporaryDirectory(prefix="mutants-") as scratch:
        copy = Path(scratch) / "repo"
        # symlinks=True: lifecycle_fsm/store and lifecycle_fsm/replay stay links to the mutated folders
        shutil.copytree(
            REPO, copy, symlinks=True, ignore=shutil.ignore_patterns(".venv", ".git", "*.db", "__pycache__", ".*cache")
        )
        for target in targets:
            original = (copy / target.module).read_text()
            chosen = (m for m in mutants(target) if match is None or match in m.what)
            for n, mutant in enumerate(chosen):
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
                            "-n",
                            "0",
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
    parser.add_argument("--match", help="only mutants whose description contains this (e.g. sql:, row:, unsort)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds per mutant's test run")
    parser.add_argument("--json", type=Path, help="write every result here")
    args = parser.parse_args(argv)
    chosen = [t for t in TARGETS if args.target is None or t.name in args.target]
    results = run(chosen, args.limit, args.timeout, args.match)
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
