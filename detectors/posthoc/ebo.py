"""Energy score (EBO): T * logsumexp(z / T) (Liu et al., NeurIPS 2020)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import logits_of, logsumexp
from detectors.registry import register_detector
from pipelines.params import Params, param


def energy_score(logits: np.ndarray, temperature: float = 1.0) -> np.ndarray:
    """Negative free energy T * logsumexp(z / T) in float64 (higher = more ID)."""
    t = float(temperature)
    return t * logsumexp(np.asarray(logits, dtype=np.float64) / t, axis=1)


@register_detector("ebo")
class Energy(Detector):
    """s(x) = T * logsumexp(z / T)."""

    label = "EBO"
    aliases = {"EnergyBased": "pytorch-ood's", "energy": "the paper's"}
    reference_code = "OpenOOD openood/postprocessors/ebo_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Liu et al., Energy-based Out-of-distribution Detection, NeurIPS 2020"

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1.0, "energy temperature T: s = T logsumexp(z / T)", gt=0)

    search_space: dict[str, list[Any]] = {"temperature": [1]}  # OpenOOD v1.5 configs/postprocessors/ebo.yml

    def _score(self, batch: Any) -> np.ndarray:
        return energy_score(logits_of(batch, self.name), self.params["temperature"])
