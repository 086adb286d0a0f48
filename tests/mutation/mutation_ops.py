"""The mutation operators of `mutate.py`: where a mutant can be made, and how it is applied."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator

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
_BOUNDARY = {ast.Lt: ast.LtE, ast.LtE: ast.Lt, ast.Gt: ast.GtE, ast.GtE: ast.Gt}  # off by one
_SWAPPED_NAMES = {"min": "max", "max": "min", "any": "all", "all": "any"}
# SQL text: (what, pattern, replacement), applied at one match at a time.
_SQL = (
    ("+1", re.compile(r"\+ 1\b"), "+ 2"),
    ("<>", re.compile(r"<>"), "="),
    (">=", re.compile(r">="), ">"),
    ("DESC", re.compile(r"\bDESC\b"), "ASC"),
    ("AND", re.compile(r"\bAND\b"), "OR"),
    ("NOT", re.compile(r"(?<!IF )\bNOT\s+(?!NULL\b)"), ""),  # a condition's, not a column's or IF NOT EXISTS
    ("CHECK", re.compile(r"\s*CHECK \([^()]*\)"), ""),
    ("concat", re.compile(r"\s*\|\|\s*(?:E'[^']*'|[\w.]+(?:::\w+)?)"), ""),
)


def _functions(tree: ast.Module, wanted: tuple[str, ...]) -> Iterator[ast.FunctionDef]:
    found = set()
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name in wanted:
            found.add(node.name)
            yield node
        elif isinstance(node, ast.ClassDef):
            for item in node.body:
                if isinstance(item, ast.FunctionDef) and f"{node.name}.{item.name}" in wanted:
                    found.add(f"{node.name}.{item.name}")
                    yield item
    if missing := set(wanted) - found:  # a renamed function must not leave its guarantee unchecked silently
        raise SystemExit(f"not found: {', '.join(sorted(missing))} (update the target)")


def _assigned(tree: ast.Module, names: tuple[str, ...]) -> Iterator[ast.expr]:
    """The values of the module-level assignments to `names` (each must exist)."""
    found = set()
    for node in tree.body:
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target] if isinstance(node, ast.AnnAssign) else []
        )
        for t in targets:
            if isinstance(t, ast.Name) and t.id in names and node.value is not None:  # type: ignore[union-attr]
                found.add(t.id)
                yield node.value  # type: ignore[union-attr,misc]
    if missing := set(names) - found:
        raise SystemExit(f"not found: {', '.join(sorted(missing))} (update the target)")


def _sites(func: ast.FunctionDef) -> Iterator[tuple[ast.AST, str]]:
    """Every node a mutant can change, with a description of the change."""
    for node in ast.walk(func):
        if isinstance(node, ast.Compare):
            for i, op in enumerate(node.ops):
                if type(op) in _FLIP:
                    yield node, f"compare:{i}:{type(op).__name__}->{_FLIP[type(op)].__name__}"
                if type(op) in _BOUNDARY:
                    yield node, f"boundary:{i}:{type(op).__name__}->{_BOUNDARY[type(op)].__name__}"
        elif isinstance(node, ast.BoolOp):
            yield node, f"boolop:{type(node.op).__name__}"
        elif isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            yield node, "drop-not"
        elif isinstance(node, ast.Constant) and isinstance(node.value, bool):
            yield node, f"const:{node.value}->{not node.value}"
        elif isinstance(node, ast.Constant) and type(node.value) is int:
            yield node, f"int:{node.value}->{node.value + 1}"
            if node.value != 0:
                yield node, f"int:{node.value}->{node.value - 1}"
        elif isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Sub)):
            if any(isinstance(side, ast.Constant) and type(side.value) is int for side in (node.left, node.right)):
                yield node, f"arith:{type(node.op).__name__}"
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "sorted" and node.args:
            yield node, "unsort"
        elif isinstance(node, ast.Dict):
            for i, key in enumerate(node.keys):
                if key is not None:
                    yield node, f"entry:{i}:drop"
        elif isinstance(node, ast.Name) and node.id in _SWAPPED_NAMES:
            yield node, f"name:{node.id}->{_SWAPPED_NAMES[node.id]}"
        elif isinstance(node, (ast.Raise, ast.Assert)) or (
            isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        ):
            yield node, f"delete:{type(node).__name__}"


def _row_fields(row: ast.expr) -> list[ast.expr]:
    """The fields of one table row: a call's arguments (`Move(...)`) or a tuple's items."""
    if isinstance(row, ast.Call):
        return list(row.args)
    if isinstance(row, ast.Tuple):
        return list(row.elts)
    return []


def _table_sites(table: ast.expr) -> Iterator[tuple[ast.AST, str]]:
    """One row dropped; one field of a row (a dict entry's value) replaced by the next row's."""
    if isinstance(table, (ast.Tuple, ast.List)):
        rows = table.elts
        for i, row in enumerate(rows):
            yield table, f"row:{i}:drop"
            following = _row_fields(rows[(i + 1) % len(rows)])
            for j, field in enumerate(_row_fields(row)):
                if j < len(following) and ast.dump(field) != ast.dump(following[j]):
                    yield table, f"row:{i}:field:{j}"
    elif isinstance(table, ast.Dict):
        for i, value in enumerate(table.values):
            yield table, f"entry:{i}:drop"
            if ast.dump(value) != ast.dump(table.values[(i + 1) % len(table.values)]):
                yield table, f"entry:{i}:value"


def _sql_sites(value: ast.expr) -> Iterator[tuple[ast.AST, str]]:
    for node in ast.walk(value):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            for what, pattern, _ in _SQL:
                for n, match in enumerate(pattern.finditer(node.value)):
                    near = " ".join(node.value[max(0, match.start() - 30) : match.end() + 30].split())
                    yield node, f"sql:{what}:{n} near {near!r}"


def all_sites(
    tree: ast.Module, functions: tuple[str, ...], tables: tuple[str, ...], sql: tuple[str, ...]
) -> list[tuple[ast.AST, str]]:
    """Every mutant's site in walk order: the functions', then the tables', then the SQL text's."""
    sites = [s for f in _functions(tree, functions) for s in _sites(f)]
    sites += [s for table in _assigned(tree, tables) for s in _table_sites(table)]
    sites += [s for text in _assigned(tree, sql) for s in _sql_sites(text)]
    return sites


class Apply(ast.NodeTransformer):
    """Apply one mutation to one node of the module (found by identity in a fresh tree)."""

    def __init__(self, target: ast.AST, what: str) -> None:
        self.target, self.what = target, what

    def generic_visit(self, node: ast.AST) -> ast.AST:
        node = super().generic_visit(node)
        if node is not self.target:
            return node
        kind, *rest = self.what.split(" ")[0].split(":")
        if kind == "compare":
            assert isinstance(node, ast.Compare)
            i = int(rest[0])
            node.ops[i] = _FLIP[type(node.ops[i])]()
        elif kind == "boundary":
            assert isinstance(node, ast.Compare)
            i = int(rest[0])
            node.ops[i] = _BOUNDARY[type(node.ops[i])]()
        elif kind == "boolop":
            assert isinstance(node, ast.BoolOp)
            node.op = ast.Or() if isinstance(node.op, ast.And) else ast.And()
        elif kind == "drop-not":
            assert isinstance(node, ast.UnaryOp)
            return node.operand
        elif kind == "const":
            assert isinstance(node, ast.Constant)
            node.value = not node.value
        elif kind == "int":
            assert isinstance(node, ast.Constant)
            node.value = int(rest[0].split("->")[1])
        elif kind == "arith":
            assert isinstance(node, ast.BinOp)
            node.op = ast.Sub() if isinstance(node.op, ast.Add) else ast.Add()
        elif kind == "unsort":  # the order it was given in
            assert isinstance(node, ast.Call)
            return node.args[0]
        elif kind == "name":
            assert isinstance(node, ast.Name)
            node.id = _SWAPPED_NAMES[node.id]
        elif kind == "row":
            assert isinstance(node, (ast.Tuple, ast.List))
            i = int(rest[0])
            if rest[1] == "drop":
                del node.elts[i]
            else:
                j, following = int(rest[2]), node.elts[(i + 1) % len(node.elts)]
                row = node.elts[i]
                replacement = _row_fields(following)[j]
                if isinstance(row, ast.Call):
                    row.args[j] = replacement
                else:
                    assert isinstance(row, ast.Tuple)
                    row.elts[j] = replacement
        elif kind == "entry":
            assert isinstance(node, ast.Dict)
            i = int(rest[0])
            if rest[1] == "drop":
                del node.keys[i], node.values[i]
            else:
                node.values[i] = node.values[(i + 1) % len(node.values)]
        elif kind == "sql":
            assert isinstance(node, ast.Constant)
            pattern, replacement = next((p, r) for w, p, r in _SQL if w == rest[0])
            match = list(pattern.finditer(node.value))[int(rest[1])]
            node.value = node.value[: match.start()] + replacement + node.value[match.end() :]
        elif kind == "delete":
            return ast.copy_location(ast.Pass(), node)
        return node
