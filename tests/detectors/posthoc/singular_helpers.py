"""Features whose tied covariance is singular (D > N - C), shaped like pooled ResNet features (a shared ReLU offset,
classes far apart against the within-class spread), with a known ID/OOD structure, and sklearn's MDS / RMDS oracle."""
from __future__ import annotations

import numpy as np
from sklearn.covariance import EmpiricalCovariance
from sklearn.metrics import roc_auc_score


def singular_case(n: int, d: int, c: int = 10, seed: int = 0, n_test: int = 300):
    """(train features, labels, ID test, OOD test), float32. Rank-48 class structure plus small isotropic noise; OOD
    rows are the ID classes moved off their centres along the same subspace."""
    rng = np.random.default_rng(seed)
    rank = 48
    basis = rng.normal(0, 1, (rank, d)) / np.sqrt(rank)
    centres = rng.normal(0, 10, (c, rank))

    def rows(labels: np.ndarray, shift: float) -> np.ndarray:
        z = centres[labels] + rng.normal(0, 1, (len(labels), rank)) + rng.normal(0, shift, (len(labels), rank))
        return np.maximum(z @ basis + rng.normal(0, 0.05, (len(labels), d)) + 3.0, 0).astype(np.float32)

    labels = np.arange(n) % c
    return rows(labels, 0.0), labels, rows(rng.integers(0, c, n_test), 0.0), rows(rng.integers(0, c, n_test), 1.0)


def _max_neg_distance(z: np.ndarray, means: np.ndarray, precision: np.ndarray) -> np.ndarray:
    return np.max([-(((z - m) @ precision) * (z - m)).sum(1) for m in means], axis=0)


def oracle_scores(train: np.ndarray, labels: np.ndarray, test: np.ndarray, relative: bool = False) -> np.ndarray:
    """OpenOOD's MDS (RMDS with `relative`): sklearn's EmpiricalCovariance(assume_centered=False) on the class-centred
    train features (centred exactly, in float64), its `precision_` (pinvh), per-sample loops."""
    h, z = train.astype(np.float64), test.astype(np.float64)
    means = np.stack([h[labels == k].mean(0) for k in np.unique(labels)])
    precision = (EmpiricalCovariance(assume_centered=False).fit(h - means[np.searchsorted(np.unique(labels), labels)])
                 .precision_)
    scores = _max_neg_distance(z, means, precision)
    if relative:
        whole = EmpiricalCovariance(assume_centered=False).fit(h)
        scores -= _max_neg_distance(z, whole.location_[None], whole.precision_)
    return scores


def auroc(id_scores: np.ndarray, ood_scores: np.ndarray) -> float:
    """OOD positive, higher score = more ID."""
    return float(roc_auc_score(np.r_[np.zeros(len(id_scores)), np.ones(len(ood_scores))],
                               -np.r_[id_scores, ood_scores]))
