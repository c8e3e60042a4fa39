"""Entropy: the negative entropy of the softmax, -H(softmax(z)) (Chan et al., ICCV 2021; pytorch-ood's `Entropy`)."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import stored_logits
from detectors.posthoc.threads import map_rows
from detectors.registry import register_detector
from pipelines.params import Params, param

REFERENCE_CLIP = 1e-7
"""pytorch-ood 0.4.0 clips the probabilities to [1e-7, 1] before the logarithm (detector/entropy.py:69)."""


BLOCK_VALUES = 1 << 17
"""Logits per block (rows = BLOCK_VALUES // C, at least one): a block's few elementwise passes stay in cache whatever
the number of classes (fixed 1024-row blocks left a 19-class segmentation frame's 2M pixel rows in 2048 blocks of
a few microseconds' work each, mostly call overhead)."""


def negative_entropy(logits: np.ndarray, clip: float | None = REFERENCE_CLIP) -> np.ndarray:
    """sum_k p_k log p_k of p = softmax(z), float64 [N] (higher = more peaked = more ID): log p from the log-softmax
    (no log 0), floored at log(`clip`) where `clip` is given (the reference's p.clip(clip, 1)); elementwise in the
    logits' precision (float32 as the model's, float64 exact), each row's sum in float64, block by block
    (`threads.map_rows`: read-only views on a thread per core; row by row the same arithmetic on any blocks)."""
    z = np.asarray(logits)
    rows = max(1, BLOCK_VALUES // max(z.shape[1], 1))
    return map_rows(lambda block: _negative_entropy_rows(block, clip), z, rows=rows)


FEW_CLASSES = 64
"""Below this many classes a block is scored transposed, classes as rows: numpy's reductions along a row of a few
values cost more per row than the arithmetic (a 19-class frame: 0.38 s CPU row-wise, 0.23 s transposed; at 200
classes both 0.22 s)."""


def _negative_entropy_rows(x: np.ndarray, clip: float | None) -> np.ndarray:
    """sum_k p_k log p_k of each row of the block x [n, C]; with few classes on its transpose (the same elementwise
    values in float32/float64; the float64 sums of same-signed terms taken in another order: 3e-16 relative)."""
    axis = 0 if x.shape[1] < FEW_CLASSES else 1
    if axis == 0:
        x = np.ascontiguousarray(x.T)
    x = x - x.max(axis=axis, keepdims=True)
    e = np.exp(x)
    log_p = x - np.log(e.sum(axis=axis, keepdims=True, dtype=np.float64)).astype(x.dtype)
    if clip is not None:
        np.maximum(log_p, x.dtype.type(math.log(clip)), out=log_p)
    np.exp(log_p, out=e)
    return np.einsum("ij,ij->j" if axis == 0 else "ij,ij->i", e, log_p, dtype=np.float64)


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
