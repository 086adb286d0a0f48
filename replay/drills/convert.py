"""The strict cattrs converter behind the scenario schema, and its errors as one-line `ScenarioError`s.

cattrs converts loosely by default (LIBRARY_NOTES: `seq: 7.9` silently becomes 7, and
`true` passes for an int, `5` for a string). Here every type the schema uses has a hook
that refuses anything else: a bool is not an int, a float is not an int, an int is not
a string, a string is not a list; a `Literal` takes only its values; an attrs class
takes a mapping with string keys and refuses keys it does not declare
(`forbid_extra_keys`). An optional key may be left out but not set to null unless its
field is marked `NULLABLE`.

cattrs reports every problem of an object at once (`ClassValidationError`, an
exception group). `structure` turns the first into the `ScenarioError` a person reads:
the file, the place (`step 3 (expect)`), the key, what is wrong. Unknown keys come
first (a typo usually explains the rest), then wrong values in the file's order, then
missing keys, then the checks a class makes of its values.
"""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError, ForbiddenExtraKeysError
from cattrs.gen import make_dict_structure_fn, override

from lifecycle_fsm.errors import ScenarioError

__all__ = ["FROM_KEY", "NULLABLE", "Problem", "Where", "converter", "from_file", "structure"]

T = TypeVar("T")
NULLABLE = types.MappingProxyType({"nullable": True})  # field metadata: the key may be given as null
FROM_KEY = types.MappingProxyType({"from_key": True})  # field metadata: filled from the key it is declared under


class Problem(Exception):
    """What is wrong with one value, raised by a hook or a validator and placed by `structure`.

    Without `key` the problem is the value itself: it is reported at the key the value
    was given under. With `key` it is about a key inside the value (an unknown or
    non-string key, a field a validator refused).
    """

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


class Where:
    """Builds error messages that name the file, the place and the key."""

    def __init__(self, path: Path, place: str = "") -> None:
        self.path = path
        self.place = place

    def at(self, place: str) -> Where:
        return Where(self.path, place)

    def error(self, key: str | None, problem: str, within: tuple[str, ...] = ()) -> ScenarioError:
        parts = [str(self.path), *([self.place] if self.place else []), *within]
        return ScenarioError(": ".join([*parts, *([f"key {key!r}"] if key else []), problem]))


def from_file(cl: type) -> tuple[str, ...]:
    """The keys a file may give for an attrs class, in declaration order."""
    return tuple(f.name for f in attrs.fields(cl) if not f.metadata.get("from_key"))


# -- the strict hooks -------------------------------------------------------------------------------------------

_NAMES: dict[Any, str] = {str: "a string", int: "an integer", bool: "true or false", type(None): "null"}


def _origin(t: Any) -> Any:
    return typing.get_origin(t)


def _expected(t: Any) -> str:
    if t in _NAMES:
        return _NAMES[t]
    origin = _origin(t)
    if origin is Literal:
        return "one of " + ", ".join(map(str, typing.get_args(t)))
    if origin in (list, tuple):
        return "a list"
    return "a mapping"


class WrongType(Problem):
    """A value of the wrong type; how it is shown depends on where it was found (see `message_at`)."""

    def __init__(self, value: Any, expected: str) -> None:
        super().__init__(f"must be {expected}, not {value!r}")
        self.value = value
        self.expected = expected

    def message_at(self, path: tuple[str, ...]) -> str:
        """A value under a key is shown (`not 'three'`); a whole section or step, or a long value, is
        named by its type (`not list`): it may be a whole file."""
        shown = repr(self.value)
        if not path or len(shown) > 60:
            shown = type(self.value).__name__
        return f"must be {self.expected}, not {shown}"


def _wrong(value: Any, t: Any, *, nullable: bool = False) -> WrongType:
    return WrongType(value, _expected(t) + (" or null" if nullable else ""))


def _is(value: Any, kind: type) -> bool:
    """isinstance, except that a bool is not an int (YAML `true` is no window number)."""
    return isinstance(value, kind) and isinstance(value, bool) is (kind is bool)


def _scalar(kind: type) -> Callable[[Any, Any], Any]:
    def hook(value: Any, _t: Any) -> Any:
        if not _is(value, kind):
            raise _wrong(value, kind)
        return value

    return hook


def _is_optional(t: Any) -> bool:
    return _origin(t) in (typing.Union, types.UnionType) and type(None) in typing.get_args(t)


def _inner(t: Any) -> Any:
    (inner,) = [a for a in typing.get_args(t) if a is not type(None)]
    return inner


def _optional(value: Any, t: Any) -> Any:
    """An optional key given as null is refused: leave it out instead (unless NULLABLE)."""
    if value is None:
        raise _wrong(value, _inner(t))
    return converter.structure(value, _inner(t))


def _nullable(value: Any, t: Any) -> Any:
    if value is None:
        return None
    inner = _inner(t)
    if inner in _NAMES and not _is(value, inner):
        raise _wrong(value, inner, nullable=True)
    return converter.structure(value, inner)


def _literal(value: Any, t: Any) -> Any:
    if not isinstance(value, str) or value not in typing.get_args(t):
        raise _wrong(value, t)
    return value


def _sequence(value: Any, t: Any) -> Any:
    if not isinstance(value, list):
        raise _wrong(value, t)
    item = typing.get_args(t)[0]
    items = []
    for v in value:
        try:
            items.append(converter.structure(v, item))
        except Problem:
            if _origin(item) is Literal:  # name the item first: the list of choices is long
                raise Problem(f"{v!r} is not {_expected(item)}") from None
            raise Problem(f"every item must be {_expected(item)}, not {v!r}") from None
    return tuple(items) if _origin(t) is tuple else items


def _keys(value: Any, t: Any, allowed: tuple[str, ...] | None) -> dict[str, Any]:
    """A mapping with string keys (and, given `allowed`, only those keys)."""
    if not isinstance(value, dict):
        raise _wrong(value, t)
    for k in value:
        if not isinstance(k, str):
            raise Problem("keys must be strings", key=str(k))
        if allowed is not None and k not in allowed:
            raise Problem(f"unknown key (expected one of {', '.join(allowed)})", key=k)
    return value


def _mapping(value: Any, t: Any) -> dict[str, Any]:
    key_type, value_type = typing.get_args(t)
    allowed = typing.get_args(key_type) if _origin(key_type) is Literal else None
    return {k: converter.structure(v, value_type) for k, v in _keys(value, t, allowed).items()}


def _attrs_class(cl: type) -> Callable[[Any, Any], Any]:
    attrs.resolve_types(cl)
    overrides = {}
    for f in attrs.fields(cl):
        if f.metadata.get("from_key"):
            overrides[f.name] = override(omit=True)
        elif f.metadata.get("nullable"):
            overrides[f.name] = override(struct_hook=_nullable)
    make: Callable[..., Callable[[Any, Any], Any]] = make_dict_structure_fn  # overrides go in **kwargs
    structure_fields = make(cl, converter, _cattrs_forbid_extra_keys=True, **overrides)

    def hook(value: Any, _t: Any) -> Any:
        return structure_fields(_keys(value, cl, None), cl)

    return hook


def _make_converter() -> cattrs.Converter:
    conv = cattrs.Converter(forbid_extra_keys=True, detailed_validation=True)
    for kind in (str, int, bool):
        conv.register_structure_hook(kind, _scalar(kind))
    conv.register_structure_hook_func(_is_optional, _optional)
    conv.register_structure_hook_func(lambda t: _origin(t) is Literal, _literal)
    conv.register_structure_hook_func(lambda t: _origin(t) in (list, tuple), _sequence)
    conv.register_structure_hook_func(lambda t: _origin(t) in (dict, Mapping), _mapping)
    conv.register_structure_hook_factory(attrs.has, _attrs_class)
    return conv


converter = _make_converter()


# -- cattrs' errors, placed -------------------------------------------------------------------------------------


def _attribute(exc: BaseException) -> str | None:
    notes = getattr(exc, "__notes__", [])
    return next((n.name for n in notes if isinstance(n, AttributeValidationNote)), None)


def _first(exc: BaseException, raw: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], str | None, str]:
    """The first problem in `exc` as (within, key, message), `path` the keys leading to `raw`."""
    if isinstance(exc, WrongType):
        return (), ".".join(path) or None, exc.message_at(path)
    if isinstance(exc, Problem):
        if exc.key is not None:
            return path, exc.key, exc.message
        return (), ".".join(path) or None, exc.message
    if not isinstance(exc, ClassValidationError):
        raise exc  # not a problem with the file: a bug, let it be seen
    by_attribute: dict[str, BaseException] = {}
    unknown: set[str] = set()
    checks: list[BaseException] = []
    for sub in exc.exceptions:
        if isinstance(sub, ForbiddenExtraKeysError):
            unknown |= sub.extra_fields
        elif (name := _attribute(sub)) is not None:
            by_attribute.setdefault(name, sub)
        else:
            checks.append(sub)
    for key in raw:
        if key in unknown:
            return path, key, f"unknown key (expected one of {', '.join(from_file(exc.cl))})"
    for key in raw:
        if key in by_attribute:
            return _first(by_attribute[key], raw[key], (*path, key))
    for name, missing in by_attribute.items():
        if isinstance(missing, KeyError):
            field_type = attrs.fields_dict(exc.cl)[name].type
            choices = f" ({_expected(field_type)})" if _origin(field_type) is Literal else ""
            return (), ".".join((*path, name)), f"is required{choices}"
    if checks:  # the class's own checks run only once every value structured
        return _first(checks[0], raw, path)
    raise exc


def structure(where: Where, raw: Any, cl: type[T]) -> T:
    """`raw` (parsed YAML) as an instance of `cl`, or a `ScenarioError` naming the first problem."""
    try:
        return converter.structure(raw, cl)
    except (ClassValidationError, Problem) as e:
        within, key, message = _first(e, raw, ())
        raise where.error(key, message, within) from e
