"""Weighted energy (WEBO): log sum_k relu(w_k) exp(z_k), the energy of VOS (Du et al., ICLR 2022) with its learned
per-class weights; pytorch-ood's `WeightedEBO`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from detectors.base import Detector
from detectors.posthoc.common import logsumexp, stored_logits
from detectors.registry import register_detector
from pipelines.params import Params, param

SUM_ELEMENTS = 1 << 22
"""Logits per block of the weighted sum (16 MB of float32): few, large blocks, since each of torch's parallel regions
waits for all its threads, a scheduler slice apiece on a loaded machine (20k x 200 logits in blocks of 1024 rows: 0.7
ms against 0.9 ms in one block alone, but a median 260 ms against 17 ms beside other jobs on 2 cores)."""


def weighted_energy(logits: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """log sum_k relu(w_k) exp(z_k), float64 [N] (higher = more ID). The sum is taken as the reference takes it,
    exp(z) @ relu(w) in the logits' precision (torch's exp and matrix-vector product in blocks of `SUM_ELEMENTS`, no
    shift by the row's maximum); a row whose sum overflows, or is so small that subnormal terms could cost digits
    (below C max(w, 1) tiny / eps: in float32 a logit above 88, or all below about -72 + log C), is redone as
    logsumexp(z + log relu(w)) in float64, where the reference returns inf or loses digits. None = all ones (EBO at
    T = 1)."""
    z = np.asarray(logits)
    if weights is None:
        return logsumexp(z, axis=1)
    w = np.maximum(np.asarray(weights, dtype=np.float64).reshape(-1), 0.0)
    if w.size != z.shape[1]:
        raise ValueError(f"webo: {w.size} weights for logits of {z.shape[1]} classes")
    rows, wz = torch.from_numpy(np.ascontiguousarray(z)), torch.from_numpy(w.astype(z.dtype))
    sums, block = torch.empty(len(z), dtype=rows.dtype), max(1, SUM_ELEMENTS // max(len(w), 1))
    for start in range(0, len(z), block):
        torch.mv(torch.exp(rows[start:start + block]), wz, out=sums[start:start + block])
    total = sums.numpy().astype(np.float64)
    info = np.finfo(z.dtype)
    exact = np.isfinite(total) & (total >= float(info.tiny / info.eps) * len(w) * max(float(w.max()), 1.0))
    out = np.log(np.where(exact, total, 1.0))
    if not exact.all():
        with np.errstate(divide="ignore"):  # a zero weight drops its class: log 0 = -inf
            out[~exact] = logsumexp(z[~exact].astype(np.float64) + np.log(w), axis=1)
    return out


@register_detector("webo")
class WeightedEBO(Detector):
    """s(x) = log sum_k relu(w_k) exp(z_k): the weighted energy VOS trains its uncertainty head with (pytorch-ood's
    WeightedEBO returns its negative as the outlier score)."""

    label = "WEBO"
    aliases = {"WeightedEBO": "pytorch-ood's"}
    reference_code = "pytorch-ood 0.4.0 pytorch_ood/detector/webo.py"
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
        return weighted_energy(stored_logits(batch, self.name), self.params["weights"])
