"""pNML regret (Bibas et al., NeurIPS 2021): the single-layer predictive normalised maximum likelihood regret of the
classifier's last layer on L2-normalised features.

The official code (kobybibas/pnml_ood_detection at 8fae91b, `src/lit_utils/baseline_lit_utils.py`): the penultimate
features over their norm (`:68-70`), the class probabilities of the head on those normalised features (`:73`, `:133`,
`self.w` the model's fc `:24`), the pseudo-inverse of X^T X of the normalised training features (`:107`, `:113-115`,
rcond 1e-15 `:42`), g = |x^T (X^T X)^+ x| / (1 + |x^T (X^T X)^+ x|) (`:189-195`), and the regret log(sum_c p_c /
(p_c + (1 - p_c) p_c^g)) / log C (`:200-201`); `src/main_score.py:63` scores 1 - regret (higher = more ID). pytorch-ood
0.4.0's port (`ai_coded`) clamps p to [1e-12, 1 - 1e-12]; here each term is 1 / (1 + (1 - p) p^(g - 1)) from the
log-softmax, its exact limit 0 at p -> 0 (no clamp).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.linalg
import scipy.linalg.lapack

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import log_softmax, stored_features
from detectors.posthoc.nnguide import normalised
from detectors.posthoc.threads import lapack_threads, map_blocks, map_rows
from detectors.registry import register_detector
from pipelines.params import Params, param


def regret(log_probs: np.ndarray, g: np.ndarray) -> np.ndarray:
    """log(sum_c p_c / (p_c + (1 - p_c) p_c^g)) / log C per row, float64, written 1 / (1 + (1 - p) p^(g - 1)) (its
    exact limit 0 where p underflows); one class: 0."""
    classes = log_probs.shape[1]
    if classes == 1:
        return np.zeros(len(log_probs))
    p = np.exp(log_probs)
    power = (g[:, None] - 1.0) * log_probs
    with np.errstate(over="ignore"):  # in place: the same operations in the same order
        np.exp(power, out=power)
    np.subtract(1.0, p, out=p)
    p *= power
    p += 1.0
    np.divide(1.0, p, out=p)
    return np.log(p.sum(axis=1)) / np.log(classes)


def hermitian_pinv(matrix: np.ndarray, rcond: float) -> np.ndarray:
    """The pseudo-inverse of a symmetric PSD matrix on the cores the machine leaves idle (`threads.lapack_threads`: one
    thread under load, where a threaded LAPACK reduction is several times slower): its inverse from the Cholesky factor
    where that is the pseudo-inverse to float64 rounding (`cholesky_inverse`), else from its float64 eigh, eigenvalues
    at most rcond x the largest dropped, as np.linalg.pinv(hermitian=True)."""
    with lapack_threads():
        inverse = cholesky_inverse(matrix, rcond)
        if inverse is not None:
            return inverse
        values, vectors = scipy.linalg.eigh(matrix, driver="evd")
    kept = np.abs(values) > rcond * np.abs(values).max()
    return (vectors[:, kept] / values[kept]) @ vectors[:, kept].T


MAX_CONDITION = 1e7
"""Largest estimated condition number at which `cholesky_inverse` stands in for the eigh pseudo-inverse: the two then
differ by about cond x float64 eps (1e-9) relative, below the float32 rounding of the projector that scores (at the
benchmark's 20k x 1024 Gram matrix, condition 1.4e3, 6 of its 1M float32 entries moved by one ulp)."""


def cholesky_inverse(matrix: np.ndarray, rcond: float) -> np.ndarray | None:
    """G^-1 = L^-T L^-1 from G's Cholesky factor L (L^-1 by `trtri`, the product a symmetric rank-k update: about D^3
    multiply-adds, a quarter of the CPU time of the eigh at D = 1024) where G is positive definite with an estimated
    1-norm condition number (`pocon`, an upper bound on the 2-norm one up to the estimator's factor) below
    MAX_CONDITION and 0.01 / rcond: then no eigenvalue falls below rcond x the largest and the inverse is the
    pseudo-inverse. None otherwise (singular or ill-conditioned: the eigh drops what rcond says)."""
    matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.size == 0:
        return None
    factor, info = scipy.linalg.lapack.dpotrf(matrix, lower=1, clean=1)
    if info != 0:
        return None
    reciprocal, info = scipy.linalg.lapack.dpocon(factor, np.abs(matrix).sum(axis=0).max(), uplo="L")
    if info != 0 or not reciprocal * min(MAX_CONDITION, 0.01 / rcond) > 1.0:
        return None
    inverse_factor, info = scipy.linalg.lapack.dtrtri(factor, lower=1)
    if info != 0:
        return None
    return inverse_factor.T @ inverse_factor


@register_detector("pnml")
class PNML(Detector):
    """s(x) = -regret: minus the pNML regret of the head on x / ||x|| (1 - regret in the official tables)."""

    label = "pNML"
    reference_code = "kobybibas/pnml_ood_detection src/lit_utils/baseline_lit_utils.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = ("Bibas et al., Single Layer Predictive Normalized Maximum Likelihood for Out-of-Distribution Detection, "
             "NeurIPS 2021")

    @dataclass(frozen=True)
    class Params(Params):
        rcond: float = param(1e-15, "relative cutoff of the pseudo-inverse of X^T X (baseline_lit_utils.py:42)",
                             gt=0, lt=1)

    fit_inputs = frozenset({"head"})
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        gram = np.zeros((h.shape[1], h.shape[1]))
        # float32 products (the reference's), summed in float64; in-memory rows are read as views (no chunk copy)
        for _, block in streaming.blocks(h, np.float32, read_only=True):
            x = np.empty(block.shape, np.float32)
            for part, rows in map_blocks(normalised, block, np.float32):  # row by row, a thread per core
                x[part] = rows
            gram += x.T @ x
        (gram,) = streaming.reduce_sum(gram)
        self.projector = hermitian_pinv(gram, self.params["rcond"])

    def _score(self, batch) -> np.ndarray:
        """Per block of rows (`threads.map_rows`: read-only views on a thread per core, one BLAS thread each):
        the products and the float64 regret while the block is in cache, the elementwise passes on every core;
        row by row the same arithmetic as on the whole array."""
        projector = self.projector.astype(np.float32)

        def rows(h: np.ndarray) -> np.ndarray:
            x = normalised(h)
            quadratic = np.abs(np.einsum("nd,nd->n", x @ projector, x, dtype=np.float64))
            return -regret(log_softmax(self.head(x)), quadratic / (1.0 + quadratic))

        h = stored_features(batch, self.name)
        return map_rows(rows, h, np.float32)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "projector": self.projector}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.projector = state["projector"]
