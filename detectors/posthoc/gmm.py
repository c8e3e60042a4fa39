"""GMM: a class-conditional Gaussian mixture on the penultimate features (each class its own mean, covariance and
weight), scored by the mixture's log-likelihood; pytorch-ood 0.4.0's `GMM`.

pytorch-ood marks it `ai_coded` and names no paper (a classical baseline), so its code is the reference
(`pytorch_ood/detector/gmm.py`): per class the mean, the covariance divided by the class count plus `reg` on the
diagonal (1e-6, `:55`; `:117-119`), its Cholesky factor (a failure is an error, `:120-125`), the log-determinant and
the log of the class fraction (`:128-129`); the score log sum_k pi_k N(z | mu_k, Sigma_k) (`:166-169`, which returns
its negative), in float64 as there. OpenOOD's `gmm` postprocessor (several layers, reduced features) is another method.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.linalg

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of, logsumexp, stored_features
from detectors.posthoc.threads import lapack_threads, map_rows
from detectors.registry import register_detector
from pipelines.params import Params, param

ROWS = 1024
"""Test rows per block: a block's projections on the low-rank classes' directions are [ROWS, train rows] float64."""

CANCELLED = 1e-3
"""Below this fraction of ||x-mu||^2 / reg a low-rank distance is recomputed without the expansion (whose rounding,
eps ||x-mu||^2 / reg, would otherwise be more than 1e-13 of it)."""

STATE = ("centre", "means", "log_dets", "log_weights", "full", "factors", "low", "basis", "starts", "shifts",
         "variances", "scaled", "scaled_shifts")


def low_rank(centred: np.ndarray, reg: float) -> tuple[np.ndarray, np.ndarray, float]:
    """A class of n <= D/2 centred rows: its covariance is B diag(lambda) B^T + reg I, B [D, n] the right singular
    vectors (lambda = s^2 / n), so (Woodbury) (x-mu)^T Sigma^-1 (x-mu) = ||x-mu||^2 / reg - sum_i (b_i . (x-mu))^2
    lambda_i / (reg (lambda_i + reg)) and log det Sigma = sum_i log(lambda_i + reg) + (D - n) log reg: n directions
    per class instead of a D x D solve. Returns B, lambda and log det Sigma."""
    _, singular, right = np.linalg.svd(centred, full_matrices=False)
    variances = singular ** 2 / len(centred)
    log_det = np.log(variances + reg).sum() + (centred.shape[1] - len(variances)) * math.log(reg)
    return right.T, variances, float(log_det)


@register_detector("gmm")
class GMM(Detector):
    """s(x) = log sum_k pi_k N(x | mu_k, Sigma_k + reg I): each class its own Gaussian (MDS shares one covariance)."""

    label = "GMM"
    reference_code = "pytorch-ood 0.4.0 pytorch_ood/detector/gmm.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "class-conditional Gaussian mixture (no single paper; pytorch-ood 0.4.0's GMM)"

    @dataclass(frozen=True)
    class Params(Params):
        reg: float = param(1e-6, "added to each class covariance's diagonal (pytorch-ood's 1e-6, gmm.py:55)", ge=0)

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = np.asarray(stored_features(id_train, self.name), dtype=np.float64)
        labels = labels_of(id_train, self.name)
        classes, counts = np.unique(labels, return_counts=True)
        reg, d = self.params["reg"], h.shape[1]
        self.centre = h.mean(axis=0)  # every mean and test row is taken from it: ||x - mu||^2 expanded loses less
        self.means = np.empty((len(classes), d))
        self.log_dets = np.empty(len(classes))
        full, low, factors, directions, variances = [], [], [], [], []
        with lapack_threads():  # one class's factorisation is small: threads on busy cores only wait for each other
            for i, c in enumerate(classes):
                rows = h[labels == c] - self.centre
                self.means[i] = rows.mean(axis=0)
                centred = rows - self.means[i]
                if reg > 0 and 2 * len(rows) <= d:
                    basis, variance, self.log_dets[i] = low_rank(centred, reg)
                    low.append(i)
                    directions.append(basis)
                    variances.append(variance)
                    continue
                covariance = centred.T @ centred / len(rows) + reg * np.eye(d)
                try:
                    factor = np.linalg.cholesky(covariance)
                except np.linalg.LinAlgError:
                    raise ValueError(f"gmm: the covariance of class {int(c)} ({len(rows)} rows, D={d}) is not "
                                     f"positive definite; raise reg (now {reg})") from None
                full.append(i)
                factors.append(factor)
                self.log_dets[i] = 2.0 * np.log(np.diagonal(factor)).sum()
        self.full, self.factors = np.array(full, dtype=np.int64), np.array(factors).reshape(len(full), d, d)
        self.low = np.array(low, dtype=np.int64)
        self.basis = np.concatenate(directions, axis=1) if directions else np.zeros((d, 0))
        self.starts = np.cumsum([0] + [b.shape[1] for b in directions[:-1]]).astype(np.int64)[:len(low)]
        self.shifts = np.concatenate([self.means[i] @ b for i, b in zip(low, directions)]) if low else np.zeros(0)
        self.variances = np.concatenate(variances) if low else np.zeros(0)
        weights = np.sqrt(self.variances / (reg * (self.variances + reg))) if low else np.zeros(0)
        self.scaled, self.scaled_shifts = self.basis * weights, self.shifts * weights
        self.log_weights = np.log(counts / counts.sum())

    def log_likelihoods(self, x: np.ndarray) -> np.ndarray:
        """log pi_k N(x | mu_k, Sigma_k) [N,K] in float64: the low-rank classes' distances from one product with all
        their directions, the others' from triangular solves with their Cholesky factors."""
        x = x - self.centre
        mahalanobis = np.empty((len(x), len(self.means)))
        if len(self.low):
            mahalanobis[:, self.low] = self._low_rank_distances(x)
        for k, factor in zip(self.full, self.factors):
            whitened = scipy.linalg.solve_triangular(factor, (x - self.means[k]).T, lower=True)
            mahalanobis[:, k] = (whitened ** 2).sum(axis=0)
        return self.log_weights - 0.5 * (mahalanobis + self.log_dets + x.shape[1] * math.log(2 * math.pi))

    def _low_rank_distances(self, x: np.ndarray) -> np.ndarray:
        """[N, low-rank classes] squared distances: ||x-mu||^2 / reg (expanded) less the in-span correction, both from
        products over all rows at once; where the correction cancels more than `CANCELLED` of the first term (a row in
        or near the class's span, e.g. a training row) the distance is recomputed from the row's own residual
        (x-mu) - B B^T (x-mu), which loses nothing."""
        reg, means = self.params["reg"], self.means[self.low]
        norms = ((x * x).sum(axis=1)[:, None] - 2.0 * (x @ means.T) + (means * means).sum(axis=1)) / reg
        projected = x @ self.scaled  # (b_i . (x - mu)) sqrt(lambda_i / (reg (lambda_i + reg))), squared in place
        projected -= self.scaled_shifts
        out = norms - np.add.reduceat(np.square(projected, out=projected), self.starts, axis=1)
        ends = [*self.starts[1:], self.basis.shape[1]]
        for j in np.flatnonzero((out < CANCELLED * norms).any(axis=0)):
            rows = np.flatnonzero(out[:, j] < CANCELLED * norms[:, j])
            span = slice(self.starts[j], ends[j])
            diff = x[rows] - means[j]
            inside = diff @ self.basis[:, span]
            residual = diff - inside @ self.basis[:, span].T
            out[rows, j] = (residual ** 2).sum(axis=1) / reg + (inside ** 2 / (self.variances[span] + reg)).sum(axis=1)
        return out

    def _score(self, batch) -> np.ndarray:
        features = stored_features(batch, self.name)
        return map_rows(lambda x: logsumexp(self.log_likelihoods(x), axis=1), features, np.float64, rows=ROWS)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), **{key: getattr(self, key) for key in STATE}}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        for key in STATE:
            setattr(self, key, state[key])
