"""VRA, variational rectified activation (Xu et al., NeurIPS 2023): each feature rectified between two of its ID
quantiles, then energy.

The official code (zeroQiaoba/VRA at 4dad931): `ood_eval.py:152-160` takes per-dimension quantiles q1, q2 of the
training features (`torch.quantile(feat, q, dim=0)`, linear); `models/resnet.py:206-209` (and `models/densenet.py:
137-140`) sets a feature below its lower quantile to 0 and one above its upper quantile to that quantile
(`torch.where` twice, in that order), then the linear head; `util/score.py:93-108` scores logsumexp of the logits
(`--method energy`, `ood_eval.py:35`). `readme.md:48` runs VRA with q1 = 0.6, q2 = 0.9 (CIFAR-10). VRA+ (`--lamb`)
and VRA++ (`--method vnorm`) are not this detector.

pytorch-ood 0.4.0's `VRA` (`ai_coded`) clips below the lower quantile to the quantile (`below: clip`) at 0.01 / 0.99;
OpenOOD's port clips the same way at two percentiles of every ID *validation* activation pooled
(`vra_postprocessor.py:26-36, 41-44, 48-55`: `thresholds: global`, `fit_split: id_val`), which the `openood_v1.5`
protocol runs with its 10 / 90 (`configs/postprocessors/vra.yml:5-6`); the global percentiles are exact in two
streamed passes.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import logsumexp, model_precision, raw_features, stored_features
from detectors.registry import register_detector
from pipelines.params import ParamError, Params, param


def rectify(h: np.ndarray, low: np.ndarray, high: np.ndarray, below: str) -> np.ndarray:
    """The official rectification in h's precision: h < low -> 0 (`below: zero`) or low (`clip`), then any value
    above high -> high (so a zeroed value above a negative `high` becomes `high`, as the official second `where`)."""
    low, high = low.astype(h.dtype, copy=False), high.astype(h.dtype, copy=False)
    out = np.where(h < low, h.dtype.type(0), h) if below == "zero" else np.maximum(h, low)
    return np.minimum(out, high, out=out)


@register_detector("vra")
class VRA(Detector):
    """s = logsumexp(W r(h) + b), r(h)_j = 0 below the ID quantile lo_j, hi_j above hi_j, h_j between."""

    label = "VRA"
    reference_code = "zeroQiaoba/VRA ood_eval.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Xu et al., VRA: Variational Rectified Activation for Out-of-distribution Detection, NeurIPS 2023"

    @dataclass(frozen=True)
    class Params(Params):
        low: float = param(0.6, "lower per-feature quantile of the ID training features (the official q1)", ge=0, le=1)
        high: float = param(0.9, "upper per-feature quantile (the official q2)", ge=0, le=1)
        below: Literal["zero", "clip"] = param("zero", "a feature below its lower quantile becomes 0 (the official "
                                               "code) or that quantile (pytorch-ood, OpenOOD)")
        thresholds: Literal["per_feature", "global"] = param(
            "per_feature", "quantiles of each feature (the official code, pytorch-ood) or one pair over every "
            "activation pooled (OpenOOD, vra_postprocessor.py:41-44)")
        fit_split: Literal["id_train", "id_val"] = param(
            "id_train", "the ID rows the quantiles come from: training (the official ood_eval.py:152) or validation "
            "(OpenOOD, vra_postprocessor.py:26-36)")

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.low > self.high:
                raise ParamError("low", f"({self.low}) must not exceed high ({self.high})")

    fit_inputs = frozenset({"head", "id_val"})
    # OpenOOD's vra.yml sweep (percent there, fractions here); the official code runs fixed quantiles per data set
    search_space = {"low": [0.01, 0.05, 0.10, 0.15], "high": [0.85, 0.90, 0.95, 0.99]}
    grids = {"exact": {}}
    protocol_defaults = {"openood_v1.5": {"low": 0.10, "high": 0.90, "below": "clip", "thresholds": "global",
                                          "fit_split": "id_val"}, "exact": {}}
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        if self.params["fit_split"] == "id_val" and id_val is None:
            raise ValueError(f"{self.name}: fit_split='id_val' (OpenOOD's) needs fit(..., id_val=FeatureSet); "
                             "fit_split='id_train' fits on the training rows")
        rows = id_val if self.params["fit_split"] == "id_val" else id_train
        if self.params["thresholds"] == "global":
            h = stored_features(rows, self.name)
            if h.size == 0:
                raise ValueError(f"{self.name}: no {self.params['fit_split']} features to take percentiles of")
            dtype = model_precision(h[:0]).dtype
            self.lower, self.upper = (np.array([streaming.percentile(h, 100 * q, dtype=dtype)])
                                      for q in (self.params["low"], self.params["high"]))
            return
        h = raw_features(rows, self.name)
        if len(h) == 0:
            raise ValueError(f"{self.name}: no {self.params['fit_split']} features to take quantiles of")
        self.lower, self.upper = column_quantiles(h, (self.params["low"], self.params["high"]))

    def _score(self, batch) -> np.ndarray:
        def rows(_, h: np.ndarray) -> np.ndarray:
            h = h.astype(np.float32, copy=False)
            return logsumexp(self.head(rectify(h, self.lower, self.upper, self.params["below"])))

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "lower": self.lower, "upper": self.upper}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.lower, self.upper = state["lower"], state["upper"]


def column_quantiles(h: np.ndarray, qs: tuple[float, ...]) -> list[np.ndarray]:
    """np.quantile(h, q, axis=0) (linear) for each q from one partial sort of the columns: the two order statistics
    around each q's rank interpolated in h's precision, as numpy (and torch.quantile) do."""
    n = len(h)
    ranks = [(n - 1) * float(q) for q in qs]
    below = [int(np.floor(r)) for r in ranks]
    kth = sorted({k for b in below for k in (b, min(b + 1, n - 1))})
    part = np.ascontiguousarray(h.T)  # one row per feature: each partitioned in place, contiguous
    part.partition(kth, axis=1)
    out = []
    for r, b in zip(ranks, below):
        a, c = part[:, b], part[:, min(b + 1, n - 1)]
        t, diff = r - b, c - a  # t a Python float: numpy's weak scalar, applied in h's precision
        out.append(c - diff * (1 - t) if t >= 0.5 else a + diff * t)
    return out
