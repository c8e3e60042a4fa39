"""MaxLogit (MLS): the largest logit (Hendrycks et al., ICML 2022)."""
from __future__ import annotations

from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import logits_of
from detectors.registry import register_detector


@register_detector("mls")
class MaxLogit(Detector):
    """s(x) = max_k z_k."""

    label = "MLS"
    aliases = {"MaxLogit": "pytorch-ood's"}
    reference_code = "OpenOOD openood/postprocessors/maxlogit_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings, ICML 2022"

    def _score(self, batch: Any) -> np.ndarray:
        return logits_of(batch, self.name).max(axis=1)
