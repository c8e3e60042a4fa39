"""Typed hyperparameters: every detector declares a frozen dataclass of them (type, default, one-line doc, range).

    @dataclass(frozen=True)
    class Params(Params):
        k: int = param(50, "neighbours: the score is the distance to the k-th", ge=1)

A bound is a number or a dimension name ("features": D, "classes": C) checked once the dimensions are known.
`runtime=True` marks settings that do not change the scores (device, cache folder, batch sizes, progress bars): they
stay out of a saved `config.json`, out of `search_space` and out of the recorded hyperparameters.
"""
from __future__ import annotations

import dataclasses
import numbers
import types
import typing
from typing import Any, Literal, Union

BOUNDS = {"ge": (">=", lambda v, b: v >= b), "gt": (">", lambda v, b: v > b),
          "le": ("<=", lambda v, b: v <= b), "lt": ("<", lambda v, b: v < b)}
DIMS = ("features", "classes")


def param(default: Any, doc: str, *, runtime: bool = False, **bounds: float | str) -> Any:
    """A hyperparameter field: `default` (lists and dicts are copied per instance), a one-line `doc`, optional
    bounds `ge`/`gt`/`le`/`lt` (a number or a name in DIMS) and `runtime` (see the module docstring)."""
    unknown = set(bounds) - set(BOUNDS)
    if unknown:
        raise TypeError(f"param: unknown bound(s) {sorted(unknown)}; known: {sorted(BOUNDS)}")
    meta = {"doc": doc, "runtime": runtime, "bounds": bounds}
    if isinstance(default, (list, dict)):
        return dataclasses.field(default_factory=lambda: type(default)(default), metadata=meta)
    return dataclasses.field(default=default, metadata=meta)


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
        return isinstance(value, (list, tuple)) and all(type_ok(v, args[0]) for v in value) if args else isinstance(value, (list, tuple))
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
        return cls().as_dict()

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
        """Raise ValueError naming the first parameter of the wrong type or out of its range."""
        hints = self.hints()
        for name, f in self.fields().items():
            value = getattr(self, name)
            if not type_ok(value, hints[name]):
                raise ValueError(f"{name} must be {describe(hints[name])}, got {value!r}")
            if isinstance(value, numbers.Real) and not isinstance(value, bool):
                check_bounds(name, value, f.metadata.get("bounds", {}), dims)

    def replace(self, **changes: Any) -> "Params":
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
            raise ValueError(f"{name} must be {allowed}, got {value!r} (not {symbol} {label})")
