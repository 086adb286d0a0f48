"""Frozen attrs classes whose attrs work runs when a class is first used, not at import.

`lifecycle status ID` folds two events and prints a line: importing attrs and building the
~20 frozen classes of the events and the folded state was ~40% of that process (issue
#13), though the fold reads only the classes' own attributes (`TYPE`, `evolve`, …) and
builds no instance. So the domain's classes are declared with `frozen` from here: for
type checkers it *is* `attrs.frozen`; at run time the class statement runs as usual and
`attrs.frozen(cls, slots=False)` decorates the very same class object in place the first
time it is needed:
- an instance is created (a stand-in `__init__` builds the class, then calls attrs'),
- an instance is unpickled or copied (a stand-in `__setstate__` builds the class first:
  unpickling calls no `__init__`),
- or attrs looks at the class (`attrs.fields`, `attrs.has`, … read `__attrs_attrs__`,
  a descriptor that builds the class before answering).
Building is done once, under a lock (two threads naming one class wait for one build; a
forked child starts with a fresh lock). A class attrs refuses (say a mandatory field after
a defaulted one) raises attrs' error at every use and stays deferred, not half-built.
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

import os
from _thread import RLock
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar, cast

__all__ = ["Factory", "build", "field_names", "frozen", "is_deferred", "waits_for_attrs"]

_C = TypeVar("_C", bound=type)

# deferred class -> (the options its `frozen(...)` was given, its own `__init__` if it wrote one); removed once built
_PENDING: dict[type, tuple[dict[str, Any], Any]] = {}
_LOCK = RLock()  # two threads naming one class at once build it once


def _fresh_lock() -> None:
    """After fork, in the child: a lock another thread of the parent held would never be released."""
    global _LOCK  # noqa: PLW0603 - the module's one lock, replaced whole in a forked child
    _LOCK = RLock()


os.register_at_fork(after_in_child=_fresh_lock)
_CLASSVAR_PREFIXES = ("typing.ClassVar", "t.ClassVar", "ClassVar", "typing_extensions.ClassVar")  # as attrs


class _Factory:
    """`attrs.Factory` as written in a class body, until the class is built."""

    __slots__ = ("factory", "takes_self")

    def __init__(self, factory: Callable[..., Any], takes_self: bool = False) -> None:
        self.factory = factory
        self.takes_self = takes_self


class _BuildOnLookup:
    """A deferred class's `__attrs_attrs__`: reading it builds the class, then answers.

    It stays in place while attrs builds the class (attrs replaces it at the end), so
    another thread asking meanwhile waits for that build; the building thread itself,
    asking about the class it is building, is told there is none yet.
    """

    def __get__(self, instance: object, owner: type) -> Any:
        if owner in _PENDING and _LOCK._is_owned():  # type: ignore[attr-defined]
            raise AttributeError("__attrs_attrs__")  # this thread is building it: not an attrs class yet
        build(owner)
        return owner.__attrs_attrs__  # type: ignore[attr-defined]


_BUILD_ON_LOOKUP = _BuildOnLookup()


def _stand_in_init(owner: type) -> Callable[..., None]:
    """`owner`'s `__init__` until it is built: build the instance's class, then run `owner`'s own
    (attrs') `__init__` — `owner`'s, not the instance class's: a plain subclass whose `__init__`
    called this one through `super()` must not run its own body twice."""

    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        build(type(self))
        cast(Any, owner).__init__(self, *args, **kwargs)

    return __init__


def _build_then_setstate(self: Any, state: Any) -> None:
    """A deferred class's `__setstate__` (unpickling, `copy`): build the class, then restore as Python would."""
    build(type(self))
    setstate = getattr(self, "__setstate__", None)
    if setstate is not None and getattr(setstate, "__func__", None) is not _build_then_setstate:
        setstate(state)
        return
    if isinstance(state, tuple):  # (dict, slots) as `copyreg` writes it
        state, slots = state
        for name, value in (slots or {}).items():
            object.__setattr__(self, name, value)
    if state:
        self.__dict__.update(state)


def _frozen(maybe_cls: _C | None = None, /, **options: Any) -> Any:
    """`@frozen` / `@frozen(...)`: the class as written, decorated by `attrs.frozen` on first use."""

    def defer(cls: _C) -> _C:
        with _LOCK:
            _PENDING[cls] = (options, cls.__dict__.get("__init__"))
            _install_stand_ins(cls)
        return cls

    return defer if maybe_cls is None else defer(maybe_cls)


def _install_stand_ins(cls: type) -> None:
    # Its own, not inherited: a subclass built later must not borrow its base's answers.
    type.__setattr__(cls, "__init__", _stand_in_init(cls))
    type.__setattr__(cls, "__setstate__", _build_then_setstate)
    type.__setattr__(cls, "__attrs_attrs__", _BUILD_ON_LOOKUP)


def is_deferred(cls: type) -> bool:
    """Whether `cls` or one of its bases is still waiting for attrs."""
    return any(klass in _PENDING for klass in cls.__mro__)


def waits_for_attrs(cls: type) -> bool:
    """Whether `cls` itself is still deferred (`is_deferred` without the walk: for a class with no deferred base)."""
    return cls in _PENDING


def build(cls: type) -> None:
    """Decorate `cls` and each deferred base of it with attrs, bases first (idempotent).

    The check is made under the lock: a thread that finds the class already taken out of
    `_PENDING` by another one waits until that build has finished, never uses it half-built.
    """
    with _LOCK:
        if not is_deferred(cls):
            return
        import attrs

        for klass in reversed(cls.__mro__):
            pending = _PENDING.get(klass)
            if pending is None:
                continue
            options, own_init = pending
            factories = {name: value for name, value in vars(klass).items() if isinstance(value, _Factory)}
            if own_init is not None:  # the class wrote its own: attrs keeps it (auto_detect), as at import
                type.__setattr__(klass, "__init__", own_init)
            elif options.get("init") is False:  # attrs writes none: nothing to stand in for
                type.__delattr__(klass, "__init__")
            else:  # the stand-in stays until attrs writes its own over it: no moment without an `__init__`
                options = {"init": True, **options}
            try:
                for name, value in factories.items():
                    factory = attrs.Factory(value.factory, takes_self=value.takes_self)  # type: ignore[call-overload]
                    type.__setattr__(klass, name, factory)
                built = attrs.frozen(klass, slots=False, **options)
            except BaseException:  # attrs refused the class: leave it deferred, as it was
                for name, value in factories.items():
                    type.__setattr__(klass, name, value)
                _install_stand_ins(klass)
                raise
            assert built is klass  # in place: the class keeps its identity
            type.__delattr__(klass, "__setstate__")
            del _PENDING[klass]


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
