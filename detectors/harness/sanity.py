"""Warnings for numbers that mean nothing, one line each, logged before a user reads them: a classifier head whose
outputs are not the ID classes, ID accuracy at chance or zero, an ID set of one class, sets too small for AUROC's 95%
interval to be narrower than `MAX_INTERVAL` points, and a classifier evaluated under another protocol (other pixels)
than it was trained and tested under.

The interval uses Hanley & McNeil's standard error of the AUROC (Radiology 143:29-36, 1982, eq. 2), ID rows the
positives (scores are higher for ID):

    SE(A)^2 = (A (1 - A) + (n_id - 1) (Q1 - A^2) + (n_ood - 1) (Q2 - A^2)) / (n_id n_ood),
    Q1 = A / (2 - A),  Q2 = 2 A^2 / (1 + A)

and the 95% interval A +- 1.96 SE. The size check takes the widest interval over A from 0.5 to 1 (at or a little
above 0.5: the sizes alone decide whether a set can resolve 10 points); the formula gives SE 0 at A = 1, so the
observed AUROC of a tiny set cannot vouch for it.
"""
from __future__ import annotations

import json
import math
from collections.abc import Iterable
from pathlib import Path

import numpy as np
import pandas as pd

TRAIN_CONFIG = "train_config.json"
"""The resolved training config a train-classifier folder holds (pipelines.training.classify)."""
MAX_INTERVAL = 10.0
"""The widest 95% interval of AUROC (percentage points, the whole width) a set may have without a warning."""
Z95 = 1.959963984540054
"""The normal quantile of a two-sided 95% interval."""


def hanley_mcneil_se(auroc: float, n_id: int, n_ood: int) -> float:
    """Hanley & McNeil's standard error of an AUROC `auroc` (0-1) from `n_id` ID and `n_ood` OOD scores (module
    docstring); NaN with either set empty."""
    if n_id < 1 or n_ood < 1:
        return math.nan
    a = float(auroc)
    q1, q2 = a / (2 - a), 2 * a * a / (1 + a)
    var = (a * (1 - a) + (n_id - 1) * (q1 - a * a) + (n_ood - 1) * (q2 - a * a)) / (n_id * n_ood)
    return math.sqrt(max(var, 0.0))


def widest_half_width(n_id: int, n_ood: int) -> tuple[float, float]:
    """(the largest half-width of AUROC's 95% interval over AUROCs from 50% (chance) to 100%, in percentage points;
    the AUROC in % where it is), at these sizes (a grid of 0.25-point steps)."""
    grid = np.linspace(0.5, 1.0, 201)
    ses = [hanley_mcneil_se(a, n_id, n_ood) for a in grid]
    at = int(np.argmax(ses))
    return 100 * Z95 * ses[at], 100 * float(grid[at])


def small_set_warnings(results: pd.DataFrame, max_width: float = MAX_INTERVAL) -> list[str]:
    """One line per OOD set whose sizes (`n_id`, `n_ood` of its rows) allow a 95% AUROC interval wider than
    `max_width` points."""
    lines = []
    if results.empty or not {"ood_set", "n_id", "n_ood"} <= set(results.columns):
        return lines
    sizes = results.dropna(subset=["n_id", "n_ood"]).groupby("ood_set", sort=True)[["n_id", "n_ood"]].min()
    for name, (n_id, n_ood) in sizes.iterrows():
        half, at = widest_half_width(int(n_id), int(n_ood))
        if 2 * half > max_width:
            lines.append(f"OOD set {name!r}: {int(n_ood)} OOD against {int(n_id)} ID images: AUROC's 95% interval "
                         f"is up to +-{half:.1f} points at these sizes (Hanley-McNeil standard error, widest at AUROC "
                         f"{at:.1f}%), wider than {max_width:g}: add images before reading differences between "
                         "detectors")
    return lines


def chance_ceiling(classes: int, n: int) -> float:
    """The accuracy a classifier guessing uniformly among `classes` exceeds with 2.5% probability on `n` rows: 1/C +
    1.96 sqrt(p (1 - p) / n) (normal approximation of the binomial)."""
    p = 1.0 / classes
    return p + Z95 * math.sqrt(p * (1 - p) / max(n, 1))


def accuracy_warnings(results: pd.DataFrame, classes: int, n_test: int) -> list[str]:
    """One line per distinct ID test accuracy (`id_acc`, shared by the methods of one classifier) that is zero or
    not above chance among `classes` on `n_test` rows (`chance_ceiling`)."""
    if results.empty or "id_acc" not in results.columns or classes < 2:
        return []
    lines = []
    rows = results.dropna(subset=["id_acc"]).drop_duplicates("method")
    for acc, group in rows.groupby("id_acc", sort=True):
        methods = ", ".join(group["method"])
        if acc == 0:
            lines.append(f"ID test accuracy is 0.00% ({methods}): no ID test row is classified right, so the "
                         "classifier's classes are not these labels (a model trained on other classes, or labels "
                         "in another order?): its scores mean nothing here")
        elif acc <= chance_ceiling(classes, n_test):
            lines.append(f"ID test accuracy {100 * acc:.2f}% ({methods}) is at chance for {classes} classes (1/"
                         f"{classes} = {100 / classes:.2f}%, within 95% noise on {n_test} rows): the classifier has "
                         "not learned these classes and its OOD scores mean little")
    return lines


def head_warning(outputs: int, classes: int, model: str) -> str | None:
    """A line when the classifier's head has not one output per ID class."""
    if outputs == classes:
        return None
    return (f"model {model}: its head has {outputs} outputs but the ID set has {classes} classes: the logits are not "
            "these classes, so ID accuracy and every logit-based score (msp, ebo, mls, ...) mean little (train a "
            "classifier on this ID set: oodforge train-classifier)")


def one_class_warning(classes: int) -> str | None:
    """A line when the ID set has a single class."""
    if classes != 1:
        return None
    return ("the ID set has one class: a one-class classifier learns nothing (its cross-entropy is 0 whatever the "
            "weights) and gives every image the same softmax, so msp is constant and its AUROC 50 by construction, "
            "and logit scores (ebo, mls, ...) come from an untrained head; only feature-distance detectors (knn, "
            "mds, ...) measure anything here")


def protocol_warning(model: str | None, protocol: str) -> str | None:
    """A line when `model` is a train-classifier folder (or its `best/`) trained under another protocol than the
    evaluation's: the two protocols' evaluation pixels differ (e.g. `exact`: the processor's bicubic resize;
    `openood_v1.5`: the reference's bilinear one), so ID accuracy differs from its metrics.json."""
    if not model:
        return None
    for folder in (Path(model), Path(model).parent):
        try:
            trained = json.loads((folder / TRAIN_CONFIG).read_text(encoding="utf-8")).get("protocol")
        except (OSError, ValueError, AttributeError):
            continue
        if trained and trained != protocol:
            return (f"model {model} was trained and tested under protocol {trained}, this evaluation runs {protocol}: "
                    f"their pixels differ, so ID accuracy here can differ from its metrics.json (set protocol: "
                    f"{trained} to score the images as training tested them)")
        return None
    return None


def id_classes(labels: Iterable[int]) -> int:
    """The number of distinct ID class labels (OOD's -1 left out)."""
    return len({int(v) for v in labels if int(v) >= 0})
