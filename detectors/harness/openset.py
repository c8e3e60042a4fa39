"""The reference evaluator's open-set columns of a results row (`detectors.openset_metrics`), as the runner fills them.

Known-class predictions are those of the classifier a row scores with (argmax of its logits, as Open-Insect's eval.sh
runs with `--use_standard_pred True`: `ood_evaluator.py:103-104, :136-137`); the OOSA threshold is chosen on ID val
against OOD val with the row's own scores and the ID val predictions (`get_osa_threshold`, `ood_evaluator.py:102-113`).
Without predictions (a detector with no classifier) the known-class columns are NaN; without OOD validation rows, OSA
and OOSA are NaN (the reference's -1: no threshold).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.protocols import ZERO_THRESHOLD_MISSING
from detectors.openset_metrics import OOD_CSV_COLUMNS, Predictions, accuracy, osa_threshold, reference_metrics

OOD_METRICS_FILE = "ood_metrics.csv"
"""The runner's table in the reference's ood.csv shape, beside results.csv (`ood_csv_table`)."""


@dataclass(frozen=True)
class KnownClasses:
    """Predictions of the ID test rows (ACC, AUOSCR, OpenAUC, OSA, OOSA) and of the ID val rows (the OOSA threshold);
    None where the row's scorer has no classifier, or the run no such split."""

    test: Predictions | None = None
    val: Predictions | None = None

    @property
    def accuracy(self) -> float:
        """Top-1 ID test accuracy (the rows' `id_acc`, the reference's ACC); NaN without predictions."""
        return float("nan") if self.test is None else accuracy(self.test.pred, self.test.labels)


def predictions(pred: Any, labels: Any) -> Predictions | None:
    """Predicted classes with their labels (argmax already taken); None for an empty split."""
    pred, labels = np.asarray(pred, dtype=np.int64).reshape(-1), np.asarray(labels, dtype=np.int64).reshape(-1)
    if not len(labels):
        return None
    if pred.shape != labels.shape:
        raise ValueError(f"{len(pred)} predictions for {len(labels)} labelled rows")
    return Predictions(pred, labels)


def from_logits(logits: Any, labels: Any) -> Predictions | None:
    """The classifier's predictions: argmax of its logits [N, C]; None without logits."""
    return None if logits is None else predictions(np.asarray(logits).argmax(1), labels)


def oosa_threshold(id_val_scores: Any, ood_val_scores: Any, val: Predictions | None) -> float | None:
    """The threshold maximising OSA on ID val against OOD val (the lowest of tied ones); None without predictions."""
    if val is None or not len(np.asarray(ood_val_scores)):
        return None
    return osa_threshold(id_val_scores, ood_val_scores, val.pred, val.labels)[1]


def openset_columns(id_scores: Any, ood_scores: Any, known: KnownClasses, theta: float | None,
                    protocol: str) -> dict[str, float]:
    """A row's `OPENSET_METRICS` for one OOD set (fractions; `oosa_threshold` a score)."""
    return reference_metrics(id_scores, ood_scores, known.test, theta,
                             zero_theta_missing=ZERO_THRESHOLD_MISSING.get(protocol, True))


def ood_csv_table(results: pd.DataFrame, fractions: bool = True) -> pd.DataFrame:
    """The results in the reference's ood.csv shape: `method`, `ood_set`, then TNR@10 ... OOSA in its column order
    (`OOD_CSV_COLUMNS`), in percent, rounded to 2 decimals as `ood_evaluator.py:179` rounds them (`fractions`: the
    results hold fractions, as the runner writes them). A column the table lacks (older runs) is left empty."""
    out = pd.DataFrame({"method": results["method"].astype(str), "ood_set": results["ood_set"].astype(str)})
    for label, column in OOD_CSV_COLUMNS.items():
        values = (pd.to_numeric(results[column], errors="coerce") if column in results.columns
                  else pd.Series(np.nan, index=results.index))
        out[label] = (values * (100.0 if fractions else 1.0)).round(2)
    return out.reset_index(drop=True)
