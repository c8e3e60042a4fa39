"""Weighted energy (WEBO): log sum_k relu(w_k) exp(z_k), the energy of VOS (Du et al., ICLR 2022) with its learned
per-class weights; pytorch-ood's `WeightedEBO`."""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc import streaming, threads
from detectors.posthoc.common import logsumexp, stored_logits
from detectors.registry import register_detector
from pipelines.params import Params, param

SUM_ELEMENTS = 1 << 18
"""Logits per step of the weighted sum (1 MiB of float32): a step's exp stays in its core's cache until the product
reads it."""
TASK_ELEMENTS = 1 << 22
"""Most logits per thread task (`threads.map_blocks`): a core's steps run in one task, since each task's hand-off
costs tens of microseconds, as long as a stored (memory-mapped) input's copy stays small (16 MiB of float32). The
tasks never wait for each other, where each of torch's parallel regions waits for all its threads, a scheduler slice
apiece on a loaded machine."""


def weighted_energy(logits: np.ndarray, weights: np.ndarray | None) -> np.ndarray:
    """log sum_k relu(w_k) exp(z_k), float64 [N] (higher = more ID). The sum is taken as the reference takes it,
    exp(z) @ relu(w) in the logits' precision (float32 for float16 storage; no shift by the row's maximum), in steps
    of `SUM_ELEMENTS`, a task per core; a row whose sum overflows, or is so small that subnormal terms could cost
    digits (below C max(w, 1) tiny / eps: in float32 a logit above 88, or all below about -72 + log C), is redone as
    logsumexp(z + log relu(w)) in float64, where the reference returns inf or loses digits. None = all ones (EBO at
    T = 1)."""
    z = np.asarray(logits)
    if weights is None:
        return logsumexp(z, axis=1)
    w = np.maximum(np.asarray(weights, dtype=np.float64).reshape(-1), 0.0)
    if w.size != z.shape[1]:
        raise ValueError(f"webo: {w.size} weights for logits of {z.shape[1]} classes")
    dtype = z.dtype if z.dtype in (np.float32, np.float64) else np.dtype(np.float32)
    wz, buffers = w.astype(dtype), threading.local()
    step = max(1, SUM_ELEMENTS // len(w))
    task = max(step, min(-(-len(z) // threads.usable_cores()), TASK_ELEMENTS // len(w)))

    def sums(block: np.ndarray) -> np.ndarray:
        if getattr(buffers, "exp", None) is None:  # one per thread: a fresh array per task would fault its pages in
            buffers.exp = streaming.scratch((step, len(w)), dtype)
        out = np.empty(len(block), dtype)
        with np.errstate(over="ignore", invalid="ignore"):  # inf (or inf * 0) sums: redone in float64 below
            for start in range(0, len(block), step):
                rows = block[start:start + step]
                np.matmul(np.exp(rows, out=buffers.exp[:len(rows)]), wz, out=out[start:start + step])
        return out

    total = threads.map_rows(sums, z, dtype, task)
    info = np.finfo(dtype)
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
