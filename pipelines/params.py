"""The one typed config layer: detector hyperparameters (`Params`) and every config (`Config`), as frozen dataclasses
whose fields carry a type, a default, a one-line doc and a range.

    @dataclass(frozen=True)
    class Params(Params):
        k: int = param(50, "neighbours: the score is the distance to the k-th", ge=1)

A bound is a number or a dimension name ("features": D, "classes": C) checked once the dimensions are known.
`runtime=True` marks settings that do not change the scores (device, cache folder, batch sizes, progress bars): they
stay out of a saved `config.json`, out of `search_space` and out of the recorded hyperparameters.
"""
from __future__ import annotations

import collections.abc
import dataclasses
import functools
import numbers
import os
import types
import typing
from collections.abc import Mapping, Sequence
from typing import Any, Literal, TypeVar, Union

from pipelines.errors import ConfigError, closest

BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b),
          "le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}
DIMS = ("features", "classes")


def param(default: Any, doc: str, *, runtime: bool = False, check: Any = None, **bounds: float | str) -> Any:
    """A typed field: `default` (lists and dicts are copied per instance; `REQUIRED` for a key the user must give),
    a one-line `doc`, optional bounds `ge`/`gt`/`le`/`lt` (a number or a name in DIMS), `runtime` (see the module
    docstring) and `check(value, key)`, a callable raising ConfigError (a path that must exist, say), run by
    `Config.from_dict`."""
    unknown = set(bounds) - set(BOUNDS)
    if unknown:
        raise TypeError(f"param: unknown bound(s) {sorted(unknown)}; known: {sorted(BOUNDS)}")
    meta = {"doc": doc, "runtime": runtime, "bounds": bounds, "check": check}
    if default is dataclasses.MISSING:
        return dataclasses.field(metadata=meta)
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


_EXACT = {float: (float, int), int: (int,)}
"""Element types that pass `type_ok` at a glance (a list of thousands of floats is checked at every build)."""


def type_ok(value: Any, hint: Any) -> bool:
    """True when `value` is of the annotated type (ints count as floats; bools are neither)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if hint is Any:
        return True
    if origin in (Union, types.UnionType):
        return any(type_ok(value, a) for a in args)
    if origin is Literal:
        return any(value == a and type(value) is type(a) for a in args)
    if hint is type(None):
        return value is None
    if hint is float:
        return isinstance(value, numbers.Real) and not isinstance(value, bool)
    if hint is int:
        return isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if origin in (list, tuple, typing.Sequence) or hint in (list, tuple):
        if not isinstance(value, (list, tuple)) or not args:
            return isinstance(value, (list, tuple))
        exact = _EXACT.get(args[0], ())
        return all(type(v) in exact or type_ok(v, args[0]) for v in value)
    if origin is dict or hint is dict:
        return isinstance(value, dict)
    return isinstance(value, origin or hint)


def describe(hint: Any) -> str:
    """The annotated type in words, for error messages."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (Union, types.UnionType):
        return " or ".join(describe(a) for a in args)
    names = {int: "an integer", float: "a number", bool: "true or false", str: "a string", type(None): "null (None)"}
    if hint in names:
        return names[hint]
    if origin in (list, tuple, typing.Sequence):
        return f"a list (items: {describe(args[0]) if args else 'any'})"
    return getattr(hint, "__name__", str(hint))


class ParamError(ValueError):
    """A parameter of the wrong type or out of range: `key` names it, `problem` says what is allowed."""

    def __init__(self, key: str, problem: str):
        super().__init__(f"{key} {problem}")
        self.key, self.problem = key, problem


@dataclasses.dataclass(frozen=True)
class Params:
    """Base of every detector's hyperparameters; `check` validates types and ranges (dimension bounds when known).
    Errors name the parameter; the detector adds its own name (`Detector.check_params`)."""

    def __post_init__(self) -> None:
        self.check()

    @classmethod
    def fields(cls) -> dict[str, dataclasses.Field]:
        return {f.name: f for f in dataclasses.fields(cls)}

    @classmethod
    def hints(cls) -> dict[str, Any]:
        return typing.get_type_hints(cls)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every field's default (a fresh copy of list defaults)."""
        return {n: f.default if f.default_factory is dataclasses.MISSING else f.default_factory()
                for n, f in cls.fields().items() if f.default is not dataclasses.MISSING
                or f.default_factory is not dataclasses.MISSING}

    @classmethod
    def choices(cls, name: str) -> tuple[Any, ...]:
        """The values a `Literal` field allows, in their declared order (the one list of them)."""
        hint = cls.hints()[name]
        if typing.get_origin(hint) is not Literal:
            raise TypeError(f"{cls.__name__}.{name} is not a Literal field: {describe(hint)}")
        return typing.get_args(hint)

    @classmethod
    def runtime(cls) -> frozenset[str]:
        """Names of the runtime settings (kept out of saved configs and sweeps)."""
        return frozenset(n for n, f in cls.fields().items() if f.metadata.get("runtime"))

    @classmethod
    def doc(cls, name: str) -> str:
        return cls.fields()[name].metadata.get("doc", "")

    def as_dict(self) -> dict[str, Any]:
        """{name: value} of every field (values not copied)."""
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)}

    def check(self, dims: dict[str, int] | None = None) -> None:
        """Raise ParamError (a ValueError) naming the first parameter of the wrong type or out of its range."""
        hints = self.hints()
        for name, f in self.fields().items():
            value = getattr(self, name)
            if not type_ok(value, hints[name]):
                raise ParamError(name, f"must be {describe(hints[name])}, got {value!r}")
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                check_bounds(name, value, f.metadata.get("bounds", {}), dims)

    def replace(self, **changes: Any) -> Params:
        return dataclasses.replace(self, **changes)


def check_bounds(name: str, value: float, bounds: dict[str, Any], dims: dict[str, int] | None) -> None:
    """ValueError when `value` breaks a bound; bounds naming a dimension apply once `dims` gives it."""
    for key, bound in bounds.items():
        if isinstance(bound, str):
            if not dims or dims.get(bound) is None:
                continue
            label, bound = f"{bound} ({dims[bound]})", dims[bound]
        else:
            label = str(bound)
        symbol, holds = BOUNDS[key]
        if not holds(value, bound):
            allowed = " and ".join(f"{BOUNDS[k][0]} {b}" for k, b in bounds.items())
            raise ParamError(name, f"must be {allowed}, got {value!r} (not {symbol} {label})")


# -- typed configs: one loader, one error path -------------------------------------------------------------------

config = functools.partial(dataclasses.dataclass, frozen=True, kw_only=True)
"""The decorator of every config class: `@config class EvalConfig(Config): ...` (frozen, keyword-only fields)."""

C = TypeVar("C", bound="Config")

REQUIRED: Any = dataclasses.MISSING
"""`param(REQUIRED, "doc")`: a key the user must give (a `Config.from_dict` without it is one error naming it)."""


@dataclasses.dataclass(frozen=True)
class Config(Params):
    """Base of every typed config (evaluation and its sections, generation, ZeST, training, splits).

    `from_dict(mapping, where)` is the one loader: nested configs, lists and mappings of them, unions, `Literal`
    enumerations, bounds and per-field `check`s, each fault one `ConfigError` naming the dotted key (an unknown key
    with its closest match). `to_dict()` gives the mapping back (a YAML round trip is equal). A subclass may accept a
    shorthand (a bare string for a `Source`) by overriding `from_value`.
    """

    SHORTHAND: typing.ClassVar[str | None] = None
    """The key a bare string stands for (`Source`: "manifest", a detector entry: "name"); None: no shorthand."""

    @classmethod
    def from_value(cls, value: Any, where: str) -> Config:
        """Build from a config value: a mapping, or a bare string for the `SHORTHAND` key (subclasses may add more)."""
        if isinstance(value, cls):
            return value
        if isinstance(value, str) and cls.SHORTHAND is not None:
            value = {cls.SHORTHAND: value}
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: a mapping of {cls.__name__} keys ({', '.join(sorted(cls.fields()))}), "
                              f"got {_shown(value)}", doc=cls.doc_ref())
        return cls.from_dict(value, where)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> Config:
        """The typed value of `raw`; every fault is one `ConfigError` naming `where.key`."""
        fields = cls.fields()
        for key in raw:
            if key not in fields:
                raise ConfigError(f"{_join(where, key)}: unknown key{closest(str(key), list(fields))}",
                                  doc=cls.doc_ref())
        made = cls._construct(cls._converted(raw, where), where)
        for name, f in fields.items():
            check = f.metadata.get("check")
            if check is not None:
                check(getattr(made, name), _join(where, name))
        return made

    @classmethod
    def _converted(cls, raw: dict[str, Any], where: str) -> dict[str, Any]:
        """The given fields converted to their types; a required field absent raises."""
        fields, hints = cls.fields(), cls.hints()
        values: dict[str, Any] = {}
        for name, f in fields.items():
            key = _join(where, name)
            if name not in raw:
                if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
                    raise ConfigError(f"{key}: required ({cls.doc(name) or describe(hints[name])})", doc=cls.doc_ref())
                continue
            values[name] = convert(raw[name], hints[name], key)
        return values

    @classmethod
    def _construct(cls, values: dict[str, Any], where: str) -> Config:
        """The dataclass of `values`: a field's bound (ParamError) or a cross-field check becomes a ConfigError."""
        try:
            return cls(**values)
        except ConfigError:
            raise
        except ParamError as err:  # a bound of one field
            raise ConfigError(f"{_join(where, err.key)}: {err.problem}", doc=cls.doc_ref()) from None
        except (ValueError, TypeError) as err:  # cross-field checks of `check()`
            raise ConfigError(f"{where}: {err}", doc=cls.doc_ref()) from None

    @classmethod
    def from_yaml(cls: type[C], path: str | os.PathLike | None, overrides: Sequence[str] | None = None,
                  flags: Mapping[str, tuple[str | tuple[str, ...], Any]] | None = None) -> C:
        """The one loader of every command's config: the YAML file `path` (its `base:` chain merged in; None: no
        file), then the `key=value` overrides, then `flags`, the command's flags given on its command line as
        shorthands of keys ({flag: (dotted key, value)}; a tuple of keys takes one item of the value each; a mapping
        value fills the keys it names), so a flag wins over the file and the overrides. Every fault is one
        ConfigError naming where the bad value came from: the flag, else the file (`pipelines.cli.blame_override`
        then names an override), and the key."""
        from pipelines.configfile import apply_overrides, display_path, load_yaml, set_key

        raw = load_yaml(path, overrides) if path is not None else apply_overrides({}, overrides)
        given: dict[str, str] = {}
        for flag, (keys, value) in (flags or {}).items():
            for key, item in (zip(keys, value, strict=True) if isinstance(keys, tuple) else [(keys, value)]):
                set_key(raw, key, item, flag, merge=True)
                given[key] = flag
        try:
            return cls.from_dict(raw, "")
        except ConfigError as err:
            raise _blamed(err, given, None if path is None else display_path(path), cls.doc_ref()) from None

    @classmethod
    def doc_ref(cls) -> str | None:
        """Where this config's keys are documented (README section or docs/ file); subclasses set `DOC`."""
        return getattr(cls, "DOC", None)

    def to_dict(self) -> dict[str, Any]:
        """The config as plain values (nested configs as mappings): `from_dict(to_dict())` is equal."""
        return {name: plain(getattr(self, name)) for name in self.fields()}


def _blamed(err: ConfigError, flags: dict[str, str], path: str | None, doc: str | None) -> ConfigError:
    """`err` (`key: problem`) naming its source: the flag that set the key (the rest of a longer key follows it,
    `--box mars`), else the file `path`, else the key alone; `doc` (the loaded config's page, where its user reads)
    names where the keys are documented, else `err`'s own."""
    doc = doc or err.doc
    key, found, rest = str(err).partition(": ")
    if not found or " " in key:
        return ConfigError(str(err) if path is None else f"{path}: {err}", doc=doc)
    dotted = key.replace("[", ".").replace("]", "")
    for set_by in sorted(flags, key=len, reverse=True):  # the flag of the longest key: --threshold, not --filter
        if dotted == set_by or dotted.startswith(set_by + "."):
            return ConfigError(" ".join([flags[set_by], *dotted[len(set_by) + 1:].split(".")]).strip() + f": {rest}",
                               doc=doc)
    text = f"{key}: {rest}" if key else rest
    return ConfigError(text if path is None else f"{path}: {text}", doc=doc)


def plain(value: Any) -> Any:
    """A config value as plain YAML-ready data (configs as mappings, tuples as lists)."""
    if isinstance(value, Config):
        return value.to_dict()
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    if isinstance(value, dict):
        return {k: plain(v) for k, v in value.items()}
    return value


def convert(value: Any, hint: Any, where: str) -> Any:
    """`value` as the annotated type `hint` (ints widen to floats; nested configs built), or one ConfigError naming
    `where` and what is allowed."""
    origin = typing.get_origin(hint)
    if hint is Any:
        return value
    if isinstance(hint, type) and issubclass(hint, Config):
        return hint.from_value(value, where)
    if origin in (Union, types.UnionType):
        return _convert_union(value, hint, where)
    if origin is Literal:
        return _convert_literal(value, hint, where)
    if origin in (list, tuple, typing.Sequence, collections.abc.Sequence) or hint in (list, tuple):
        return _convert_sequence(value, hint, where)
    if origin is dict or hint is dict:
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: must be a mapping, got {_shown(value)}")
        args = typing.get_args(hint)
        item = args[1] if len(args) == 2 else Any
        return {k: convert(v, item, _join(where, str(k))) for k, v in value.items()}
    if hint is float and isinstance(value, numbers.Real) and not isinstance(value, bool):
        return float(value)
    if type_ok(value, hint):
        return value
    raise ConfigError(f"{where}: must be {describe(hint)}, got {_shown(value)}")


def _convert_union(value: Any, hint: Any, where: str) -> Any:
    """`convert` for `X | Y | None`: the first arm that takes the value; else the one fault that says most (the only
    arm's, or the one arm that got inside the value), else what the union allows (with the closest literal word)."""
    args = typing.get_args(hint)
    if value is None and type(None) in args:
        return None
    errors = []
    arms = [a for a in args if a is not type(None)]
    if isinstance(value, dict):  # a mapping is meant for the config arm: its own fault, named, is the error
        arms = [a for a in arms if isinstance(a, type) and issubclass(a, Config)] or arms
    for arm in arms:
        try:
            return convert(value, arm, where)
        except ConfigError as err:
            errors.append(err)
    if len(errors) == 1:
        raise errors[0]
    deeper = [e for e in errors if str(e).split(":", 1)[0] != where]  # an arm that got inside the value
    if len(deeper) == 1:
        raise deeper[0]
    words = [a for arm in arms if typing.get_origin(arm) is Literal
             for a in typing.get_args(arm) if isinstance(a, str)]
    hint_text = closest(value, words) if isinstance(value, str) and words else ""
    raise ConfigError(f"{where}: must be {describe(hint)}, got {_shown(value)}{hint_text}")


def _convert_literal(value: Any, hint: Any, where: str) -> Any:
    """`convert` for `Literal[...]`: one of the values, of the same type (True is not 1)."""
    args = typing.get_args(hint)
    if any(value == a and type(value) is type(a) for a in args):
        return value
    hint_text = closest(str(value), [str(a) for a in args]) if isinstance(value, str) else ""
    raise ConfigError(f"{where}: must be one of {', '.join(map(repr, args))}, got {_shown(value)}{hint_text}")


def _convert_sequence(value: Any, hint: Any, where: str) -> Any:
    """`convert` for lists and tuples: a YAML list, each item converted (`tuple[X, Y]`: that many, each its type)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if not isinstance(value, (list, tuple)):
        extra = f" (write [{value}])" if isinstance(value, str) else ""
        raise ConfigError(f"{where}: must be {describe(hint)}, got {_shown(value)}{extra}")
    if origin is tuple and args and not (len(args) == 2 and args[1] is Ellipsis):  # tuple[X, Y, Z]: fixed length
        if len(value) != len(args):
            raise ConfigError(f"{where}: must be {len(args)} values, got {_shown(value)}")
        return tuple(convert(v, a, f"{where}[{i}]") for i, (v, a) in enumerate(zip(value, args)))
    item = args[0] if args else Any
    items = [convert(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    return tuple(items) if origin is tuple or hint is tuple else items


def _join(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _shown(value: Any) -> str:
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 60 else text[:57] + '...'}"
