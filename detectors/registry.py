"""The one registry of detectors: `@register_detector(name)`, `build(name, **params)`, `load(folder)`,
`available(family, pattern)`. Registration checks each class's declarations (Params, fit_inputs, needs,
search_space)."""
from __future__ import annotations

import dataclasses
import fnmatch
import importlib
import inspect
import os
import pkgutil
from typing import Any, Callable

from detectors.base import FIT_INPUTS, PROTOCOL_FIT, RUNTIME_INPUTS, Detector, Params, read_config

_REGISTRY: dict[str, type[Detector]] = {}
FAMILY_LABELS: dict[str, str] = {"posthoc": "Post-hoc", "training": "Training-time", "generative": "Generation-based",
                                 "clip": "VLM-based"}
"""The detector families, one package each (`FAMILY_PACKAGES`), in the reports' order, with the names the papers
print (ShiftedBronzes' Tables 3 and 4, Figure 5): the one list of them."""
FAMILIES: tuple[str, ...] = tuple(FAMILY_LABELS)
FAMILY_PACKAGES: dict[str, str] = {family: f"detectors.{family}" for family in FAMILIES} | {
    "training": "detectors.training_time"}
"""The package of each family's detectors (the training-time methods' is named apart from the classifier training
loop, `pipelines.training`)."""
_loaded = False


def register_detector(name: str) -> Callable[[type[Detector]], type[Detector]]:
    """Class decorator: register a Detector subclass under a lower-case `name` after checking its declarations."""
    if name != name.lower():
        raise ValueError(f"detector names are lower-case, got {name!r}")

    def wrap(cls: type[Detector]) -> type[Detector]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"detector {name!r} is already registered by {_REGISTRY[name].__module__}")
        if not cls.family:
            raise ValueError(f"{cls.__name__} must set `family`")
        cls.name = name
        check_declarations(cls)
        _REGISTRY[name] = cls
        return cls

    return wrap


def check_declarations(cls: type[Detector]) -> None:
    """ValueError when a class's Params, fit_inputs, needs or search_space disagree with each other or with what
    `fit` and `__init__` accept."""
    who = f"{cls.__module__}.{cls.__name__} ({cls.name})"
    params = cls.Params
    if not (dataclasses.is_dataclass(params) and issubclass(params, Params) and params.__dataclass_params__.frozen):
        raise ValueError(f"{who}: Params must be a frozen dataclass subclassing pipelines.params.Params")
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
    fields, runtime = cls.Params.fields(), cls.Params.runtime()
    for key, values in cls.search_space.items():
        if key not in fields or key in runtime:
            raise ValueError(f"{who}: search_space key {key!r} is not a hyperparameter; known: "
                             f"{sorted(set(fields) - runtime)}")
        if not isinstance(values, list) or not values:
            raise ValueError(f"{who}: search_space[{key!r}] must be a non-empty list, got {values!r}")
        for value in values:
            try:
                cls.Params(**{key: value})
            except ValueError as err:
                raise ValueError(f"{who}: search_space[{key!r}]: {err}") from None


def _load_all() -> None:
    """Import every module of the family packages once so that their decorators run."""
    global _loaded
    if _loaded:
        return
    for family in FAMILIES:
        package = importlib.import_module(FAMILY_PACKAGES[family])
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"{FAMILY_PACKAGES[family]}.{info.name}")
    _loaded = True


def detector_class(name: str) -> type[Detector]:
    """The class registered as `name`."""
    _load_all()
    try:
        return _REGISTRY[name.lower()]
    except KeyError:
        close = fnmatch.filter(_REGISTRY, f"*{name.lower()}*")
        hint = f"; did you mean {close}?" if close else ""
        raise KeyError(f"unknown detector {name!r}{hint} Available: {sorted(_REGISTRY)}") from None


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
