"""Mahalanobis distance score (MDS): class Gaussians with one shared (tied) covariance, as sklearn's LDA and OpenOOD v1.5.

The precision is the inverse of the covariance (Cholesky) when it is positive definite, its pseudo-inverse otherwise.
"""
from __future__ import annotations

import numpy as np
import scipy.linalg
import scipy.sparse
from tqdm.auto import tqdm

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of
from detectors.posthoc.common import raw_features
from detectors.registry import register_detector

BLOCK_ROWS = 4096


def class_means(features: np.ndarray, labels: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(classes present [K], their float64 means [K,D], each row's class position [N]), via one sparse one-hot product."""
    classes, position = np.unique(labels, return_inverse=True)
    one_hot = scipy.sparse.csr_matrix((np.ones(len(position)), (position, np.arange(len(position)))), shape=(len(classes), len(position)))
    return classes, np.asarray(one_hot @ features) / np.bincount(position)[:, None], position


def class_centred(features: np.ndarray, means: np.ndarray, position: np.ndarray) -> np.ndarray:
    """features - means[position] in float64, block by block (no [N,D] gather temporary)."""
    out = np.empty(features.shape, dtype=np.float64)
    for start in range(0, len(features), BLOCK_ROWS):
        rows = slice(start, start + BLOCK_ROWS)
        np.subtract(features[rows], means[position[rows]], out=out[rows])
    return out


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


def tied_precision(centred: np.ndarray) -> np.ndarray:
    """Inverse (pseudo-inverse when singular) of the 1/N empirical covariance of rows already centred, float64.

    The rows' own mean is zero by construction (class- or globally-centred), so it is not subtracted again.
    """
    return spd_inverse(centred.T @ centred / len(centred))


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
        h = raw_features(id_train, self.name)
        self.classes, self.means, position = class_means(h, labels_of(id_train, self.name))
        self.precision = tied_precision(class_centred(h, self.means, position))

    def _score(self, batch) -> np.ndarray:
        return -min_squared_mahalanobis(raw_features(batch, self.name), self.means, self.precision, desc=self.name)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "classes": self.classes, "means": self.means, "precision": self.precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.classes, self.means, self.precision = state["classes"], state["means"], state["precision"]
