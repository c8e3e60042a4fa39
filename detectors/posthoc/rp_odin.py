"""RP-ODIN: ODIN re-weighted by the ID class prior (Jiang et al., ICML 2023), as Open-Insects runs it
(src/openood/postprocessors/rp_odin_postprocessor.py).

s(x) = (1 - cos(softmax(f(x)), prior)) * max_k softmax(f(x') / T)_k: the cosine is taken on the unperturbed logits at
temperature 1, x' is ODIN's perturbed input (odin.py: same step, temperature 1000, noise 0.0014 and sweep). The prior is
the class frequency of the ID training labels. The reference code reads the unperturbed softmax from the forward pass
that feeds the gradient; here a separate no-grad forward gives the same logits.
"""
from __future__ import annotations

from typing import Any

import numpy as np
import torch

from detectors.base import FeatureSet, as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.odin import ODIN
from detectors.posthoc.pixels import labels_of_images
from detectors.posthoc.rp import PriorState, class_prior
from detectors.registry import register_detector


def prior_weight(logits: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """1 - cos(softmax(logits), prior) per row, float64."""
    probs = softmax(np.asarray(logits, dtype=np.float64))
    return 1.0 - probs @ prior / (np.linalg.norm(probs, axis=1) * np.linalg.norm(prior))


@register_detector("rp_odin")
class RPODIN(PriorState, ODIN):
    """ODIN's perturbed MSP times (1 - cos(softmax, class prior)). Needs the classifier, images and ID train labels."""

    label = "RP-ODIN"
    reference_code = "RolnickLab/Open-Insect src/openood/postprocessors/rp_odin_postprocessor.py"
    paper = "Jiang et al., Detecting Out-of-distribution Data through In-distribution Class Prior, ICML 2023"

    def __init__(self, classifier: Any = None, batch_size: int = 32, device: str | None = None, precision: str = "fp32",
                 **params: Any) -> None:
        super().__init__(classifier=classifier, batch_size=batch_size, device=device, precision=precision, **params)
        self.prior: np.ndarray | None = None

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        labels = labels_of_images(id_train, self.name)
        if self.classifier is not None:
            num_classes = self.classifier.num_classes
        elif isinstance(id_train, FeatureSet) and id_train.logits is not None:
            num_classes = id_train.logits.shape[1]
        else:
            num_classes = int(labels.max()) + 1
        self.prior = class_prior(labels, num_classes)

    def _chunk_scores(self, model: Any, x: torch.Tensor, temperature: float, noise: float) -> np.ndarray:
        prior = self.fitted_prior()
        with torch.no_grad():
            plain = as_numpy(model(x)[0], np.float64)
        return prior_weight(plain, prior) * super()._chunk_scores(model, x, temperature, noise)
