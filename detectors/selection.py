"""Validation-based hyperparameter selection on cached features (the model never re-runs per grid point)."""
from __future__ import annotations

import itertools
from typing import Any

from detectors.base import Detector, LinearHead
from detectors.metrics import evaluate
from detectors.registry import build, detector_class
from detectors.tables import LOWER_IS_BETTER


def grid(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a `search_space` (an empty space gives one empty point)."""
    keys = list(space)
    return [dict(zip(keys, values)) for values in itertools.product(*(space[k] for k in keys))]


def select(name: str, id_val: Any, ood_val: Any, *, id_train: Any = None, head: LinearHead | None = None,
           space: dict[str, list[Any]] | None = None, metric: str = "auroc", fixed: dict[str, Any] | None = None,
           ) -> tuple[Detector, dict[str, Any], list[dict[str, Any]]]:
    """Fit `name` on `id_train` (default `id_val`) for every point of its `search_space` and keep the best by `metric`.

    Returns (fitted best detector, its parameters, one row per grid point with the point and all metrics).
    `metric` is maximised, or minimised where `detectors.tables.LOWER_IS_BETTER` says so (FPR@95). A point the data
    cannot take (the detector raises ValueError, e.g. k larger than the training bank) is recorded with its error and
    skipped.
    """
    cls = detector_class(name)
    space = cls.search_space if space is None else space
    fit_on = id_val if id_train is None else id_train
    if metric not in LOWER_IS_BETTER:
        raise ValueError(f"select: unknown metric {metric!r}; known: {sorted(LOWER_IS_BETTER)}")
    sign = -1.0 if LOWER_IS_BETTER[metric] else 1.0
    best: tuple[float, Detector, dict[str, Any]] | None = None
    table = []
    for point in grid(space):
        params = {**(fixed or {}), **point}
        try:
            det = build(name, **params).fit(fit_on, head=head, id_val=id_val)
            metrics = evaluate(det.score(id_val), det.score(ood_val))
        except ValueError as err:
            table.append({**point, "error": str(err)})
            continue
        table.append({**point, **metrics})
        if best is None or sign * metrics[metric] > best[0]:
            best = (sign * metrics[metric], det, params)
    if best is None:
        raise ValueError(f"select({name!r}): no point of the search space could be fitted: {table}")
    return best[1], best[2], table
