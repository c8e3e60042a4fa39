"""SHE: Simplified Hopfield Energy, inner product with the predicted class's stored pattern (Zhang et al., ICLR 2023)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import features_of, labels_of, logits_of
from detectors.registry import register_detector


def class_patterns(features: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[C, D] mean feature of the correctly classified samples of each class.

    A class without a correct sample falls back to the mean of all its samples (with a warning); a class absent from
    the data raises.
    """
    num_classes = logits.shape[1]
    correct = logits.argmax(axis=1) == labels
    patterns = np.zeros((num_classes, features.shape[1]))
    fallback = []
    for k in range(num_classes):
        members = labels == k
        if not members.any():
            raise ValueError(f"she: class {k} has no training sample; stored patterns need every class")
        chosen = members & correct
        if not chosen.any():
            fallback.append(k)
            chosen = members
        patterns[k] = features[chosen].mean(axis=0)
    if fallback:
        warnings.warn(f"she: classes {fallback} have no correctly classified sample; using all their samples", stacklevel=3)
    return patterns


@register_detector("she")
class SHE(Detector):
    """s(x) = <h, m_yhat>, m_k = mean penultimate feature of the correctly classified training samples of class k."""

    family = "posthoc"
    inputs = frozenset({"features", "logits"})
    paper = "Zhang et al., Out-of-Distribution Detection based on In-Distribution Data Patterns Memorization with Modern Hopfield Energy, ICLR 2023"
    defaults: dict[str, Any] = {}
    search_space: dict[str, list[Any]] = {}

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.patterns: np.ndarray | None = None

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if not isinstance(id_train, FeatureSet):
            raise TypeError(f"she: fit needs a FeatureSet with features, logits and labels, got {type(id_train).__name__}")
        self.patterns = class_patterns(features_of(id_train, self.name), logits_of(id_train, self.name),
                                       labels_of(id_train, self.name))

    def _score(self, batch: Any) -> np.ndarray:
        if self.patterns is None:
            raise RuntimeError("she: call fit(id_train) before score()")
        if not isinstance(batch, FeatureSet):
            raise TypeError(f"she: score needs a FeatureSet with features and logits, got {type(batch).__name__}")
        features = features_of(batch, self.name)
        pred = logits_of(batch, self.name).argmax(axis=1)
        return np.einsum("nd,nd->n", features, self.patterns[pred])

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.patterns is not None:
            out["patterns"] = self.patterns
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "patterns" in state:
            self.patterns = state["patterns"]
