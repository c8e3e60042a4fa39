"""GEN: generalized entropy of the top-M softmax probabilities (Liu et al., CVPR 2023)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import logits_of, softmax
from detectors.registry import register_detector
from pipelines.params import Params, param


def generalized_entropy_score(logits: np.ndarray, gamma: float = 0.1, top_m: int = 100) -> np.ndarray:
    """-sum over the M largest probabilities p of p^gamma (1-p)^gamma (all classes when M >= C)."""
    probs = softmax(logits)
    num_classes = probs.shape[1]
    if int(top_m) < num_classes:  # the sum ignores order: a partition finds the top M without a full sort
        probs = np.partition(probs, num_classes - int(top_m), axis=1)[:, num_classes - int(top_m):]
    return -np.sum(probs**gamma * (1.0 - probs) ** gamma, axis=1)


@register_detector("gen")
class GEN(Detector):
    """s(x) = -G_gamma(top-M of softmax(z)), G_gamma(p) = sum_j p_j^gamma (1 - p_j)^gamma."""

    label = "GEN"
    reference_code = "OpenOOD openood/postprocessors/gen_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Liu et al., GEN: Pushing the Limits of Softmax-Based OOD Detection, CVPR 2023"

    @dataclass(frozen=True)
    class Params(Params):
        gamma: float = param(0.1, "exponent of the generalised entropy", gt=0)
        M: int = param(100, "number of top softmax probabilities summed", ge=1)

    search_space: dict[str, list[Any]] = {"gamma": [0.01, 0.1, 0.5, 1, 2, 5, 10], "M": [10, 50, 100, 200, 500, 1000]}

    def _score(self, batch: Any) -> np.ndarray:
        return generalized_entropy_score(logits_of(batch, self.name), float(self.params["gamma"]),
                                         int(self.params["M"]))
