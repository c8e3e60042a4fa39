"""ASH (Djurisic et al., ICLR 2023): per sample, keep the top activations (binarise, keep, or keep and sharpen), then
energy."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import logsumexp, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param

VARIANTS = ("b", "p", "s")


def _kept(features: np.ndarray, percentile: float, variant: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Per row, the shaped values [N,k] and unit indices [N,k] of the k = D - round(D * percentile / 100) largest
    entries."""
    if variant not in VARIANTS:
        raise ValueError(f"ash: variant={variant!r} must be one of {VARIANTS}")
    if not 0 <= percentile < 100:
        raise ValueError(f"ash: percentile={percentile} must be in [0, 100)")
    d = features.shape[1]
    k = d - int(np.round(d * percentile / 100.0))
    if k < 1:
        raise ValueError(f"ash: percentile={percentile} keeps no activation of D={d}")
    x = torch.from_numpy(np.ascontiguousarray(features))
    kept, index = torch.topk(x, k, dim=1, sorted=False)
    total = x.sum(dim=1, keepdim=True, dtype=torch.float64)
    if variant == "b":
        kept = (total / k).to(x.dtype).expand_as(kept)
    elif variant == "s":
        kept = (kept * torch.exp(total / kept.sum(dim=1, keepdim=True, dtype=torch.float64))).to(x.dtype)
    return kept, index


def ash(features: np.ndarray, percentile: float, variant: str) -> np.ndarray:
    """Activation shaping of rows [N,D] (in their dtype; sums in float64), dense: the kept entries are
    b: sum(h) / k; p: their values; s: their values times exp(sum(h) / sum(kept)); all others 0."""
    kept, index = _kept(features, percentile, variant)
    return torch.zeros(features.shape, dtype=kept.dtype).scatter_(1, index, kept).numpy()


def ash_logits(features: np.ndarray, weight: np.ndarray, bias: np.ndarray, percentile: float,
               variant: str) -> np.ndarray:
    """W ash(h) + b without forming ash(h): a weighted sum of the k kept columns of W per row (embedding_bag),
    N k C multiply-adds instead of the dense N D C."""
    kept, index = _kept(features, percentile, variant)
    columns = torch.from_numpy(np.ascontiguousarray(weight.T, dtype=features.dtype))
    logits = F.embedding_bag(index, columns, per_sample_weights=kept.contiguous(), mode="sum")
    return logits.numpy() + bias.astype(logits.numpy().dtype, copy=False)


@register_detector("ash")
class ASH(Detector):
    """s = logsumexp(W ash(h) + b), ASH applied to the pooled penultimate features (the paper shapes the last feature
    map before pooling; a feature cache holds the pooled vector). OpenOOD's default variant is ASH-B."""

    label = "ASH"
    reference_code = "OpenOOD openood/postprocessors/ash_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Djurisic et al., Extremely Simple Activation Shaping for Out-of-Distribution Detection, ICLR 2023"

    @dataclass(frozen=True)
    class Params(Params):
        percentile: float = param(90, "activations below their per-sample p-th percentile are pruned", ge=0, lt=100)
        variant: Literal["b", "p", "s"] = param("b", "ASH-B (binarise), ASH-P (prune) or ASH-S (scale)")

    fit_inputs = frozenset({"head"})
    search_space = {"percentile": [65, 70, 75, 80, 85, 90, 95]}  # OpenOOD v1.5
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        if self.params["variant"] not in VARIANTS:
            raise ValueError(f"ash: variant={self.params['variant']!r} must be one of {VARIANTS}")

    def _score(self, batch) -> np.ndarray:
        def rows(_, h: np.ndarray) -> np.ndarray:
            return logsumexp(ash_logits(h.astype(np.float32, copy=False), self.head.weight, self.head.bias,
                                        self.params["percentile"], self.params["variant"]))

        return streaming.map_rows(rows, stored_features(batch, self.name))
