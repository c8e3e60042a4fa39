"""Mahalanobis distance score (MDS): class Gaussians with one shared (tied) covariance, as sklearn's LDA and OpenOOD v1.5.

The precision is the inverse of the covariance (Cholesky) when it is positive definite, its pseudo-inverse otherwise.
The fit is one streamed pass of class sums and a scatter matrix (`streaming.Moments`): memory-mapped caches of any
size, chunks of `streaming.CHUNK_ROWS` rows, mergeable across processes.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import labels_of, stored_features
from detectors.registry import register_detector
from pipelines.progress import progress

BLOCK_ROWS = 4096


def spd_inverse(matrix: np.ndarray) -> np.ndarray:
    """Inverse of a symmetric matrix via Cholesky when it is well-conditioned positive definite, else the eigh-based
    pseudo-inverse (singular or numerically singular covariances: dead or duplicated units)."""
    factor, info = scipy.linalg.lapack.dpotrf(matrix, lower=False)
    pivots = np.abs(np.diag(factor))
    if info == 0 and pivots.min() ** 2 > pivots.max() ** 2 * len(matrix) * np.finfo(np.float64).eps * 1e3:
        inverse, info = scipy.linalg.lapack.dpotri(factor, lower=False)
        if info == 0:
            return np.triu(inverse) + np.triu(inverse, 1).T
    return np.linalg.pinv(matrix, hermitian=True)


def min_squared_mahalanobis(features: np.ndarray, means: np.ndarray, precision: np.ndarray, desc: str = "mahalanobis") -> np.ndarray:
    """min_c (h - mu_c)^T P (h - mu_c) for every row, via h^T P h - 2 h^T P mu_c + mu_c^T P mu_c in float64 blocks
    (read block by block: `features` may be memory-mapped)."""
    mean_terms = np.einsum("cd,cd->c", means @ precision, means)
    out = np.empty(len(features))
    for rows, t in progress(streaming.chunks(features, np.float64, BLOCK_ROWS), desc=desc, leave=False,
                        total=-(-len(features) // BLOCK_ROWS), disable=len(features) <= BLOCK_ROWS):
        tp = t @ precision
        quad = np.einsum("nd,nd->n", tp, t)
        cross = tp @ means.T
        cross *= -2.0
        cross += mean_terms
        out[rows] = quad + cross.min(axis=1)
    return np.maximum(out, 0.0)


@register_detector("mds")
class Mahalanobis(Detector):
    """s(h) = max_c -(h - mu_c)^T S^+ (h - mu_c), S the covariance of class-centred train features (tied)."""

    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial Attacks, NeurIPS 2018"
    fit_inputs = frozenset()
    needs = frozenset()

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        self._fit_moments(streaming.moments(stored_features(id_train, self.name), labels_of(id_train, self.name)))

    def _fit_moments(self, stats: streaming.Moments) -> None:
        """Class means and the inverse of the tied 1/N covariance of class-centred rows, from streamed moments."""
        self.classes, self.means = stats.groups, stats.means()
        self.precision = spd_inverse(stats.within_scatter() / stats.n)

    def _score(self, batch) -> np.ndarray:
        return -min_squared_mahalanobis(stored_features(batch, self.name), self.means, self.precision, desc=self.name)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "classes": self.classes, "means": self.means, "precision": self.precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.classes, self.means, self.precision = state["classes"], state["means"], state["precision"]
