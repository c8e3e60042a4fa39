"""Mahalanobis distance score (MDS): class Gaussians with one shared (tied) covariance, as sklearn's LDA and OpenOOD
v1.5.

The precision is sklearn's `pinvh` of the covariance (`spd_inverse`): the Cholesky inverse where the covariance is well
conditioned, else the eigen pseudo-inverse with pinvh's cut (a singular tied covariance, D > N - C, stays sane).
The fit is two streamed passes: class means, then the class-centred scatter (`streaming.class_scatter`): memory-mapped
caches of any size, chunks of the stream context's rows (`streaming.StreamContext`), mergeable across processes.
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


def pinvh_cutoff(eigenvalues: np.ndarray, size: int) -> float:
    """sklearn's precision cut (`scipy.linalg.pinvh`, which `EmpiricalCovariance.precision_` calls): eigenvalues with
    |lambda| <= size * eps(float64) * max |lambda| are dropped (scipy/linalg/_basic.py, pinvh: atol 0, rtol D * eps)."""
    return size * np.finfo(np.float64).eps * float(np.max(np.abs(eigenvalues), initial=0.0))


def pinvh(matrix: np.ndarray) -> np.ndarray:
    """The pseudo-inverse of a symmetric matrix as scipy's `pinvh` computes it: eigh, then 1/lambda on the eigenvalues
    above `pinvh_cutoff` (negative ones included, as pinvh's |lambda| test), the others dropped."""
    values, vectors = scipy.linalg.eigh(matrix, check_finite=False, driver="ev")
    kept = np.abs(values) > pinvh_cutoff(values, max(matrix.shape))
    vectors = vectors[:, kept]
    return (vectors / values[kept]) @ vectors.T


def spd_inverse(matrix: np.ndarray) -> np.ndarray:
    """sklearn's `pinvh` of a symmetric matrix (covariance -> precision, as OpenOOD's EmpiricalCovariance gives it).

    Where the matrix is positive definite and far from pinvh's cut (LAPACK's reciprocal condition estimate above 1e3
    times the cut), no eigenvalue is dropped and the inverse equals pinvh's: it comes from the Cholesky factor (several
    times faster). Otherwise (singular tied covariances, D > N - C; dead or duplicated units) `pinvh` itself, whose
    cut drops the +-1e-14 rounding eigenvalues that `np.linalg.pinv(rcond=1e-15)` would invert.
    """
    size = max(matrix.shape)
    factor, info = scipy.linalg.lapack.dpotrf(matrix, lower=False)
    if info == 0:
        anorm = float(np.abs(matrix).sum(axis=0).max())
        rcond, info = scipy.linalg.lapack.dpocon(factor, anorm)
        if info == 0 and rcond > 1e3 * size * np.finfo(np.float64).eps:
            inverse, info = scipy.linalg.lapack.dpotri(factor, lower=False)
            if info == 0:
                return np.triu(inverse) + np.triu(inverse, 1).T
    return pinvh(matrix)


def min_squared_mahalanobis(features: np.ndarray, means: np.ndarray, precision: np.ndarray,
                            desc: str = "mahalanobis") -> np.ndarray:
    """min_c (h - mu_c)^T P (h - mu_c) for every row, via t^T P t - 2 t^T P m_c + m_c^T P m_c in float64 blocks, with
    t = h - o and m_c = mu_c - o about o, the mean of the class means (the distances do not change; the expansion's
    cancellation shrinks from ||h|| to the spread about o: ReLU features share a large offset). `features` may be
    memory-mapped (read block by block)."""
    origin = means.mean(axis=0)
    means = means - origin
    mean_terms = np.einsum("cd,cd->c", means @ precision, means)
    out = np.empty(len(features))
    for rows, t in progress(streaming.chunks(features, np.float64, BLOCK_ROWS), desc=desc, leave=False,
                        total=-(-len(features) // BLOCK_ROWS), disable=len(features) <= BLOCK_ROWS):
        t -= origin
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

    label = "MDS"
    aliases = {"Mahalanobis": "pytorch-ood's"}
    reference_code = "OpenOOD openood/postprocessors/mds_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = ("Lee et al., A Simple Unified Framework for Detecting Out-of-Distribution Samples and Adversarial "
             "Attacks, NeurIPS 2018")

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        self._fit_scatter(streaming.class_scatter(stored_features(id_train, self.name), labels_of(id_train, self.name)))

    def _fit_scatter(self, scatter: streaming.ClassScatter) -> None:
        """Class means and the `pinvh` of the tied 1/N covariance of class-centred rows (OpenOOD: sklearn's
        EmpiricalCovariance(assume_centered=False) on class-centred train features)."""
        stats = scatter.stats
        self.classes, self.means = stats.groups, stats.means()
        self.precision = spd_inverse(scatter.within / stats.n)

    def _score(self, batch) -> np.ndarray:
        return -min_squared_mahalanobis(stored_features(batch, self.name), self.means, self.precision, desc=self.name)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "classes": self.classes, "means": self.means, "precision": self.precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.classes, self.means, self.precision = state["classes"], state["means"], state["precision"]
