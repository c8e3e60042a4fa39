"""OOD detectors behind one protocol (see detectors.base.Detector) and one registry.

`select` (validation-based hyperparameter selection) belongs to the experiment harness and is imported on first use,
so that `import detectors` for `build(...).fit(...).score(...)` loads no harness module."""
from typing import Any

from detectors.base import Detector, FeatureSet, ImageSet, LinearHead
from detectors.registry import available, build, detector_class, load, register_detector
from pipelines.params import Params, param

__all__ = ["Detector", "FeatureSet", "ImageSet", "LinearHead", "Params", "available", "build", "detector_class", "load",
           "param", "register_detector", "select"]


def __getattr__(name: str) -> Any:
    """`detectors.select`, imported from the harness when first asked for (PEP 562)."""
    if name == "select":
        from detectors.harness.selection import select
        return select
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
