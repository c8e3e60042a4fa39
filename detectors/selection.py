"""Validation-based hyperparameter selection (OpenOOD's APS): every grid point fitted, ID val against OOD val scored,
the best by a metric kept.

Feature detectors sweep on cached features (the model never re-runs per grid point); image-level detectors (ODIN,
RP-ODIN, ...) sweep on the validation images, built by the runner with its shared classifier (`make`).
"""
from __future__ import annotations

import itertools
import math
from typing import Any, Callable

from detectors.base import Detector, LinearHead
from detectors.metrics import evaluate
from detectors.registry import build, detector_class
from detectors.tables import LOWER_IS_BETTER


def grid(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a `search_space` in OpenOOD's order (`Evaluator.recursive_generator`): the FIRST key varies
    fastest, the last slowest (an empty space gives one empty point). With `select`'s first-maximum rule this decides
    which point a tie keeps, as the reference's."""
    keys = list(space)
    slowest_first = [space[k] for k in reversed(keys)]
    return [dict(zip(keys, reversed(values))) for values in itertools.product(*slowest_first)]


def select(name: str, id_val: Any, ood_val: Any, *, id_train: Any = None, head: LinearHead | None = None,
           space: dict[str, list[Any]] | None = None, metric: str = "auroc", fixed: dict[str, Any] | None = None,
           make: Callable[[dict[str, Any]], Detector] | None = None, fit_kwargs: dict[str, Any] | None = None,
           ) -> tuple[Detector, dict[str, Any], list[dict[str, Any]]]:
    """Fit `name` on `id_train` (default `id_val`) for every point of `space` (default its `search_space`), score ID
    val against OOD val and keep the best by `metric`.

    Returns (fitted best detector, its parameters, one row per grid point with the point and all metrics).
    `metric` is maximised, or minimised where `detectors.tables.LOWER_IS_BETTER` says so (FPR@95); the first best
    point wins a tie (OpenOOD: `if auroc > max_auroc`), a NaN metric never wins. A point the data cannot take (the
    detector raises ValueError, e.g. k larger than the training bank) is recorded with its error and skipped.
    `make(params)` builds a point's detector (default `build(name, **params)`; the runner passes its builder, which
    adds the classifier image-level detectors need); `fit_kwargs` replace the default fit inputs (`head`, `id_val`).
    """
    cls = detector_class(name)
    space = cls.search_space if space is None else space
    fit_on = id_val if id_train is None else id_train
    if metric not in LOWER_IS_BETTER:
        raise ValueError(f"select: unknown metric {metric!r}; known: {sorted(LOWER_IS_BETTER)}")
    sign = -1.0 if LOWER_IS_BETTER[metric] else 1.0
    make = make or (lambda params: build(name, **params))
    kwargs = {"head": head, "id_val": id_val} if fit_kwargs is None else fit_kwargs
    best: tuple[float, Detector, dict[str, Any]] | None = None
    table = []
    for point in grid(space):
        params = {**(fixed or {}), **point}
        try:
            det = make(params).fit(fit_on, **kwargs)
            metrics = evaluate(det.score(id_val), det.score(ood_val))
        except ValueError as err:
            table.append({**point, "error": str(err)})
            continue
        table.append({**point, **metrics})
        value = sign * metrics[metric]
        if best is None or (not math.isnan(value) and (math.isnan(best[0]) or value > best[0])):
            best = (value, det, params)
    if best is None:
        raise ValueError(f"select({name!r}): no point of the search space could be fitted: {table}")
    return best[1], best[2], table


def defaults_note(plan: Any) -> str | None:
    """One line for a run without OOD validation whose protocol would sweep some of its units (None otherwise)."""
    from detectors.plan import selectable
    from detectors.protocols import unit_sweep

    if plan.select is not None:
        return None
    names = [u.method for u in plan.units if u.kind == "detector" and selectable(u.load, u.detector)
             and unit_sweep(plan.protocol, u.detector, True, u.params)]
    if not names:
        return None
    return (f"[oodforge] no OOD validation (`ood_val`): defaults ran where protocol {plan.protocol} sweeps "
            f"({', '.join(names)})")
