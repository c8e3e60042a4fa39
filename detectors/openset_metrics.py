"""Open-set metrics of the Open-Insect evaluator (RolnickLab/Open-Insect at e0aa51e), as its code computes them.

The reference writes `ood.csv` with TNR@10, TNR@20, AUROC, AUPR, FPR, ACC, AUOSCR, OpenAUC, OSA, OOSA
(`src/openood/evaluators/metrics.py:115-153` `compute_all_metrics`, called by `ood_evaluator.py:234-236` per OOD test
set). Pure numpy re-statements of that code, each function naming the reference lines it follows:

- scores are `conf`, higher = more in-distribution (the reference negates them where its curve wants OOD high);
- the ROC-based numbers rank OOD as the positive class on `-conf` through scikit-learn's `roc_curve` with its default
  `drop_intermediate=True` (metrics.py:11, :189): its collinear points are dropped here as there, so FPR and TNR can
  differ from `detectors.metrics`' exact curve in rare tied cases (that is why `fpr95_ref` exists beside `fpr95`);
- AUPR is scikit-learn's `average_precision_score` with OOD positive (metrics.py:193): the step sum, not the
  trapezoidal AUPR-Out of `detectors.metrics`;
- the known-class numbers (ACC, AUOSCR, OpenAUC, OSA, OOSA) need the classifier's predictions of the ID test rows;
- values here are fractions in [0, 1] (the reference multiplies by 100, as ood_metrics.csv and the report do).

Tied scores: AUOSCR walks the rows in `numpy.argsort`'s order (metrics.py:61, the default, unstable kind), so with ties
between a known and an unknown row its value depends on that order, in the reference as here (the same call is made).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

OPENSET_METRICS: tuple[str, ...] = ("tnr10", "tnr20", "ap_out", "fpr95_ref", "auoscr", "openauc", "osa", "oosa",
                                    "oosa_threshold")
"""The results-table columns this module adds (fractions, except `oosa_threshold`, a score)."""

OPENSET_RATES: tuple[str, ...] = OPENSET_METRICS[:-1]
"""The columns of `OPENSET_METRICS` that are rates (rendered in percent)."""

OOD_CSV_COLUMNS: dict[str, str] = {"TNR@10": "tnr10", "TNR@20": "tnr20", "AUROC": "auroc", "AUPR": "ap_out",
                                   "FPR": "fpr95_ref", "ACC": "id_acc", "AUOSCR": "auoscr", "OpenAUC": "openauc",
                                   "OSA": "osa", "OOSA": "oosa"}
"""The reference's ood.csv columns in its order (metrics.py:120-151) -> our results column of the same number.
`auroc` and `id_acc` are the rows' existing columns: they equal the reference's AUROC and ACC."""

OSA_ALPHA = 0.5
"""OSA's weight of the correct-classification rate against the unknown-rejection rate (ood_evaluator.py:110,
metrics.py:141-144)."""

OPENAUC_MARGIN = 1e-5
"""XCurve's OpenAUC puts every misclassified known row at max(unknown score) + 1e-5 (XCurve 1.1.0
Metrics/OpenAUC.py:97)."""


def _array(values: Any, what: str, dtype: Any = np.float64) -> np.ndarray:
    arr = np.asarray(values, dtype=dtype).reshape(-1)
    if arr.size == 0:
        raise ValueError(f"{what} is empty")
    return arr


def roc_curve(is_pos: np.ndarray, scores: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """scikit-learn's `roc_curve(is_pos, scores)` with `drop_intermediate=True`: (fpr, tpr, thresholds), starting at
    (0, 0) with threshold inf; one point per distinct score, collinear ones dropped (second differences of both counts
    zero)."""
    order = np.argsort(-scores, kind="stable")
    ranked, pos = scores[order], is_pos[order].astype(np.float64)
    last = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]
    tps = np.cumsum(pos)[last]
    fps = 1.0 + last.astype(np.float64) - tps
    thresholds = ranked[last]
    if fps.size > 2:
        keep = np.flatnonzero(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])
        tps, fps, thresholds = tps[keep], fps[keep], thresholds[keep]
    tps, fps = np.r_[0.0, tps], np.r_[0.0, fps]
    fpr = fps / fps[-1] if fps[-1] > 0 else np.full(fps.shape, np.nan)
    tpr = tps / tps[-1] if tps[-1] > 0 else np.full(tps.shape, np.nan)
    return fpr, tpr, np.r_[np.inf, thresholds]


def _ood_roc(id_conf: np.ndarray, ood_conf: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The reference's ROC: OOD positive, ranked by -conf (metrics.py:8-11, :183-189)."""
    is_ood = np.r_[np.zeros(id_conf.size), np.ones(ood_conf.size)]
    fpr, tpr, _ = roc_curve(is_ood, -np.r_[id_conf, ood_conf])
    return fpr, tpr


def tnr_at_fnr(id_conf: Any, ood_conf: Any, fnr: float) -> float:
    """`get_tnr` (metrics.py:7-19): the share of ID rows kept (1 - FPR) at the first ROC point detecting >= 1 - fnr of
    the OOD rows. TNR@10 is fnr 0.1, TNR@20 fnr 0.2."""
    fpr, tpr = _ood_roc(_array(id_conf, "id_conf"), _array(ood_conf, "ood_conf"))
    return float(1 - fpr[np.flatnonzero(tpr >= 1 - fnr)[0]])


def fpr_at_recall(id_conf: Any, ood_conf: Any, recall: float = 0.95) -> float:
    """FPR of `auc_and_fpr_recall` (metrics.py:178-194): the share of ID rows rejected at the first ROC point detecting
    >= `recall` of the OOD rows."""
    fpr, tpr = _ood_roc(_array(id_conf, "id_conf"), _array(ood_conf, "ood_conf"))
    return float(fpr[np.argmax(tpr >= recall)])


def _auc(is_pos: np.ndarray, scores: np.ndarray) -> float:
    """scikit-learn's `roc_auc_score` (the trapezoidal area under `roc_curve`); NaN with one class only."""
    if is_pos.all() or not is_pos.any():
        return float("nan")
    fpr, tpr, _ = roc_curve(is_pos, scores)
    return float(np.trapezoid(tpr, fpr))


def auroc(id_conf: Any, ood_conf: Any) -> float:
    """AUROC of `auc_and_fpr_recall` (metrics.py:192): OOD positive on -conf."""
    idv, ood = _array(id_conf, "id_conf"), _array(ood_conf, "ood_conf")
    return _auc(np.r_[np.zeros(idv.size, bool), np.ones(ood.size, bool)], -np.r_[idv, ood])


def average_precision_ood(id_conf: Any, ood_conf: Any) -> float:
    """AUPR of `auc_and_fpr_recall` (metrics.py:193): scikit-learn's `average_precision_score`, OOD positive on -conf:
    sum over distinct thresholds of (recall step) x precision."""
    idv, ood = _array(id_conf, "id_conf"), _array(ood_conf, "ood_conf")
    scores = -np.r_[idv, ood]
    pos = np.r_[np.zeros(idv.size), np.ones(ood.size)]
    order = np.argsort(-scores, kind="stable")
    ranked = scores[order]
    last = np.r_[np.flatnonzero(np.diff(ranked)), ranked.size - 1]
    tps = np.cumsum(pos[order])[last]
    fps = 1.0 + last.astype(np.float64) - tps
    precision = np.r_[(tps / (tps + fps))[::-1], 1.0]
    recall = np.r_[(tps / tps[-1])[::-1], 0.0]
    return float(max(0.0, -np.sum(np.diff(recall) * precision[:-1])))


def accuracy(pred: Any, labels: Any) -> float:
    """`acc` (metrics.py:157-164): the share of ID rows whose predicted class is their label."""
    p, y = _array(pred, "pred", np.int64), _array(labels, "labels", np.int64)
    return float(np.sum(p == y) / len(y))


def auoscr(known_conf: Any, unknown_conf: Any, pred: Any, labels: Any) -> float:
    """Area under the open-set classification-rate curve, `compute_auoscr` (metrics.py:32-90) vectorised.

    Rows (known first, then unknown) in `numpy.argsort` order of conf; cut k (k < n - 1) counts the correctly
    classified known rows above position k and the unknown rows from k on. The curve gets (0, 0) twice and (1, 1);
    points sorted by (FPR, CCR) descending; trapezoids summed in that order. The (1, 1) end point meets the curve's
    FPR-1 point in a vertical step, so the area never exceeds the accuracy.
    """
    x1, x2 = _array(known_conf, "known_conf"), _array(unknown_conf, "unknown_conf")
    correct = _array(pred, "pred", np.int64) == _array(labels, "labels", np.int64)
    predict = np.concatenate([x1, x2])
    n = predict.size
    idx = predict.argsort()  # metrics.py:61: the default kind, as the reference sorts
    s_known = np.r_[correct.astype(np.float64), np.zeros(x2.size)][idx]
    s_unknown = np.r_[np.zeros(x1.size), np.ones(x2.size)][idx]
    suffix_known = np.cumsum(s_known[::-1])[::-1]  # suffix_known[k] = s_known[k:].sum()
    suffix_unknown = np.cumsum(s_unknown[::-1])[::-1]
    k = np.arange(n - 1)
    ccr = np.r_[suffix_known[k + 1] / float(x1.size), 0.0, 0.0, 1.0]
    fpr = np.r_[suffix_unknown[k] / float(x2.size), 0.0, 0.0, 1.0]
    order = np.lexsort((ccr, fpr))[::-1]  # sorted(zip(FPR, CCR), reverse=True)
    f, c = fpr[order], ccr[order]
    steps = (f[:-1] - f[1:]) * ((c[:-1] + c[1:]) / 2.0)
    return float(np.add.accumulate(steps)[-1])  # summed left to right, as the reference's loop


def openauc(known_conf: Any, unknown_conf: Any, pred: Any, labels: Any) -> float:
    """XCurve's `OpenAUC` as the reference calls it (metrics.py:136-138, on -conf): the AUROC of unknown (positive)
    against known rows, a misclassified known row scored max(unknown) + 1e-5, i.e. ranked as unknown as any."""
    known, unknown = -_array(known_conf, "known_conf"), -_array(unknown_conf, "unknown_conf")
    correct = _array(pred, "pred", np.int64) == _array(labels, "labels", np.int64)
    worst = float(np.max(unknown)) + OPENAUC_MARGIN
    scores = np.r_[np.where(correct, known, worst), unknown]
    return _auc(np.r_[np.zeros(known.size, bool), np.ones(unknown.size, bool)], scores)


def osa_at(known_conf: Any, unknown_conf: Any, pred: Any, labels: Any, theta: float,
           alpha: float = OSA_ALPHA) -> float:
    """Open-set accuracy at threshold `theta` (`osa_at_theta`, metrics.py:107-112): alpha x the share of known rows
    correctly classified with conf >= theta + (1 - alpha) x the share of unknown rows with conf < theta."""
    known, unknown = _array(known_conf, "known_conf"), _array(unknown_conf, "unknown_conf")
    correct = _array(pred, "pred", np.int64) == _array(labels, "labels", np.int64)
    ccr = (correct & (known >= theta)).sum() / len(known)
    urr = (unknown < theta).mean()
    return float(alpha * ccr + (1 - alpha) * urr)


def osa_threshold(known_conf: Any, unknown_conf: Any, pred: Any, labels: Any,
                  alpha: float = OSA_ALPHA) -> tuple[float, float]:
    """(best OSA, its threshold) over every distinct conf of both sets (`get_osa_threshold`, metrics.py:93-104; the
    same code picks the OOSA threshold on ID val against OOD val, ood_evaluator.py:23-51 and :102-113): the lowest of
    the thresholds tied at the maximum (`np.argmax` over ascending `np.unique`)."""
    known, unknown = _array(known_conf, "known_conf"), _array(unknown_conf, "unknown_conf")
    correct = _array(pred, "pred", np.int64) == _array(labels, "labels", np.int64)
    thresholds = np.unique(np.concatenate([known, unknown]))
    correct_sorted = np.sort(known[correct])
    ccr = (correct_sorted.size - np.searchsorted(correct_sorted, thresholds, "left")) / len(known)
    urr = np.searchsorted(np.sort(unknown), thresholds, "left") / len(unknown)
    osa = alpha * ccr + (1 - alpha) * urr
    best = int(np.argmax(osa))
    return float(osa[best]), float(thresholds[best])


@dataclass(frozen=True)
class Predictions:
    """The classifier's predicted classes of the ID rows and their labels (what ACC, AUOSCR, OpenAUC and OSA need)."""

    pred: np.ndarray
    labels: np.ndarray


def reference_metrics(id_conf: Any, ood_conf: Any, known: Predictions | None = None, theta: float | None = None,
                      zero_theta_missing: bool = True) -> dict[str, float]:
    """`compute_all_metrics` (metrics.py:115-153) for one OOD set, as fractions, keyed by `OPENSET_METRICS`.

    `known`: predictions of the ID rows (None: the known-class metrics are NaN). `theta`: the OOSA threshold chosen on
    validation (`osa_threshold` on ID val against OOD val). The reference computes OSA and OOSA only `if theta:`
    (metrics.py:139), so a threshold of exactly 0 leaves both missing (-1 there, NaN here) with `zero_theta_missing`;
    a missing `theta` leaves OOSA missing and (as there) OSA too.
    """
    idv, ood = _array(id_conf, "id_conf"), _array(ood_conf, "ood_conf")
    nan = float("nan")
    out = {"tnr10": tnr_at_fnr(idv, ood, 0.1), "tnr20": tnr_at_fnr(idv, ood, 0.2),
           "ap_out": average_precision_ood(idv, ood), "fpr95_ref": fpr_at_recall(idv, ood, 0.95),
           "auoscr": nan, "openauc": nan, "osa": nan, "oosa": nan,
           "oosa_threshold": nan if theta is None else float(theta)}
    if known is None:
        return out
    pred, labels = known.pred, known.labels
    if not len(pred) == len(labels) == len(idv):
        raise ValueError(f"{len(pred)} predictions and {len(labels)} labels for {len(idv)} ID scores")
    out["auoscr"] = auoscr(idv, ood, pred, labels)
    out["openauc"] = openauc(idv, ood, pred, labels)
    if theta is None or (zero_theta_missing and theta == 0):
        return out
    out["oosa"] = osa_at(idv, ood, pred, labels, theta)
    out["osa"] = osa_threshold(idv, ood, pred, labels)[0]
    return out
