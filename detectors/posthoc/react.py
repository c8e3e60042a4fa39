"""ReAct (Sun et al., NeurIPS 2021): clip penultimate activations at a percentile of ID activations, then energy."""
from __future__ import annotations

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import logsumexp
from detectors.posthoc.common import float32_features, raw_features
from detectors.registry import register_detector


@register_detector("react")
class ReAct(Detector):
    """s = logsumexp(W min(h, c) + b), c = the `percentile`-th percentile of all ID activations (id_val, else id_train)."""

    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Sun et al., ReAct: Out-of-distribution Detection With Rectified Activations, NeurIPS 2021"
    defaults = {"percentile": 90}
    search_space = {"percentile": [85, 90, 95, 99]}
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        source = id_train if id_val is None else id_val
        self.threshold = float(np.percentile(raw_features(source, self.name), self.percentile))

    def _score(self, batch) -> np.ndarray:
        h = np.minimum(float32_features(batch, self.name), np.float32(self.threshold))
        return logsumexp(self.head(h))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "threshold": np.array([self.threshold])}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.threshold = float(state["threshold"][0])
