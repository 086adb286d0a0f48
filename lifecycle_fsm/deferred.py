"""Frozen attrs classes whose attrs work runs when a class is first used, not at import.

`lifecycle status ID` folds two events and prints a line: importing attrs and building the
~20 frozen classes of the events and the folded state was ~40% of that process (issue
#13), though the fold reads only the classes' own attributes (`TYPE`, `evolve`, …) and
builds no instance. So the domain's classes are declared with `frozen` from here: for
type checkers it *is* `attrs.frozen`; at run time the class statement runs as usual and
`attrs.frozen(cls, slots=False)` decorates the very same class object in place the first
time it is needed:
- an instance is created (a stand-in `__init__` builds the class, then calls attrs'),
- or attrs looks at the class (`attrs.fields`, `attrs.has`, … read `__attrs_attrs__`,
  a descriptor that builds the class before answering).
Building a class builds its deferred bases first, so inheritance, `isinstance`, pickling
and identity are those of the plain class statement. Before that, everything the class
body defines (class variables, methods) is there as written, but for `__init__`: the
stand-in's (`inspect.signature(cls)` shows `(*args, **kwargs)` until the class is built).
`field_names` gives a class's attrs field names without building it.

The one difference from a class decorated at import is `slots=False` (a deferred class
must stay the same object, and attrs' slotted classes are new classes): instances keep a
`__dict__`; equality, hashing, `repr`, frozenness (`attrs.exceptions.FrozenInstanceError`)
and `attrs.evolve` / `asdict` are attrs' own. `Factory(...)` defaults are kept as written
and handed to attrs at build time (`attrs.Factory` would import attrs).
"""

from __future__ import annotations

from _thread import RLock
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

__all__ = ["Factory", "build", "field_names", "frozen", "is_deferred"]

_C = TypeVar("_C", bound=type)

# deferred class -> (the options its `frozen(...)` was given, its own `__init__` if it wrote one); removed once built
_PENDING: dict[type, tuple[dict[str, Any], Any]] = {}
_LOCK = RLock()  # two threads naming one class at once build it once
_CLASSVAR_PREFIXES = ("typing.ClassVar", "t.ClassVar", "ClassVar", "typing_extensions.ClassVar")  # as attrs


class _Factory:
    """`attrs.Factory` as written in a class body, until the class is built."""

    __slots__ = ("factory", "takes_self")

    def __init__(self, factory: Callable[..., Any], takes_self: bool = False) -> None:
        self.factory = factory
        self.takes_self = takes_self


class _BuildOnLookup:
    """A deferred class's `__attrs_attrs__`: reading it builds the class, then answers."""

    def __get__(self, instance: object, owner: type) -> Any:
        build(owner)
        return owner.__attrs_attrs__  # type: ignore[attr-defined]


_BUILD_ON_LOOKUP = _BuildOnLookup()


def _build_then_init(self: Any, *args: Any, **kwargs: Any) -> None:
    """A deferred class's `__init__` until it is built: build it, then run attrs' `__init__`."""
    cls = type(self)
    build(cls)
    cls.__init__(self, *args, **kwargs)


def _frozen(maybe_cls: _C | None = None, /, **options: Any) -> Any:
    """`@frozen` / `@frozen(...)`: the class as written, decorated by `attrs.frozen` on first use."""

    def defer(cls: _C) -> _C:
        with _LOCK:
            _PENDING[cls] = (options, cls.__dict__.get("__init__"))
            # Its own, not inherited: a subclass built later must not borrow its base's answers.
            type.__setattr__(cls, "__init__", _build_then_init)
            type.__setattr__(cls, "__attrs_attrs__", _BUILD_ON_LOOKUP)
        return cls

    return defer if maybe_cls is None else defer(maybe_cls)


def is_deferred(cls: type) -> bool:
    """Whether `cls` or one of its bases is still waiting for attrs."""
    return any(klass in _PENDING for klass in cls.__mro__)


def build(cls: type) -> None:
    """Decorate `cls` and each deferred base of it with attrs, bases first (idempotent)."""
    if not is_deferred(cls):
        return
    import attrs

    with _LOCK:
        for klass in reversed(cls.__mro__):
            pending = _PENDING.pop(klass, None)
            if pending is None:
                continue
            options, own_init = pending
            if own_init is None:
                type.__delattr__(klass, "__init__")
            else:  # the class wrote its own: attrs keeps it (auto_detect), as it would have at import
                type.__setattr__(klass, "__init__", own_init)
            type.__delattr__(klass, "__attrs_attrs__")
            for name, value in list(vars(klass).items()):
                if isinstance(value, _Factory):
                    factory = attrs.Factory(value.factory, takes_self=value.takes_self)  # type: ignore[call-overload]
                    type.__setattr__(klass, name, factory)
            built = attrs.frozen(klass, slots=False, **options)
            assert built is klass  # in place: the class keeps its identity


def _is_class_var(annotation: object) -> bool:
    text = str(annotation)
    if text.startswith(("'", '"')) and text.endswith(("'", '"')):
        text = text[1:-1]
    return text.startswith(_CLASSVAR_PREFIXES)


def _own_fields(cls: type) -> list[str]:
    built = cls.__dict__.get("__attrs_attrs__")
    if isinstance(built, tuple):  # an attrs class (built, or never deferred)
        return [a.name for a in built if not a.inherited]
    if cls in _PENDING:
        annotations = cls.__dict__.get("__annotations__", {})  # noqa: RUF063 - as attrs reads them; no `inspect` import
        return [name for name, annotation in annotations.items() if not _is_class_var(annotation)]
    return []


def field_names(cls: type) -> tuple[str, ...]:
    """`tuple(a.name for a in attrs.fields(cls))`, without building `cls` (or importing attrs).

    attrs' own order: the bases' fields by reversed MRO (a name once, where it was last
    defined; none the class redefines), then the class's own annotated, non-`ClassVar` names.
    """
    own = _own_fields(cls)
    taken = set(own)
    inherited: list[str] = []
    for base in reversed(cls.__mro__[1:-1]):
        inherited += [name for name in _own_fields(base) if name not in taken]
    seen: set[str] = set()
    kept: list[str] = []
    for name in reversed(inherited):
        if name not in seen:
            kept.insert(0, name)
            seen.add(name)
    return (*kept, *own)


if TYPE_CHECKING:  # type checkers see attrs itself (its plugin types the fields and `__init__`)
    from attrs import Factory, frozen
else:
    frozen = _frozen
    Factory = _Factory
