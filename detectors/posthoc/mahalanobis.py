"""Mahalanobis distance score (MDS): class Gaussians with one shared (tied) covariance, as sklearn's LDA and OpenOOD v1.5."""
from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import features_of, labels_of
from detectors.registry import register_detector

BLOCK_ROWS = 4096


def class_means(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(classes present [K], their float64 means [K,D], each row's class position [N]), via one sort and reduceat."""
    classes, position = np.unique(labels, return_inverse=True)
    order = np.argsort(position, kind="stable")
    starts = np.r_[0, np.flatnonzero(np.diff(position[order])) + 1]
    sums = np.add.reduceat(features[order], starts, axis=0)
    return classes, sums / np.bincount(position)[:, None], position


def tied_precision(centred: np.ndarray) -> np.ndarray:
    """Pseudo-inverse of the empirical covariance (1/N normalisation) of already centred rows, float64, symmetric."""
    centred = centred - centred.mean(axis=0)
    covariance = centred.T @ centred / len(centred)
    return np.linalg.pinv(covariance, hermitian=True)


def min_squared_mahalanobis(features: np.ndarray, means: np.ndarray, precision: np.ndarray, desc: str = "mahalanobis") -> np.ndarray:
    """min_c (h - mu_c)^T P (h - mu_c) for every row, via h^T P h - 2 h^T P mu_c + mu_c^T P mu_c in float64 blocks."""
    mean_terms = np.einsum("cd,cd->c", means @ precision, means)
    out = np.empty(len(features))
    starts = range(0, len(features), BLOCK_ROWS)
    for start in tqdm(starts, desc=desc, disable=len(starts) <= 1, leave=False):
        t = np.asarray(features[start:start + BLOCK_ROWS], dtype=np.float64)
        tp = t @ precision
        quad = np.einsum("nd,nd->n", tp, t)
        cross = tp @ means.T
        cross *= -2.0
        cross += mean_terms
        out[start:start + BLOCK_ROWS] = quad + cross.min(axis=1)
    return np.maximum(out, 0.0)


@register_detector("mds")
class Mahalanobis(Detector):
    """s(h) = max_c -(h - mu_c)^T S^+ (h - mu_c), S the covariance of class-centred train features (tied)."""

    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks, NeurIPS 2018"
    defaults = {}
    search_space = {}

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = features_of(id_train, self.name)
        self.classes, self.means, position = class_means(h, labels_of(id_train, self.name))
        self.precision = tied_precision(h - self.means[position])

    def _score(self, batch) -> np.ndarray:
        return -min_squared_mahalanobis(features_of(batch, self.name), self.means, self.precision, desc=self.name)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "classes": self.classes, "means": self.means, "precision": self.precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.classes, self.means, self.precision = state["classes"], state["means"], state["precision"]
