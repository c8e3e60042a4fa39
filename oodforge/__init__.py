"""oodforge: hard OOD data by diffusion, OOD detectors side by side, benchmark reports.

The command line is `oodforge <command>` (`oodforge --help` lists the commands); the Python API, loaded on first use:

    import oodforge
    det = oodforge.build("vim", dim=256).fit(oodforge.FeatureSet(h_train, z_train, y_train),
                                             head=oodforge.LinearHead(W, b))
    scores = det.score(oodforge.FeatureSet(h_test, z_test))   # float64 [N], higher = more in-distribution
    oodforge.evaluate(id_scores, ood_scores)                   # auroc, fpr95, fpr95_id, aupr_in, aupr_out

The packages stay `detectors` (methods, harness, reports), `gen` (generated OOD data) and `pipelines` (shared data,
models and command-line parts); these names are theirs, re-exported here.
"""
from __future__ import annotations

import importlib
from typing import Any

__version__ = "0.1.0"

API: dict[str, str] = {
    "build": "detectors.registry", "load": "detectors.registry", "available": "detectors.registry",
    "detector_class": "detectors.registry", "register_detector": "detectors.registry",
    "select": "detectors.harness.selection",
    "Detector": "detectors.base", "FeatureSet": "detectors.base", "ImageSet": "detectors.base",
    "LinearHead": "detectors.base", "Params": "pipelines.params", "param": "pipelines.params",
    "evaluate": "detectors.metrics", "auroc": "detectors.metrics", "fpr_at_tpr": "detectors.metrics",
    "threshold_at_tpr": "detectors.metrics", "precision_recall_at": "detectors.metrics",
    "transfer_threshold": "detectors.metrics",
}
"""Public name -> the module defining it (imported on first access: `import oodforge` stays light)."""

__all__ = sorted(API)


def __getattr__(name: str) -> Any:
    if name not in API:
        raise AttributeError(f"module 'oodforge' has no attribute {name!r}")
    value = getattr(importlib.import_module(API[name]), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *API])
