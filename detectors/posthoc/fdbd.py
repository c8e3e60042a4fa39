"""fDBD (Liu & Qin, ICML 2024): mean feature-space distance to the decision boundaries, normalised by the feature
scale."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import feature_mean, float32_features
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress

BLOCK_ROWS = 4096


def boundary_denominators(weight: np.ndarray) -> np.ndarray:
    """[C,C] float64 matrix of ||w_p - w_k|| (from the Gram matrix), with 1 on the diagonal."""
    weight = np.asarray(weight, dtype=np.float64)
    gram = weight @ weight.T
    sq = np.diag(gram)
    out = np.sqrt(np.maximum(sq[:, None] + sq[None, :] - 2.0 * gram, 0.0))
    np.fill_diagonal(out, 1.0)
    return out


@register_detector("fdbd")
class FDBD(Detector):
    """s = sum_k |z_y - z_k| / ||w_y - w_k|| / ||h - mu_train||, y = argmax z (`distance_as_normalizer=False`: / ||h||).

    The k = y term is 0. Default and sweep as OpenOOD v1.5 (the normaliser is chosen on validation data there).
    """

    label = "fDBD"
    reference_code = "OpenOOD openood/postprocessors/fdbd_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Liu & Qin, Fast Decision Boundary based Out-of-Distribution Detector, ICML 2024"

    @dataclass(frozen=True)
    class Params(Params):
        distance_as_normalizer: bool = param(True, "divide by ||h - mu_train|| (True) or by ||h|| (False)")

    fit_inputs = frozenset({"head"})
    search_space = {"distance_as_normalizer": [True, False]}  # OpenOOD v1.5
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        self.train_mean = feature_mean(id_train, self.name)
        self.denominators = boundary_denominators(self.head.weight)
        self.inverse_denominators = 1.0 / self.denominators

    def _score(self, batch) -> np.ndarray:
        h = float32_features(batch, self.name)
        out = np.empty(len(h))
        starts = range(0, len(h), BLOCK_ROWS)
        for start in progress(starts, desc=self.name, disable=len(starts) <= 1, leave=False):
            block = h[start:start + BLOCK_ROWS]
            logits = self.head(block).astype(np.float64)
            predicted = logits.argmax(axis=1)
            gaps = np.abs(logits - logits[np.arange(len(block)), predicted][:, None])
            spread = np.einsum("nc,nc->n", gaps, self.inverse_denominators[predicted])
            centre = self.train_mean if self.params["distance_as_normalizer"] else 0.0
            out[start:start + BLOCK_ROWS] = spread / np.maximum(np.linalg.norm(block.astype(np.float64) - centre,
                                                                               axis=1), 1e-12)
        return out

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "train_mean": self.train_mean, "denominators": self.denominators}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.train_mean, self.denominators = state["train_mean"], state["denominators"]
        self.inverse_denominators = 1.0 / self.denominators
