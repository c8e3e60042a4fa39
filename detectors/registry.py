"""The one registry of detectors: `@register_detector(name)`, `build(name, **params)`, `load(folder)`,
`available(family, pattern)`. Registration checks each class's declarations (Params, fit_inputs, needs,
search_space, grids) and its `aliases`: the names people use in pytorch-ood and OpenOOD, resolved case-insensitively
with a one-time note."""
from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
import inspect
import logging
import os
import pkgutil
from collections.abc import Callable
from typing import Any

from detectors.base import FIT_INPUTS, PROTOCOL_FIT, RUNTIME_INPUTS, Detector, Params, read_config

log = logging.getLogger(__name__)

_REGISTRY: dict[str, type[Detector]] = {}
_ALIASES: dict[str, tuple[str, str, str]] = {}
"""alias (lower-case) -> (the alias as its library writes it, the registered name, whose name it is)."""
_NOTED: set[str] = set()
FAMILY_LABELS: dict[str, str] = {"posthoc": "Post-hoc", "training": "Training-time", "generative": "Generation-based",
                                 "clip": "VLM-based"}
"""The detector families, one package each (`FAMILY_PACKAGES`), in the reports' order, with the names the papers
print (ShiftedBronzes' Tables 3 and 4, Figure 5): the one list of them."""
FAMILIES: tuple[str, ...] = tuple(FAMILY_LABELS)
FAMILY_PACKAGES: dict[str, str] = {family: f"detectors.{family}" for family in FAMILIES} | {
    "training": "detectors.training_time"}
"""The package of each family's detectors (the training-time methods' is named apart from the classifier training
loop, `pipelines.training`)."""
_LOADED: set[str] = set()
"""The families whose modules were imported (filled by `_load_all`, never rebound)."""


def register_detector(name: str) -> Callable[[type[Detector]], type[Detector]]:
    """Class decorator: register a Detector subclass under a lower-case `name` after checking its declarations."""
    if name != name.lower():
        raise ValueError(f"detector names are lower-case, got {name!r}")

    def wrap(cls: type[Detector]) -> type[Detector]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"detector {name!r} is already registered by {_REGISTRY[name].__module__}")
        if not cls.family:
            raise ValueError(f"{cls.__name__} must set `family`")
        if not cls.__dict__.get("label"):  # never a parent's (RP-ODIN is no ODIN): the name as it is
            cls.label = name
        if name in _ALIASES:
            raise ValueError(f"detector name {name!r} is already an alias of {_ALIASES[name][1]!r}")
        cls.name = name
        check_declarations(cls)
        _register_aliases(cls, name)
        _REGISTRY[name] = cls
        return cls

    return wrap


def _register_aliases(cls: type[Detector], name: str) -> None:
    """Record the class's own `aliases` (ValueError on one that is a registered name or another method's alias)."""
    for alias, whose in cls.__dict__.get("aliases", {}).items():
        key = alias.lower()
        if key == name or key in _REGISTRY or _ALIASES.get(key, (alias, name))[1] != name:
            taken = name if key == name else _ALIASES[key][1] if key in _ALIASES else key
            raise ValueError(f"{cls.__name__}: alias {alias!r} is already the name or an alias of {taken!r}")
        _ALIASES[key] = (alias, name, whose)


def check_declarations(cls: type[Detector]) -> None:
    """ValueError when a class's Params, fit_inputs, needs or search_space disagree with each other or with what
    `fit` and `__init__` accept."""
    who = f"{cls.__module__}.{cls.__name__} ({cls.name})"
    params = cls.Params
    if not (dataclasses.is_dataclass(params) and issubclass(params, Params) and params.__dataclass_params__.frozen):
        raise ValueError(f"{who}: Params must be a frozen dataclass subclassing pipelines.params.Params")
    shadowed = set(params.fields()) & set(Detector.__annotations__)
    if shadowed:
        raise ValueError(f"{who}: parameter(s) {sorted(shadowed)} would be shadowed by the Detector class attributes "
                         "of the same name (self.<name> reads the class attribute): rename them")
    _check_fit_inputs(cls, who)
    _check_needs(cls, who)
    _check_search_space(cls, who)


def _check_fit_inputs(cls: type[Detector], who: str) -> None:
    accepted = set(inspect.signature(cls.fit).parameters) & set(FIT_INPUTS)
    if not cls.fit_inputs <= set(FIT_INPUTS):
        raise ValueError(f"{who}: fit_inputs {sorted(cls.fit_inputs - set(FIT_INPUTS))} are not among {FIT_INPUTS}")
    if not cls.fit_inputs <= accepted:
        raise ValueError(f"{who}: fit_inputs declares {sorted(cls.fit_inputs - accepted)}, which fit() does not accept")
    undeclared = accepted - set(PROTOCOL_FIT) - cls.fit_inputs
    if undeclared:
        raise ValueError(f"{who}: fit() accepts {sorted(undeclared)}, missing from fit_inputs")
    if cls.needs_head and "head" not in cls.fit_inputs:
        raise ValueError(f"{who}: needs_head without 'head' in fit_inputs")


def _check_needs(cls: type[Detector], who: str) -> None:
    if not cls.needs <= set(RUNTIME_INPUTS):
        raise ValueError(f"{who}: needs {sorted(cls.needs - set(RUNTIME_INPUTS))} are not among {RUNTIME_INPUTS}")
    taken = (cls.init_arguments() | set(cls.Params.fields())) & set(RUNTIME_INPUTS)
    if set(cls.needs) != taken:
        raise ValueError(f"{who}: needs {sorted(cls.needs)} but the constructor takes {sorted(taken)} of "
                         f"{RUNTIME_INPUTS}")


def _check_search_space(cls: type[Detector], who: str) -> None:
    grids = {"search_space": cls.search_space} | {f"grids[{p!r}]": g for p, g in cls.grids.items() if g is not None}
    for where, grid in grids.items():
        _check_grid(cls, who, where, grid)
    for protocol, values in cls.protocol_defaults.items():
        try:
            cls.Params(**values)
        except (TypeError, ValueError) as err:
            raise ValueError(f"{who}: protocol_defaults[{protocol!r}]: {err}") from None


def _check_grid(cls: type[Detector], who: str, where: str, grid: dict[str, list[Any]]) -> None:
    fields, runtime = cls.Params.fields(), cls.Params.runtime()
    for key, values in grid.items():
        if key not in fields or key in runtime:
            raise ValueError(f"{who}: {where} key {key!r} is not a hyperparameter; known: "
                             f"{sorted(set(fields) - runtime)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{who}: {where}[{key!r}] must be a non-empty list, got {values!r}")
        for value in values:
            try:
                cls.Params(**{key: value})
            except ValueError as err:
                raise ValueError(f"{who}: {where}[{key!r}]: {err}") from None


def _load_all() -> None:
    """Import every module of the family packages once so that their decorators run."""
    for family in FAMILIES:
        if family in _LOADED:
            continue
        package = importlib.import_module(FAMILY_PACKAGES[family])
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{FAMILY_PACKAGES[family]}.{info.name}")
        _LOADED.add(family)


def detector_class(name: str, family: str | None = None) -> type[Detector]:
    """The class registered as `name`, or the one a pytorch-ood / OpenOOD name is an alias of (any case; a one-time
    note says so). An unknown name raises KeyError with the closest names, those of `family` first, then post-hoc
    before the other families."""
    _load_all()
    key = name.lower()
    if key in _REGISTRY:
        return _REGISTRY[key]
    if key in _ALIASES:
        written, target, whose = _ALIASES[key]
        if key not in _NOTED:
            _NOTED.add(key)
            log.info("note: %s is %s name for %s (%s)", name, whose, target, _REGISTRY[target].label)
        return _REGISTRY[target]
    close = suggestions(name, family)
    hint = f"; did you mean {', '.join(close)}?" if close else ""
    raise KeyError(f"unknown detector {name!r}{hint} Available: {sorted(_REGISTRY)}") from None


LISTING_ORDER: tuple[str, ...] = ("posthoc", "clip", "generative", "training")
"""The families' order in listings (the report's method names, "did you mean"): post-hoc (no training, no auxiliary
data) first."""


def suggestions(name: str, family: str | None = None, n: int = 3) -> list[str]:
    """Up to `n` registered names close to `name` (by name or alias), `family`'s first, then by `LISTING_ORDER`;
    each shown as `name (Family)`."""
    _load_all()
    key = name.lower()
    known = {**{k: k for k in _REGISTRY}, **{a: target for a, (_, target, _) in _ALIASES.items()}}
    close = difflib.get_close_matches(key, known, n=10, cutoff=0.6)
    close += [k for k in known if len(key) >= 3 and (key in k or (len(k) >= 3 and k in key)) and k not in close]
    names = list(dict.fromkeys(known[k] for k in close))
    order = ((family,) if family else ()) + LISTING_ORDER
    names.sort(key=lambda n: order.index(_REGISTRY[n].family) if _REGISTRY[n].family in order else len(order))
    return [f"{n} ({FAMILY_LABELS.get(_REGISTRY[n].family, _REGISTRY[n].family)})" for n in names[:n]]


def aliases() -> dict[str, tuple[str, str]]:
    """Every alias as its library writes it -> (the registered name, whose name it is)."""
    _load_all()
    return {written: (target, whose) for written, target, whose in _ALIASES.values()}


def build(name: str, **params: Any) -> Detector:
    """Instantiate the detector registered as `name` with `params` over its defaults."""
    return detector_class(name)(**params)


def load(folder: str | os.PathLike, **overrides: Any) -> Detector:
    """The detector saved in `folder` (`save_pretrained`), built by the class its `config.json` names; `overrides` add
    runtime objects (classifier, model, device ...) or change parameters."""
    return detector_class(read_config(folder)["name"]).from_pretrained(folder, **overrides)


def available(family: str | None = None, pattern: str | None = None) -> list[str]:
    """Registered names, optionally of one family and matching a glob `pattern`, sorted."""
    _load_all()
    names = [n for n, c in _REGISTRY.items() if family is None or c.family == family]
    if pattern:
        names = fnmatch.filter(names, pattern)
    return sorted(names)


Detector.class_of = staticmethod(detector_class)
