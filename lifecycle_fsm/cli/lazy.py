"""The group's command table, importing a command's module only when it is looked up.

`lifecycle status ID` needs `queries` alone; importing every command module (audit,
drill, log, report, serve, migrate and what they pull in) cost more start-up than the
command itself. `--help` and anything that walks the table (tests, completion) load them
all: same objects, same order.
"""

from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping, MutableMapping

import click

__all__ = ["LazyCommands"]


class LazyCommands(MutableMapping[str, click.Command]):
    """`name -> command`; `where[name]` is `("package.module", "attribute")` until first use."""

    def __init__(self, where: Mapping[str, tuple[str, str]]) -> None:
        self._where = dict(where)
        self._loaded: dict[str, click.Command] = {}

    def _load(self, name: str) -> None:
        spec = self._where.pop(name, None)
        if spec is not None:
            module, attribute = spec
            command = getattr(importlib.import_module(module), attribute)
            if not isinstance(command, click.Command):
                raise TypeError(f"{module}.{attribute} is not a click command")
            self._loaded[name] = command

    def _load_all(self) -> None:
        for name in list(self._where):
            self._load(name)

    def __getitem__(self, name: str) -> click.Command:
        self._load(name)
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._where.pop(name, None)
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        if self._where.pop(name, None) is None:
            del self._loaded[name]
        else:
            self._loaded.pop(name, None)

    def __contains__(self, name: object) -> bool:
        return name in self._where or name in self._loaded

    def __iter__(self) -> Iterator[str]:
        self._load_all()
        return iter(list(self._loaded))

    def __len__(self) -> int:
        return len(self._where) + len(self._loaded)
