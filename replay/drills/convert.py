"""The strict cattrs converter behind the scenario format (cattrs alone reads `seq: 7.9` as 7; here each type
refuses anything else, undeclared keys and null but for a `NULLABLE` field), its errors as one `ScenarioError` line."""

from __future__ import annotations

import types
import typing
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any, Literal, TypeVar, get_args, get_origin

import attrs
import cattrs
from cattrs.errors import AttributeValidationNote, ClassValidationError
from cattrs.gen import make_dict_structure_fn, override

from lifecycle_fsm.errors import ScenarioError
from lifecycle_fsm.json_types import JSON
from lifecycle_fsm.manifests import suggest

T = TypeVar("T")
NULLABLE = types.MappingProxyType({"nullable": True})  # field metadata: the key may be given as null


class Problem(Exception):
    """What is wrong with one value (`key`: a key inside it), placed in the file by `structure`."""

    def __init__(self, message: str, *, key: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.key = key


@attrs.frozen
class Where:
    """Builds error messages that name the file, the place and the key."""

    path: Path
    place: str = ""

    def at(self, place: str) -> Where:
        return Where(self.path, place)

    def error(self, key: str | None, problem: str, within: tuple[str, ...] = ()) -> ScenarioError:
        parts = [str(self.path), *([self.place] if self.place else []), *within, *([f"key {key!r}"] if key else [])]
        return ScenarioError(": ".join([*parts, problem]))


def from_file(cl: type) -> tuple[str, ...]:
    """The keys a file may give for an attrs class, in declaration order."""
    return tuple(f.name for f in attrs.fields(cl))


def unknown(word: str, what: str, choices: Iterable[str], listed: Iterable[str] | None = None) -> str:
    return f"unknown {what}{suggest(word, choices, listed)}"


def _origin(t: Any) -> Any:
    """`typing.get_origin`, typed `Any` (mypy would pick its ParamSpec overload in the hooks' lambdas)."""
    return get_origin(t)


_NAMES: dict[Any, str] = {str: "a string", int: "an integer", bool: "true or false", type(None): "null"}


def _expected(t: Any) -> str:
    if t in _NAMES:
        return _NAMES[t]
    origin = _origin(t)
    if origin is Literal:
        return "one of " + ", ".join(map(str, get_args(t)))
    return "a list" if origin in (list, tuple) else "a mapping"


class WrongType(Problem):
    """A value of the wrong type: shown under a key (`not 'three'`), else (or when long) by its type."""

    def __init__(self, value: Any, t: Any, *, nullable: bool = False) -> None:
        self.expected = _expected(t) + (" or null" if nullable else "")
        super().__init__(f"must be {self.expected}, not {value!r}")
        self.value = value

    def message_at(self, path: tuple[str, ...]) -> str:
        shown = repr(self.value)
        return f"must be {self.expected}, not {shown if path and len(shown) <= 60 else _yaml_kind(self.value)}"


def _yaml_kind(value: Any) -> str:
    """What YAML calls the value (an empty file is null)."""
    kinds: list[tuple[Any, str]] = [(type(None), "null"), (bool, "true or false"), (int | float, "a number")]
    kinds += [(str, "text"), (list, "a list")]
    return next((name for kind, name in kinds if isinstance(value, kind)), type(value).__name__)


def _is(value: Any, kind: type) -> bool:
    """isinstance, except that a bool is not an int (YAML `true` is no window number)."""
    return isinstance(value, kind) and isinstance(value, bool) is (kind is bool)


def _scalar(value: Any, t: Any) -> Any:
    if not _is(value, t):
        raise WrongType(value, t)
    return value


def _is_optional(t: Any) -> bool:
    return _origin(t) in (typing.Union, types.UnionType) and type(None) in get_args(t)


def _inner(t: Any) -> Any:
    (inner,) = [a for a in get_args(t) if a is not type(None)]
    return inner


def _optional(value: Any, t: Any) -> Any:
    if value is None:  # leave the key out instead
        raise WrongType(value, _inner(t))
    return converter.structure(value, _inner(t))


def _nullable(value: Any, t: Any) -> Any:
    inner = _inner(t)
    if value is not None and inner in _NAMES and not _is(value, inner):
        raise WrongType(value, inner, nullable=True)
    return None if value is None else converter.structure(value, inner)


def _literal(value: Any, t: Any) -> Any:
    if not isinstance(value, str) or value not in get_args(t):
        raise WrongType(value, t)
    return value


def _sequence(value: Any, t: Any) -> Any:
    if not isinstance(value, list):
        raise WrongType(value, t)
    item = get_args(t)[0]
    items = []
    for v in value:
        try:
            items.append(converter.structure(v, item))
        except Problem:
            if _origin(item) is Literal:  # name the item first: the list of choices is long
                raise Problem(f"{v!r} is not {_expected(item)}") from None
            raise Problem(f"every item must be {_expected(item)}, not {v!r}") from None
    return tuple(items) if _origin(t) is tuple else items


def _keys(value: Any, t: Any, allowed: tuple[str, ...] | None) -> JSON:
    """A mapping with string keys (and, given `allowed`, only those keys)."""
    if not isinstance(value, dict):
        raise WrongType(value, t)
    for k in value:
        if not isinstance(k, str):
            raise Problem("keys must be strings", key=str(k))
        if allowed is not None and k not in allowed:
            raise Problem(unknown(k, "key", allowed), key=k)
    return value


def _mapping(value: Any, t: Any) -> JSON:
    key_type, value_type = get_args(t)
    allowed = get_args(key_type) if _origin(key_type) is Literal else None
    return {k: converter.structure(v, value_type) for k, v in _keys(value, t, allowed).items()}


def _attrs_class(cl: type) -> Callable[[Any, Any], Any]:
    attrs.resolve_types(cl)
    nullable = {f.name: override(struct_hook=_nullable) for f in attrs.fields(cl) if f.metadata.get("nullable")}
    make: Callable[..., Callable[[Any, Any], Any]] = make_dict_structure_fn  # overrides go in **kwargs
    structure_fields = make(cl, converter, **nullable)
    keys = from_file(cl)
    return lambda value, _t: structure_fields(_keys(value, cl, keys), cl)


converter = cattrs.Converter(detailed_validation=True)
for _kind in (str, int, bool):
    converter.register_structure_hook(_kind, _scalar)
converter.register_structure_hook_func(_is_optional, _optional)
converter.register_structure_hook_func(lambda t: _origin(t) is Literal, _literal)
converter.register_structure_hook_func(lambda t: _origin(t) in (list, tuple), _sequence)
converter.register_structure_hook_func(lambda t: _origin(t) in (dict, Mapping), _mapping)
converter.register_structure_hook_factory(attrs.has, _attrs_class)


def _attribute(exc: BaseException) -> str | None:
    notes = getattr(exc, "__notes__", [])
    return next((n.name for n in notes if isinstance(n, AttributeValidationNote)), None)


def _first(exc: BaseException, raw: Any, path: tuple[str, ...]) -> tuple[tuple[str, ...], str | None, str]:
    """The first problem in `exc` as (within, key, message), `path` the keys leading to `raw`."""
    if isinstance(exc, WrongType):
        return (), ".".join(path) or None, exc.message_at(path)
    if isinstance(exc, Problem):
        return (path, exc.key, exc.message) if exc.key is not None else ((), ".".join(path) or None, exc.message)
    if not isinstance(exc, ClassValidationError):
        raise exc  # not a problem with the file: a bug, let it be seen
    by_attribute: dict[str, BaseException] = {}
    for sub in exc.exceptions:
        by_attribute.setdefault(_attribute(sub) or "", sub)
    for key in raw:
        if key in by_attribute:
            return _first(by_attribute[key], raw[key], (*path, key))
    for name, missing in by_attribute.items():
        if isinstance(missing, KeyError):
            field_type = attrs.fields_dict(exc.cl)[name].type
            choices = f" ({_expected(field_type)})" if _origin(field_type) is Literal else ""
            return (), ".".join((*path, name)), f"is required{choices}"
    if "" in by_attribute:  # the class's own checks run only once every value structured
        return _first(by_attribute[""], raw, path)
    raise exc


def structure(where: Where, raw: Any, cl: type[T]) -> T:
    """`raw` (parsed YAML) as an instance of `cl`, or a `ScenarioError` naming the first problem."""
    try:
        return converter.structure(raw, cl)
    except (ClassValidationError, Problem) as e:
        within, key, message = _first(e, raw, ())
        raise where.error(key, message, within) from e
