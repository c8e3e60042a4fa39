"""OOD metrics (pure functions on score arrays; scores: higher = more in-distribution).

Conventions (OpenOOD v1.5): OOD is the positive class, ranked by -score. `fpr95` is the fraction of ID samples rejected
at the first ROC point where >= 95% of OOD are detected; `fpr95_id` is the classic one (fraction of OOD accepted at the
first point keeping >= 95% of ID). AUPR-In has ID positive, AUPR-Out OOD positive; both are trapezoidal areas under the
precision-recall curve. Ties are exact: one ROC/PR point per distinct score. (OpenOOD builds its curve with
scikit-learn's `drop_intermediate=True`, which can drop points inside a tied diagonal segment and so, rarely, report a
higher FPR@95 than the exact curve.) A sample is flagged OOD iff score < threshold.
"""
from __future__ import annotations

import math
from typing import Any

import numpy as np

from detectors.base import as_numpy

METRICS: tuple[str, ...] = ("auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out")
"""Per-set metrics of `evaluate`, stored as fractions in [0, 1] (rendered in percent)."""

def _finite(scores: Any, what: str) -> np.ndarray:
    arr = as_numpy(scores, np.float64).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    bad = ~np.isfinite(arr)
    if bad.any():
        raise ValueError(f"{what} has {int(bad.sum())} NaN or infinite value(s) (first at index "
                         f"{int(np.flatnonzero(bad)[0])})")
    return arr


def _counts(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Cumulative true/false positives at each distinct threshold, ranking by decreasing value (positive = high)."""
    values = np.concatenate([pos, neg])
    is_pos = np.concatenate([np.ones(len(pos)), np.zeros(len(neg))])
    order = np.argsort(-values, kind="mergesort")
    values, is_pos = values[order], is_pos[order]
    last_of_tie = np.r_[np.flatnonzero(np.diff(values)), len(values) - 1]
    tps = np.cumsum(is_pos)[last_of_tie]
    fps = (last_of_tie + 1) - tps
    return tps, fps


def _roc(pos: np.ndarray, neg: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    tps, fps = _counts(pos, neg)
    return np.r_[0.0, fps / len(neg)], np.r_[0.0, tps / len(pos)]


def _aupr(pos: np.ndarray, neg: np.ndarray) -> float:
    """Trapezoidal area under precision(recall) with the (recall 0, precision 1) end point, as sklearn's auc(PR)."""
    tps, fps = _counts(pos, neg)
    precision = np.r_[1.0, tps / (tps + fps)]
    recall = np.r_[0.0, tps / len(pos)]
    return float(np.trapezoid(precision, recall))


def auroc(id_scores: Any, ood_scores: Any) -> float:
    """Area under the ROC curve (symmetric: the same with ID or OOD positive)."""
    idv, ood = _finite(id_scores, "id_scores"), _finite(ood_scores, "ood_scores")
    fpr, tpr = _roc(-ood, -idv)
    return float(np.trapezoid(tpr, fpr))


def fpr_at_tpr(id_scores: Any, ood_scores: Any, tpr: float = 0.95, positive: str = "ood") -> float:
    """FPR at the first ROC point with TPR >= `tpr`. positive='ood' is OpenOOD v1.5's FPR@95, 'id' the classic one."""
    idv, ood = _finite(id_scores, "id_scores"), _finite(ood_scores, "ood_scores")
    if positive == "ood":
        fpr, tprs = _roc(-ood, -idv)
    elif positive == "id":
        fpr, tprs = _roc(idv, ood)
    else:
        raise ValueError(f"positive must be 'ood' or 'id', got {positive!r}")
    return float(fpr[np.argmax(tprs >= tpr - 1e-12)])


def evaluate(id_scores: Any, ood_scores: Any) -> dict[str, float]:
    """`auroc, fpr95, fpr95_id, aupr_in, aupr_out` as fractions in [0, 1]."""
    idv, ood = _finite(id_scores, "id_scores"), _finite(ood_scores, "ood_scores")
    return {
        "auroc": auroc(idv, ood),
        "fpr95": fpr_at_tpr(idv, ood, 0.95, "ood"),
        "fpr95_id": fpr_at_tpr(idv, ood, 0.95, "id"),
        "aupr_in": _aupr(idv, ood),
        "aupr_out": _aupr(-ood, -idv),
    }


def threshold_at_tpr(scores: Any, tpr: float = 0.95, positive: str = "ood") -> float:
    """Threshold t (flag OOD iff score < t) reaching `tpr` on the positive class `scores`.

    positive='ood': the smallest t flagging at least `tpr` of these OOD scores.
    positive='id': the largest t keeping at least `tpr` of these ID scores.
    """
    arr = np.sort(_finite(scores, "scores"))
    if not 0.0 < tpr <= 1.0:
        raise ValueError(f"tpr must be in (0, 1], got {tpr}")
    k = max(1, math.ceil(tpr * len(arr) - 1e-9))
    if positive == "ood":
        return float(np.nextafter(arr[k - 1], np.inf))
    if positive == "id":
        return float(arr[::-1][k - 1])
    raise ValueError(f"positive must be 'ood' or 'id', got {positive!r}")


def precision_recall_at(threshold: float, id_scores: Any, ood_scores: Any) -> dict[str, float]:
    """Precision and recall of OOD detection (flag OOD iff score < threshold), with the ID kept rate and counts."""
    idv, ood = _finite(id_scores, "id_scores"), _finite(ood_scores, "ood_scores")
    tp = int((ood < threshold).sum())
    fp = int((idv < threshold).sum())
    flagged = tp + fp
    return {
        "threshold": float(threshold),
        "precision": tp / flagged if flagged else float("nan"),
        "recall": tp / len(ood),
        "id_kept": 1.0 - fp / len(idv),
        "tp": tp,
        "fp": fp,
        "n_id": len(idv),
        "n_ood": len(ood),
    }


def transfer_threshold(source_scores: Any, target_id_scores: Any, target_ood_scores: Any, tpr: float = 0.95,
                       positive: str = "ood") -> dict[str, float]:
    """Choose the threshold at `tpr` on `source_scores` (of class `positive`), then report precision/recall on a
    target."""
    return precision_recall_at(threshold_at_tpr(source_scores, tpr, positive), target_id_scores, target_ood_scores)
