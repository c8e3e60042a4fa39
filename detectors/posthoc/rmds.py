"""Relative Mahalanobis distance (RMDS): MDS minus the distance under one class-agnostic Gaussian (Ren et al., 2021)."""
from __future__ import annotations

import numpy as np

from detectors.posthoc import streaming
from detectors.posthoc.common import stored_features
from detectors.posthoc.mds import Mahalanobis, min_squared_mahalanobis, spd_inverse
from detectors.registry import register_detector


@register_detector("rmds")
class RelativeMahalanobis(Mahalanobis):
    """s(h) = max_c [-(h - mu_c)^T S^+ (h - mu_c) + (h - mu_0)^T S_0^+ (h - mu_0)], mu_0/S_0 of all train features."""

    label = "RMDS"
    aliases = {"RMD": "pytorch-ood's"}
    reference_code = "OpenOOD openood/postprocessors/rmds_postprocessor.py"
    paper = "Ren et al., A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection, arXiv 2106.09022, 2021"

    def _fit_scatter(self, scatter: streaming.ClassScatter) -> None:
        """MDS's class Gaussians and, from the same passes, the class-agnostic mean and `pinvh` precision (OpenOOD:
        EmpiricalCovariance(assume_centered=False) on all train features)."""
        super()._fit_scatter(scatter)
        self.background_mean = scatter.stats.mean()
        self.background_precision = spd_inverse(scatter.pooled() / scatter.stats.n)

    def _score(self, batch) -> np.ndarray:
        h = stored_features(batch, self.name)
        background = min_squared_mahalanobis(h, self.background_mean[None], self.background_precision, desc=self.name)
        return background + super()._score(h)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "background_mean": self.background_mean,
                "background_precision": self.background_precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.background_mean, self.background_precision = state["background_mean"], state["background_precision"]
