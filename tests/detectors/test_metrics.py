"""detectors.metrics against scikit-learn (OpenOOD v1.5's recipe) and brute-force hand computations, with tied
scores."""
from __future__ import annotations

import math

import numpy as np
import pytest
from sklearn.metrics import auc, precision_recall_curve, roc_auc_score, roc_curve

from detectors import metrics


def tied_scores(seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Integer scores (many ties), ID shifted above OOD; sizes vary with the seed."""
    rng = np.random.default_rng(seed)
    n_id, n_ood = rng.integers(5, 80, size=2)
    return rng.integers(0, 8, n_id).astype(np.float64), rng.integers(-3, 5, n_ood).astype(np.float64)


def sklearn_reference(id_scores: np.ndarray, ood_scores: np.ndarray) -> dict[str, float]:
    """OpenOOD v1.5's computation, with one ROC point per distinct score (drop_intermediate=False)."""
    conf = np.r_[id_scores, ood_scores]
    is_ood = np.r_[np.zeros(len(id_scores)), np.ones(len(ood_scores))]
    fpr, tpr, _ = roc_curve(is_ood, -conf, drop_intermediate=False)
    fpr_id, tpr_id, _ = roc_curve(1 - is_ood, conf, drop_intermediate=False)
    precision_in, recall_in, _ = precision_recall_curve(1 - is_ood, conf)
    precision_out, recall_out, _ = precision_recall_curve(is_ood, -conf)
    return {
        "auroc": roc_auc_score(is_ood, -conf),
        "fpr95": fpr[np.argmax(tpr >= 0.95)],
        "fpr95_id": fpr_id[np.argmax(tpr_id >= 0.95)],
        "aupr_in": auc(recall_in, precision_in),
        "aupr_out": auc(recall_out, precision_out),
    }


@pytest.mark.parametrize("seed", range(25))
def test_evaluate_matches_sklearn_with_ties(seed):
    id_scores, ood_scores = tied_scores(seed)
    got = metrics.evaluate(id_scores, ood_scores)
    expected = sklearn_reference(id_scores, ood_scores)
    assert set(got) == set(expected)
    for name, value in expected.items():
        assert got[name] == pytest.approx(value, abs=1e-12), name


def test_continuous_scores_and_symmetric_auroc():
    rng = np.random.default_rng(1)
    id_scores, ood_scores = rng.normal(1.0, 1.0, 500), rng.normal(0.0, 1.0, 300)
    got = metrics.evaluate(id_scores, ood_scores)
    for name, value in sklearn_reference(id_scores, ood_scores).items():
        assert got[name] == pytest.approx(value, abs=1e-12), name
    labels = np.r_[np.ones(500), np.zeros(300)]
    assert metrics.auroc(id_scores, ood_scores) == pytest.approx(roc_auc_score(labels, np.r_[id_scores, ood_scores]))


def test_fpr95_by_hand():
    # OOD positive on -score: 20 OOD at -1..-20 (score); 95% of OOD (19) are flagged once the threshold passes -2,
    # i.e. flag score <= -2; ID scores: 3 of 10 are <= -2, so FPR@95 = 0.3.
    ood = -np.arange(1, 21, dtype=np.float64)
    idv = np.array([-2.0, -5.0, -30.0, 0, 1, 2, 3, 4, 5, 6])
    assert metrics.fpr_at_tpr(idv, ood) == pytest.approx(0.3)
    # Classic: keep 95% of ID -> the 10 ID need all kept (9.5 -> 10), threshold -30: OOD accepted = all 20 -> 1.0.
    assert metrics.fpr_at_tpr(idv, ood, positive="id") == pytest.approx(1.0)
    assert metrics.fpr_at_tpr(idv, ood, tpr=0.9, positive="id") == pytest.approx(5 / 20)  # keep 9 ID: score >= -5
    with pytest.raises(ValueError, match="positive"):
        metrics.fpr_at_tpr(idv, ood, positive="both")


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_non_finite_scores_raise(bad):
    idv = np.array([0.1, 0.2, bad, 0.4])
    with pytest.raises(ValueError, match=r"id_scores has 1 NaN or infinite value\(s\) \(first at index 2\)"):
        metrics.evaluate(idv, np.array([0.0, 1.0]))
    with pytest.raises(ValueError, match="ood_scores"):
        metrics.auroc(np.array([0.0, 1.0]), idv)
    with pytest.raises(ValueError, match="empty"):
        metrics.evaluate(np.array([]), np.array([1.0]))


def brute_threshold(scores: np.ndarray, tpr: float, positive: str) -> float:
    """Search every candidate threshold: flag OOD iff score < t."""
    values = np.unique(scores)
    if positive == "ood":
        candidates = np.unique(np.r_[values, np.nextafter(values, np.inf)])
        return min(t for t in candidates if (scores < t).mean() >= tpr)
    return max(t for t in values if (scores >= t).mean() >= tpr)


@pytest.mark.parametrize("seed", range(10))
@pytest.mark.parametrize("tpr", [0.5, 0.9, 0.95, 1.0])
@pytest.mark.parametrize("positive", ["ood", "id"])
def test_threshold_at_tpr_brute_force(seed, tpr, positive):
    scores = np.random.default_rng(seed).integers(0, 12, 37).astype(np.float64)
    assert metrics.threshold_at_tpr(scores, tpr, positive) == brute_threshold(scores, tpr, positive)


def test_threshold_at_tpr_errors():
    with pytest.raises(ValueError, match="tpr"):
        metrics.threshold_at_tpr(np.arange(5.0), 0.0)
    with pytest.raises(ValueError, match="positive"):
        metrics.threshold_at_tpr(np.arange(5.0), 0.9, "neither")


def test_precision_recall_at_by_hand():
    idv = np.array([0.0, 1.0, 2.0, 3.0, 4.0])
    ood = np.array([-1.0, 0.0, 1.0, 5.0])
    got = metrics.precision_recall_at(1.0, idv, ood)  # flagged: score < 1 -> ID {0}, OOD {-1, 0}
    assert got == {"threshold": 1.0, "precision": 2 / 3, "recall": 2 / 4, "id_kept": 4 / 5, "tp": 2, "fp": 1,
                   "n_id": 5, "n_ood": 4}
    nothing = metrics.precision_recall_at(-10.0, idv, ood)
    assert math.isnan(nothing["precision"]) and nothing["recall"] == 0.0 and nothing["id_kept"] == 1.0


@pytest.mark.parametrize("positive", ["ood", "id"])
def test_transfer_threshold_by_hand(positive):
    rng = np.random.default_rng(3)
    source = rng.integers(-5, 3, 40).astype(np.float64)
    target_id, target_ood = rng.integers(0, 10, 60).astype(np.float64), rng.integers(-6, 6, 30).astype(np.float64)
    threshold = brute_threshold(source, 0.95, positive)
    tp, fp = int(sum(s < threshold for s in target_ood)), int(sum(s < threshold for s in target_id))
    got = metrics.transfer_threshold(source, target_id, target_ood, 0.95, positive)
    assert got["threshold"] == threshold and (got["tp"], got["fp"]) == (tp, fp)
    assert got["precision"] == pytest.approx(tp / (tp + fp)) and got["recall"] == pytest.approx(tp / 30)
    assert got["id_kept"] == pytest.approx(1 - fp / 60)
