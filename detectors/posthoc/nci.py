"""NCI (Liu & Qin, CVPR 2025): neural-collapse inspired score, alignment of (h - mu_train) with the predicted class
weight."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import feature_mean, model_precision, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


@register_detector("nci")
class NCI(Detector):
    """s = w_y . (h - mu_train) / ||h - mu_train|| + alpha ||h||_1, y = argmax z (OpenOOD's nci postprocessor)."""

    label = "NCI"
    reference_code = "OpenOOD openood/postprocessors/nci_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Liu & Qin, Detecting Out-of-Distribution through the Lens of Neural Collapse, CVPR 2025"

    @dataclass(frozen=True)
    class Params(Params):
        alpha: float = param(1e-4, "weight of the L1 norm term", ge=0)

    fit_inputs = frozenset({"head"})
    search_space = {"alpha": [1e-4, 1e-3, 1e-2, 1e-1]}  # OpenOOD v1.5
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        self.train_mean = feature_mean(id_train, self.name)

    def _score(self, batch) -> np.ndarray:
        def rows(_, h: np.ndarray) -> np.ndarray:
            h = model_precision(h)
            predicted = self.head(np.asarray(h, dtype=np.float32)).argmax(axis=1)
            t = np.subtract(h, self.train_mean, dtype=np.float64)
            alignment = (np.einsum("nd,nd->n", self.head.weight[predicted], t)
                         / np.maximum(np.linalg.norm(t, axis=1), 1e-12))
            return alignment + self.params["alpha"] * np.abs(h).sum(axis=1, dtype=np.float64)

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "train_mean": self.train_mean}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.train_mean = state["train_mean"]
