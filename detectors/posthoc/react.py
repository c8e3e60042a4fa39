"""ReAct (Sun et al., NeurIPS 2021): clip penultimate activations at a percentile of ID activations, then energy."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import logsumexp, model_precision, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


@register_detector("react")
class ReAct(Detector):
    """s = logsumexp(W min(h, c) + b), c = the `percentile`-th percentile of all ID activations (id_val, else id_train).

    OpenOOD v1.5 takes the percentile on the ID validation activations. It is computed exactly (equal to
    np.percentile) in two streamed passes (`streaming.percentile`), so memory-mapped activations never load whole.
    """

    label = "ReAct"
    reference_code = "OpenOOD openood/postprocessors/react_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Sun et al., ReAct: Out-of-distribution Detection With Rectified Activations, NeurIPS 2021"

    @dataclass(frozen=True)
    class Params(Params):
        percentile: float = param(90, "activations are clipped at their p-th percentile on ID data (100: plain energy)",
                                  gt=0, le=100)

    fit_inputs = frozenset({"head", "id_val"})
    search_space = {"percentile": [85, 90, 95, 99]}  # OpenOOD v1.5
    grids = {"open-insects": {"percentile": [10, 65, 85, 90, 95, 99]}}  # Open-Insect react.yml:4-7
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        source = id_train if id_val is None else id_val
        h = stored_features(source, self.name)
        self.threshold = streaming.percentile(h, self.params["percentile"], dtype=model_precision(h[:0]).dtype)

    def _score(self, batch) -> np.ndarray:
        def rows(_, h: np.ndarray) -> np.ndarray:
            return logsumexp(self.head(np.minimum(h.astype(np.float32, copy=False), np.float32(self.threshold))))

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "threshold": np.array([self.threshold])}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.threshold = float(state["threshold"][0])
