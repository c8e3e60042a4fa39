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
from detectors.posthoc import streaming
from detectors.posthoc.common import labels_of, logsumexp, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


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
        d = h.shape[1]
        self.means = np.empty((len(classes), d))
        self.factors = np.empty((len(classes), d, d))
        for i, c in enumerate(classes):
            rows = h[labels == c]
            self.means[i] = rows.mean(axis=0)
            centred = rows - self.means[i]
            covariance = centred.T @ centred / len(rows) + self.params["reg"] * np.eye(d)
            try:
                self.factors[i] = np.linalg.cholesky(covariance)
            except np.linalg.LinAlgError:
                raise ValueError(f"gmm: the covariance of class {int(c)} ({len(rows)} rows, D={d}) is not positive "
                                 f"definite; raise reg (now {self.params['reg']})") from None
        self.log_dets = 2.0 * np.log(np.diagonal(self.factors, axis1=1, axis2=2)).sum(axis=1)
        self.log_weights = np.log(counts / counts.sum())

    def log_likelihoods(self, x: np.ndarray) -> np.ndarray:
        """log pi_k N(x | mu_k, Sigma_k) [N,K] in float64 (triangular solves with the Cholesky factors)."""
        out = np.empty((len(x), len(self.means)))
        constant = x.shape[1] * math.log(2 * math.pi)
        for k, (mean, factor) in enumerate(zip(self.means, self.factors)):
            whitened = scipy.linalg.solve_triangular(factor, (x - mean).T, lower=True)
            out[:, k] = self.log_weights[k] - 0.5 * ((whitened ** 2).sum(axis=0) + self.log_dets[k] + constant)
        return out

    def _score(self, batch) -> np.ndarray:
        return streaming.map_rows(lambda _, x: logsumexp(self.log_likelihoods(x), axis=1),
                                  stored_features(batch, self.name), np.float64)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "means": self.means, "factors": self.factors, "log_dets": self.log_dets,
                "log_weights": self.log_weights}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.means, self.factors = state["means"], state["factors"]
        self.log_dets, self.log_weights = state["log_dets"], state["log_weights"]
