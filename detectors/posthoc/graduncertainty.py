"""GradUncertainty (Lee & AlRegib, ICIP 2020): the squared gradient norm of a "confounding label" loss, here of the
linear head's weight and bias, in closed form from the penultimate features (no backward pass).

pytorch-ood 0.4.0 `pytorch_ood/detector/graduncertainty.py` (no official code; its DetectorInfo names none) is the
reference: `:152-155` the loss binary_cross_entropy(softmax(z), 1, reduction="sum") per sample, `:157-162` minus the
sum over the selected parameters of the squared gradient entries (`param_filter`, `:137-141`; all parameters of the
model it is given). With the head as that model (W, b):

    dL/dW = g h^T, dL/db = g  ->  ||dL/dW||^2 + ||dL/db||^2 = ||g||^2 (||h||^2 + 1),

g = dL/dz = p * (u - <u, p>) with u_k = dL/dp_k = (p_k - 1) / max((1 - p_k) p_k, 1e-12), torch's BCE gradient
(aten `binary_cross_entropy_backward`, EPSILON 1e-12: for 1e-12 < p_k (1 - p_k) it is -1 / p_k, and g = C p - 1).
The softmax and u are taken in the logits' precision (float32 for a float32 cache, as torch computes them there; the
clamp decides at float32's rounding of p), the norms in float64. The paper trains a classifier on per-layer norms;
pytorch-ood scores their negated sum without training, as here (higher = more ID: the confident gradient is large).
"""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc import streaming
from detectors.posthoc.common import stored_features
from detectors.registry import register_detector

BCE_EPSILON = 1e-12
"""torch's floor of p (1 - p) in the binary cross-entropy gradient (aten/src/ATen/native/Loss.cpp)."""


def confounding_gradient(logits: np.ndarray) -> np.ndarray:
    """g = d/dz sum_k BCE(softmax(z)_k, 1) as torch's autograd gives it, [N, C] float64 (softmax and the BCE
    gradient in the logits' precision)."""
    z = np.asarray(logits)
    e = np.exp(z - z.max(1, keepdims=True))
    p = e / e.sum(1, keepdims=True)
    u = (p - 1) / np.maximum((1 - p) * p, z.dtype.type(BCE_EPSILON))
    p, u = p.astype(np.float64), u.astype(np.float64)
    return p * (u - (u * p).sum(1, keepdims=True))


def head_gradient_norm(features: np.ndarray, weight: np.ndarray, bias: np.ndarray) -> np.ndarray:
    """||dL/dW||^2 + ||dL/db||^2 per row, float64; the head runs in the features' precision."""
    h = np.asarray(features)
    z = h @ weight.T.astype(h.dtype, copy=False) + bias.astype(h.dtype, copy=False)
    g = confounding_gradient(z)
    return np.einsum("ij,ij->i", g, g) * (np.einsum("ij,ij->i", h, h, dtype=np.float64) + 1.0)


@register_detector("graduncertainty")
class GradUncertainty(Detector):
    """s = ||g||^2 (||h||^2 + 1), g = d sum_k BCE(softmax(Wh + b)_k, 1) / dz: the head's squared gradient norm."""

    label = "GradUncertainty"
    reference_code = "pytorch-ood pytorch_ood/detector/graduncertainty.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Lee and AlRegib, Gradients as a Measure of Uncertainty in Neural Networks, ICIP 2020"
    fit_inputs = frozenset({"head"})
    needs_head = True

    def _score(self, batch: Any) -> np.ndarray:
        def rows(_, h: np.ndarray) -> np.ndarray:
            h = h if h.dtype in (np.float32, np.float64) else h.astype(np.float32)
            return head_gradient_norm(h, self.head.weight, self.head.bias)

        return streaming.map_rows(rows, stored_features(batch, self.name))
