"""Relative Mahalanobis distance (RMDS): MDS minus the distance under one class-agnostic Gaussian (Ren et al., 2021)."""
from __future__ import annotations

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of
from detectors.posthoc.common import feature_mean, raw_features
from detectors.posthoc.mahalanobis import class_centred, class_means, min_squared_mahalanobis, tied_precision
from detectors.registry import register_detector


@register_detector("rmds")
class RelativeMahalanobis(Detector):
    """s(h) = max_c [-(h - mu_c)^T S^+ (h - mu_c) + (h - mu_0)^T S_0^+ (h - mu_0)], mu_0/S_0 of all train features."""

    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Ren et al., A Simple Fix to Mahalanobis Distance for Improving Near-OOD Detection, arXiv 2106.09022, 2021"
    defaults = {}
    search_space = {}

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = raw_features(id_train, self.name)
        self.classes, self.means, position = class_means(h, labels_of(id_train, self.name))
        self.precision = tied_precision(class_centred(h, self.means, position))
        self.background_mean = feature_mean(h, self.name)
        self.background_precision = tied_precision(class_centred(h, self.background_mean[None], np.zeros(len(h), dtype=np.int64)))

    def _score(self, batch) -> np.ndarray:
        h = raw_features(batch, self.name)
        class_term = min_squared_mahalanobis(h, self.means, self.precision, desc=self.name)
        background = min_squared_mahalanobis(h, self.background_mean[None], self.background_precision, desc=self.name)
        return background - class_term

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "classes": self.classes, "means": self.means, "precision": self.precision,
                "background_mean": self.background_mean, "background_precision": self.background_precision}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.classes, self.means, self.precision = state["classes"], state["means"], state["precision"]
        self.background_mean, self.background_precision = state["background_mean"], state["background_precision"]
