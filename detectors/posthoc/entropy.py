"""Entropy: the negative entropy of the softmax, -H(softmax(z)) (Chan et al., ICCV 2021; pytorch-ood's `Entropy`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import log_softmax, logits_of
from detectors.registry import register_detector
from pipelines.params import Params, param

REFERENCE_CLIP = 1e-7
"""pytorch-ood 0.4.0 clips the probabilities to [1e-7, 1] before the logarithm (detector/entropy.py:69)."""


def negative_entropy(logits: np.ndarray, clip: float | None = REFERENCE_CLIP) -> np.ndarray:
    """sum_k p_k log p_k of p = softmax(z) in float64 (higher = more peaked = more ID); `clip` floors p first (the
    reference's), None keeps the exact entropy (log p from log-softmax: no underflow to log 0)."""
    log_p = log_softmax(logits)
    p = np.exp(log_p)
    if clip is not None:
        p = np.clip(p, clip, 1.0)
        log_p = np.log(p)
    return (p * log_p).sum(axis=1)


@register_detector("entropy")
class Entropy(Detector):
    """s(x) = sum_k p_k log p_k, p = softmax(z): minus the softmax entropy."""

    label = "Entropy"
    reference = "pytorch-ood 0.4.0 pytorch_ood/detector/entropy.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = ("Chan et al., Entropy Maximization and Meta Classification for Out-of-Distribution Detection in Semantic "
             "Segmentation, ICCV 2021")

    @dataclass(frozen=True)
    class Params(Params):
        clip: float | None = param(REFERENCE_CLIP, "probabilities floored here before the log (pytorch-ood's 1e-7, "
                                   "entropy.py:69); null: the exact entropy", gt=0, lt=1)

    def _score(self, batch: Any) -> np.ndarray:
        return negative_entropy(logits_of(batch, self.name), self.params["clip"])
