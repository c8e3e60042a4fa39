"""Toy feature-level data: Gaussian class clusters, their logits under a linear head, and outliers between them."""
from __future__ import annotations

import numpy as np

from detectors.base import FeatureSet, LinearHead


def toy_head(d: int = 8, c: int = 3, scale: float = 4.0) -> LinearHead:
    """A head whose class k reads feature k (logits = scale * h[:c])."""
    return LinearHead(scale * np.eye(c, d), np.zeros(c))


def toy_features(n: int = 60, d: int = 8, c: int = 3, seed: int = 0, ood: bool = False,
                 head: LinearHead | None = None) -> FeatureSet:
    """`n` non-negative features (ReLU-like) around class centres 3 * e_k (k < c), labels k; `ood=True` draws them
    around the centre of the unused directions instead, with label -1. Logits come from `head` (default `toy_head`)."""
    rng = np.random.default_rng(seed)
    head = head or toy_head(d, c)
    if ood:
        labels = np.full(n, -1)
        centres = np.zeros((n, d))
        centres[:, c:] = 3.0
    else:
        labels = np.arange(n) % c
        centres = 3.0 * np.eye(d)[labels]
    features = np.abs(centres + rng.normal(scale=0.7, size=(n, d))).astype(np.float32)
    return FeatureSet(features, head(features).astype(np.float32), labels)
