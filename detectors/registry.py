"""The one registry of detectors: `@register_detector(name)`, `build(name, **params)`, `available(family, pattern)`."""
from __future__ import annotations

import fnmatch
import importlib
import pkgutil
from typing import Any, Callable

from detectors.base import Detector, declared_inputs

_REGISTRY: dict[str, type[Detector]] = {}
_FAMILY_PACKAGES = ("posthoc", "clip", "generative", "training")
_loaded = False


def register_detector(name: str) -> Callable[[type[Detector]], type[Detector]]:
    """Class decorator: register a Detector subclass under a lower-case `name`."""
    if name != name.lower():
        raise ValueError(f"detector names are lower-case, got {name!r}")

    def wrap(cls: type[Detector]) -> type[Detector]:
        if name in _REGISTRY and _REGISTRY[name] is not cls:
            raise ValueError(f"detector {name!r} is already registered by {_REGISTRY[name].__module__}")
        if not cls.family:
            raise ValueError(f"{cls.__name__} must set `family`")
        cls.name = name
        cls.fit_inputs, cls.needs = declared_inputs(cls)
        _REGISTRY[name] = cls
        return cls

    return wrap


def _load_all() -> None:
    """Import every module of the family packages once so that their decorators run."""
    global _loaded
    if _loaded:
        return
    for family in _FAMILY_PACKAGES:
        package = importlib.import_module(f"detectors.{family}")
        for info in pkgutil.iter_modules(package.__path__):
            if not info.name.startswith("_"):
                importlib.import_module(f"detectors.{family}.{info.name}")
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


def available(family: str | None = None, pattern: str | None = None) -> list[str]:
    """Registered names, optionally of one family and matching a glob `pattern`, sorted."""
    _load_all()
    names = [n for n, c in _REGISTRY.items() if family is None or c.family == family]
    if pattern:
        names = fnmatch.filter(names, pattern)
    return sorted(names)
