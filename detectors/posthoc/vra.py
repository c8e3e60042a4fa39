"""VRA (Xu et al., NeurIPS 2023) as OpenOOD runs it: the penultimate activations clipped to [low, high], two
percentiles of the ID activations, then energy.

OpenOOD (`openood/postprocessors/vra_postprocessor.py`) pools every ID *validation* activation (`:26-36`, the loader
`'val'`), takes its `percentile_high` and `percentile_low` percentiles (`:41-44`, `np.percentile`, linear), clips
the features to them (`:49-50`), and scores logsumexp of the fc on the clipped features (`:52-55`), with 90 and 10 and
the sweep high 85, 90, 95, 99 x low 1, 5, 10, 15 under APS (`configs/postprocessors/vra.yml:3, 5-9`): OpenOOD's port
is this two-sided clip, and it is what runs here. As ReAct here, the fit reads `id_val` when given, else the training
rows, and the percentiles are exact in two streamed passes.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import logsumexp, model_precision, stored_features
from detectors.registry import register_detector
from pipelines.params import ParamError, Params, param


@register_detector("vra")
class VRA(Detector):
    """s = logsumexp(W clip(h, low, high) + b), low and high the `percentile_low` / `percentile_high` percentiles of all
    ID activations (id_val, else id_train)."""

    label = "VRA"
    reference_code = "OpenOOD openood/postprocessors/vra_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its percentiles are histogram sums: each process may fit its shard
    inputs = frozenset({"features"})
    paper = "Xu et al., VRA: Variational Rectified Activation for Out-of-distribution Detection, NeurIPS 2023"

    @dataclass(frozen=True)
    class Params(Params):
        percentile_high: float = param(90, "activations above their p-th ID percentile are clipped to it (vra.yml:5)",
                                       ge=0, le=100)
        percentile_low: float = param(10, "activations below their p-th ID percentile are raised to it (vra.yml:6)",
                                      ge=0, le=100)

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.percentile_low > self.percentile_high:
                raise ParamError("percentile_low", f"must not exceed percentile_high={self.percentile_high}, got "
                                 f"{self.percentile_low}")

    fit_inputs = frozenset({"head", "id_val"})
    search_space = {"percentile_high": [85, 90, 95, 99], "percentile_low": [1, 5, 10, 15]}  # vra.yml:8-9
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train if id_val is None else id_val, self.name)
        dtype = model_precision(h[:0]).dtype
        self.low = streaming.percentile(h, self.percentile_low, dtype=dtype)
        self.high = streaming.percentile(h, self.percentile_high, dtype=dtype)

    def _score(self, batch) -> np.ndarray:
        low, high = np.float32(self.low), np.float32(self.high)

        def rows(_, h: np.ndarray) -> np.ndarray:
            return logsumexp(self.head(np.clip(h.astype(np.float32, copy=False), low, high)))

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "low": np.array([self.low]), "high": np.array([self.high])}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.low, self.high = float(state["low"][0]), float(state["high"][0])
