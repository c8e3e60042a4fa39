"""Weighted energy (WEBO): log sum_k relu(w_k) exp(z_k), the energy of VOS (Du et al., ICLR 2022) with its learned
per-class weights; pytorch-ood's `WeightedEBO`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import logits_of, logsumexp
from detectors.registry import register_detector
from pipelines.params import Params, param


def weighted_energy(logits: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """log sum_k relu(w_k) exp(z_k) in float64 (higher = more ID), as logsumexp(z + log relu(w)): no overflow where
    the reference's exp(z) overflows float32; None = all ones (EBO at T = 1)."""
    z = np.asarray(logits, dtype=np.float64)
    if weights is None:
        return logsumexp(z, axis=1)
    w = np.maximum(np.asarray(weights, dtype=np.float64).reshape(-1), 0.0)
    if w.size != z.shape[1]:
        raise ValueError(f"webo: {w.size} weights for logits of {z.shape[1]} classes")
    with np.errstate(divide="ignore"):  # a zero weight drops its class: log 0 = -inf
        return logsumexp(z + np.log(w), axis=1)


@register_detector("webo")
class WeightedEBO(Detector):
    """s(x) = log sum_k relu(w_k) exp(z_k): the weighted energy VOS trains its uncertainty head with (pytorch-ood's
    WeightedEBO returns its negative as the outlier score)."""

    label = "WEBO"
    aliases = {"WeightedEBO": "pytorch-ood's"}
    reference = "pytorch-ood 0.4.0 pytorch_ood/detector/webo.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Du et al., VOS: Learning What You Don't Know by Virtual Outlier Synthesis, ICLR 2022"

    @dataclass(frozen=True)
    class Params(Params):
        weights: list[float] | None = param(None, "per-class weights w [C] (VOS's learned `weight_energy`; relu "
                                            "applied); null: all ones, the energy score")

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.weights is not None and not any(w > 0 for w in self.weights):
                raise ValueError("weights: at least one must be > 0 (relu(w) = 0 everywhere leaves no class)")
            if self.weights is not None and dims and "classes" in dims and len(self.weights) != dims["classes"]:
                raise ValueError(f"weights: {len(self.weights)} given for {dims['classes']} classes")

    def _score(self, batch: Any) -> np.ndarray:
        return weighted_energy(logits_of(batch, self.name), self.params["weights"])
