"""`lifecycle` with the per-row hash check on or off: the launcher of bench_trust's whole-process rows.

    python -m check_switch on|off [lifecycle arguments...]   (benchmarks/ on the path)

`off` is the read path before issue #9, in this process only: `upcasting.check_row` does
nothing (the rows of one stream: `status ID`, `explain`), and the whole-ledger fold reads
its six columns as an unchecked fold does instead of whole rows to re-hash
(`replay.fold.fold_batches` as with `checked=False`). Each module is patched the moment
it is imported, so `off` imports exactly what `on` does. Both modes start through this
module and the same import hook (which patches nothing for `on`), so the launcher costs
them alike. The product itself has no way to switch the check off.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from importlib.machinery import ModuleSpec
from types import ModuleType
from typing import Any

__all__ = ["main"]


def _no_row_check(module: ModuleType) -> None:
    module.check_row = lambda event: None


def _unchecked_batches(module: ModuleType) -> None:
    def fold_batches(store: Any, *, after: int, to: int | None, checked: bool) -> Iterable[Sequence[Sequence[Any]]]:
        batches: Iterable[Sequence[Sequence[Any]]] = store.select_fold_batches(after=after, to=to)
        return batches

    module.fold_batches = fold_batches


OFF: dict[str, Callable[[ModuleType], None]] = {
    "lifecycle_fsm.upcasting": _no_row_check,
    "replay.fold": _unchecked_batches,
}


class _PatchOnImport:
    """A meta path finder: the next finders find a module as usual; `patches[name]` runs once it has loaded."""

    def __init__(self, patches: dict[str, Callable[[ModuleType], None]]) -> None:
        self.patches = patches

    def find_spec(
        self, name: str, path: Sequence[str] | None = None, target: ModuleType | None = None
    ) -> ModuleSpec | None:
        if name not in OFF:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec: ModuleSpec | None = finder.find_spec(name, path, target)
            if spec is not None:
                break
        else:
            return None
        patch = self.patches.get(name)
        loader = spec.loader
        if patch is not None and loader is not None:
            load = loader.exec_module

            def exec_module(module: ModuleType) -> None:
                load(module)
                patch(module)

            loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> None:
    mode = sys.argv[1]
    if mode not in ("on", "off"):
        raise SystemExit("usage: python -m check_switch on|off [lifecycle arguments...]")
    sys.meta_path.insert(0, _PatchOnImport(OFF if mode == "off" else {}))
    sys.argv = ["lifecycle", *sys.argv[2:]]
    from lifecycle_fsm.cli import main as lifecycle

    sys.exit(lifecycle())


if __name__ == "__main__":
    main()
