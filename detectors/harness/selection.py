"""Validation-based hyperparameter selection (OpenOOD's APS): every grid point fitted, ID val against OOD val scored,
the best by a metric kept.

Feature detectors sweep on cached features (the model never re-runs per grid point); image-level detectors (ODIN,
RP-ODIN, ...) sweep on the validation images, built by the runner with its shared classifier (`make`).
"""
from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from typing import Any

from detectors.base import Detector, LinearHead
from detectors.harness.protocols import TIE_RULES
from detectors.harness.results import LOWER_IS_BETTER
from detectors.metrics import METRICS, evaluate
from detectors.registry import build, detector_class


def grid(space: dict[str, list[Any]]) -> list[dict[str, Any]]:
    """Every combination of a `search_space` in OpenOOD's order (`recursive_generator`): the FIRST key varies fastest,
    the last slowest (an empty space gives one empty point). With `select`'s tie rule this decides which point a tie
    keeps, as the reference's: under `ties="last"` the tied point whose LAST key comes latest in its list wins."""
    keys = list(space)
    slowest_first = [space[k] for k in reversed(keys)]
    return [dict(zip(keys, reversed(values))) for values in itertools.product(*slowest_first)]


def select(name: str, id_val: Any, ood_val: Any, *, id_train: Any = None, head: LinearHead | None = None,
           space: dict[str, list[Any]] | None = None, metric: str = "auroc", fixed: dict[str, Any] | None = None,
           make: Callable[[dict[str, Any]], Detector] | None = None, fit_kwargs: dict[str, Any] | None = None,
           ties: str = "last") -> tuple[Detector, dict[str, Any], list[dict[str, Any]]]:
    """Fit `name` on `id_train` (default `id_val`) for every point of `space` (default its `search_space`), score ID
    val against OOD val and keep the best by `metric`.

    Returns (fitted best detector, its parameters, one row per grid point in `grid` order with the point, all metrics
    and `chosen`, True on the kept row only). `metric` is maximised, or minimised where
    `detectors.harness.results.LOWER_IS_BETTER` says so (FPR@95). Of the points equal to the best value, `ties` keeps
    the last (the reference's run) or the first (`TIE_RULES`). A NaN metric never wins; when every fitted point's metric
    is NaN the first fitted point is kept (the reference would keep its config's defaults). A point the data cannot take
    (the detector raises ValueError, e.g. k larger than the training bank) is recorded with its error and skipped.
    `make(params)` builds a point's detector (default `build(name, **params)`; the runner passes its builder, which
    adds the classifier image-level detectors need); `fit_kwargs` replace the default fit inputs (`head`, `id_val`).
    """
    cls = detector_class(name)
    space = cls.search_space if space is None else space
    fit_on = id_val if id_train is None else id_train
    if metric not in METRICS:  # what `evaluate` gives on validation
        raise ValueError(f"select: unknown metric {metric!r}; known: {sorted(METRICS)}")
    sign = -1.0 if LOWER_IS_BETTER[metric] else 1.0
    if ties not in TIE_RULES:
        raise ValueError(f"select: unknown tie rule {ties!r}; known: {list(TIE_RULES)}")
    make = make or (lambda params: build(name, **params))
    kwargs = {"head": head, "id_val": id_val} if fit_kwargs is None else fit_kwargs
    fitted: list[tuple[int, float, Detector, dict[str, Any]]] = []  # (table row, signed metric, detector, params)
    table = []
    for point in grid(space):
        params = {**(fixed or {}), **point}
        try:
            det = make(params).fit(fit_on, **kwargs)
            metrics = evaluate(det.score(id_val), det.score(ood_val))
        except ValueError as err:
            table.append({**point, "error": str(err), "chosen": False})
            continue
        table.append({**point, **metrics, "chosen": False})
        fitted.append((len(table) - 1, sign * metrics[metric], det, params))
    if not fitted:
        raise ValueError(f"select({name!r}): no point of the search space could be fitted: {table}")
    row, _, det, params = fitted[kept_index([value for _, value, _, _ in fitted], ties)]
    table[row]["chosen"] = True
    return det, params, table


def kept_index(values: list[float], ties: str = "last") -> int:
    """The position `select` keeps among signed metric `values` (higher is better): of those equal to the largest
    non-NaN value, the last or the first (`ties`); position 0 when every value is NaN."""
    finite = [v for v in values if not math.isnan(v)]
    if not finite:
        return 0
    best = max(finite)
    tied = [i for i, v in enumerate(values) if v == best]
    return tied[-1] if ties == "last" else tied[0]


def defaults_note(plan: Any) -> str | None:
    """One line for a run without OOD validation whose protocol would sweep some of its units (None otherwise)."""
    from detectors.harness.plan import selectable
    from detectors.harness.protocols import unit_sweep

    if plan.select is not None:
        return None
    names = [u.method for u in plan.units if u.kind == "detector" and selectable(u.load, u.detector)
             and unit_sweep(plan.protocol, u.detector, True, u.params)]
    if not names:
        return None
    return (f"[oodforge] no OOD validation (`ood_val`): defaults ran where protocol {plan.protocol} sweeps "
            f"({', '.join(names)})")
