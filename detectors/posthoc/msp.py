"""MSP: maximum softmax probability (Hendrycks & Gimpel, ICLR 2017)."""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import logits_of, softmax
from detectors.registry import register_detector


@register_detector("msp")
class MSP(Detector):
    """s(x) = max_k softmax(z)_k."""

    label = "MSP"
    aliases = {"MaxSoftmax": "pytorch-ood's"}
    reference_code = "OpenOOD openood/postprocessors/base_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Hendrycks & Gimpel, A Baseline for Detecting Misclassified and OOD Examples, ICLR 2017"

    def _score(self, batch: Any) -> np.ndarray:
        return softmax(logits_of(batch, self.name)).max(axis=1)
