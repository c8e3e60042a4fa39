"""SCALE (Xu et al., ICLR 2024): the penultimate features times exp(sum(h) / sum of their top k), then energy.

The official code (kai422/SCALE at 6a6ab91, an OpenOOD fork) scales the pooled feature vector
(`openood/networks/scale_net.py:18-23`): k = D - round(D * percentile / 100) (`:37-38`), the ratio r of the sum of all
activations to the sum of the k largest (`:36`, `:40-47`), and the unpruned features times exp(r) (`:49`); the
postprocessor scores logsumexp of the logits (`openood/postprocessors/scale_postprocessor.py:20-22`) with percentile 85
and the sweep 50 ... 95 (`configs/postprocessors/scale.yml:5, 7`). Since W (e^r h) + b = e^r (W h) + b, the head runs
once on h. A row whose k largest activations sum to 0 (an all-zero ReLU row) gets r = 1 where the reference divides
0 by 0 (NaN); k is at least 1 where a small D rounds it to 0 (the reference: an empty sum).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector
from detectors.posthoc import threads
from detectors.posthoc.common import logsumexp_rows, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


def kept_count(dim: int, percentile: float) -> int:
    """k = D - round(D * percentile / 100), the activations that decide the ratio, at least 1 (pytorch-ood's guard,
    lts.py: the official codes divide by an empty sum where a small D rounds k to 0)."""
    return max(1, dim - int(np.round(dim * percentile / 100.0)))


def scale_ratio(features: np.ndarray, percentile: float, relu: bool = False) -> np.ndarray:
    """r = sum(h) / (sum of the k largest h) per row (of relu(h) with `relu`), float64 sums (1 where both are 0);
    the k largest by one np.sort of the rows (numpy's vectorised sort: here faster than np.partition's introselect and
    than torch.topk); shared with LTS."""
    h = np.maximum(features, 0) if relu else np.asarray(features)
    d = h.shape[1]
    k = kept_count(d, percentile)
    total = h.sum(axis=1, dtype=np.float64)
    if k < d:
        if relu:  # its own copy: sorted in place
            h.sort(axis=1)
        else:
            h = np.sort(h, axis=1)
    kept = total if k == d else h[:, d - k:].sum(axis=1, dtype=np.float64)
    empty = (kept == 0) & (total == 0)
    return np.where(empty, 1.0, total / np.where(empty, 1.0, kept))


SCORE_ROWS = 2048
"""Rows per scoring block of SCALE and LTS: a block's features, sorted copy and logits stay in cache; the blocks run on
a thread per core (`threads.map_rows`), each sorting and multiplying its own rows."""


def scale_logits(features: np.ndarray, weight: np.ndarray, bias: np.ndarray, percentile: float) -> np.ndarray:
    """W (exp(r) h) + b = exp(r) (W h) + b in the features' precision."""
    h = np.asarray(features)
    factor = np.exp(scale_ratio(h, percentile)).astype(h.dtype)
    logits = h @ weight.T.astype(h.dtype, copy=False)
    logits *= factor[:, None]
    logits += bias.astype(h.dtype, copy=False)
    return logits


@register_detector("scale")
class SCALE(Detector):
    """s = logsumexp(exp(r) W h + b), r = sum(h) / sum(top-k h): every activation kept and scaled (ASH-S prunes)."""

    label = "SCALE"
    reference_code = "kai422/SCALE openood/networks/scale_net.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Xu et al., Scaling for Training Time and Post-hoc Out-of-distribution Detection Enhancement, ICLR 2024"

    @dataclass(frozen=True)
    class Params(Params):
        percentile: float = param(85, "the ratio's denominator sums the activations above their per-sample p-th "
                                  "percentile (scale.yml:5)", ge=0, lt=100)

    fit_inputs = frozenset({"head"})
    search_space = {"percentile": [50, 55, 60, 65, 70, 75, 80, 85, 90, 95]}  # configs/postprocessors/scale.yml:7
    needs_head = True

    def _score(self, batch) -> np.ndarray:
        def rows(h: np.ndarray) -> np.ndarray:
            return logsumexp_rows(scale_logits(h, self.head.weight, self.head.bias, self.params["percentile"]))

        return threads.map_rows(rows, stored_features(batch, self.name), np.float32, SCORE_ROWS)
