"""GradNorm: L1 norm of the gradient of KL(uniform || softmax) w.r.t. the last layer (Huang et al., NeurIPS 2021)."""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import raw_features, softmax
from detectors.registry import register_detector


def gradnorm_score(features: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """Closed form ||dKL(u || softmax(Wh + b)) / dW||_1 = ||h||_1 * ||softmax(Wh + b) - u||_1 (no backward).

    The projection runs in the features' precision (float32 for a feature cache, as the model computed it); the norms
    and the softmax in float64.
    """
    h = np.asarray(features)
    logits = h @ weight.T.astype(h.dtype, copy=False) + bias.astype(h.dtype, copy=False)
    probs = softmax(logits)
    return np.abs(h).sum(axis=1, dtype=np.float64) * np.abs(probs - 1.0 / weight.shape[0]).sum(axis=1)


@register_detector("gradnorm")
class GradNorm(Detector):
    """s(x) = ||h||_1 * ||softmax(Wh + b) - 1/C||_1 on penultimate features h and the linear head (W, b)."""

    label = "GradNorm"
    reference_code = "OpenOOD openood/postprocessors/gradnorm_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Huang et al., On the Importance of Gradients for Detecting Distributional Shifts in the Wild, NeurIPS 2021"
    fit_inputs = frozenset({"head"})
    needs_head = True

    def _score(self, batch: Any) -> np.ndarray:
        if self.head is None:
            raise RuntimeError("gradnorm: call fit(..., head=LinearHead(W, b)) before score()")
        return gradnorm_score(raw_features(batch, self.name), self.head.weight, self.head.bias)
