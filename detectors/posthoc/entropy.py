"""Entropy: the negative entropy of the softmax, -H(softmax(z)) (Chan et al., ICCV 2021; pytorch-ood's `Entropy`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import BLOCK_ROWS, stored_logits
from detectors.registry import register_detector
from pipelines.params import Params, param

REFERENCE_CLIP = 1e-7
"""pytorch-ood 0.4.0 clips the probabilities to [1e-7, 1] before the logarithm (detector/entropy.py:69)."""


def negative_entropy(logits: np.ndarray, clip: float | None = REFERENCE_CLIP) -> np.ndarray:
    """sum_k p_k log p_k of p = softmax(z), float64 [N] (higher = more peaked = more ID): log p from the log-softmax
    (no log 0), floored at log(`clip`) where `clip` is given (the reference's p.clip(clip, 1)); elementwise in the
    logits' precision (float32 as the model's, float64 exact), block by block, each row's sum in float64."""
    z = np.asarray(logits)
    out = np.empty(len(z))
    for start in range(0, len(z), BLOCK_ROWS):
        x = z[start:start + BLOCK_ROWS]
        x = x - x.max(axis=1, keepdims=True)
        e = np.exp(x)
        log_p = x - np.log(e.sum(axis=1, keepdims=True, dtype=np.float64)).astype(x.dtype)
        if clip is not None:
            np.maximum(log_p, x.dtype.type(math.log(clip)), out=log_p)
        np.exp(log_p, out=e)
        out[start:start + BLOCK_ROWS] = np.einsum("ij,ij->i", e, log_p, dtype=np.float64)
    return out


@register_detector("entropy")
class Entropy(Detector):
    """s(x) = sum_k p_k log p_k, p = softmax(z): minus the softmax entropy."""

    label = "Entropy"
    reference_code = "pytorch-ood 0.4.0 pytorch_ood/detector/entropy.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = ("Chan et al., Entropy Maximization and Meta Classification for Out-of-Distribution Detection in Semantic "
             "Segmentation, ICCV 2021")

    @dataclass(frozen=True)
    class Params(Params):
        clip: float | None = param(REFERENCE_CLIP, "probabilities floored here before the log (pytorch-ood's 1e-7, "
                                   "entropy.py:69); null: the exact entropy", gt=0, lt=1)

    def _score(self, batch: Any) -> np.ndarray:
        return negative_entropy(stored_logits(batch, self.name), self.params["clip"])
