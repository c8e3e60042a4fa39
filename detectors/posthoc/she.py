"""SHE: Simplified Hopfield Energy, inner product with the predicted class's stored pattern (Zhang et al., ICLR
2023)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import scipy.sparse

from detectors.base import Detector, FeatureSet, as_numpy
from detectors.posthoc import streaming
from detectors.posthoc.common import labels_of, logits_of, stored_features
from detectors.registry import register_detector


def class_patterns(features: np.ndarray, logits: np.ndarray, labels: np.ndarray) -> np.ndarray:
    """[C, D] mean feature of the correctly classified samples of each class, from streamed class sums.

    A class without a correct sample falls back to the mean of all its samples (with a warning); a class absent from
    the data raises.
    """
    num_classes = logits.shape[1]
    labels = np.asarray(labels).astype(np.int64).reshape(-1)
    sums = np.zeros((2, num_classes, features.shape[1]))  # [correct only, all]
    counts = np.zeros((2, num_classes), np.int64)
    for rows, block in streaming.chunks(features, np.float64):
        label = labels[rows]
        correct = np.array(logits[rows]).argmax(axis=1) == label
        streaming.release(logits[rows])  # a memory-mapped logits file leaves the resident set chunk by chunk too
        for which, keep in enumerate((correct, np.ones(len(label), bool))):
            one_hot = scipy.sparse.csr_matrix((np.ones(int(keep.sum())), (label[keep], np.flatnonzero(keep))),
                                              shape=(num_classes, len(label)))
            sums[which] += one_hot @ block
            counts[which] += np.bincount(label[keep], minlength=num_classes)
    sums, counts = streaming.reduce_sum(sums, counts)
    absent = np.flatnonzero(counts[1] == 0)
    if len(absent):
        raise ValueError(f"she: class {int(absent[0])} has no training sample; stored patterns need every class")
    fallback = np.flatnonzero(counts[0] == 0).tolist()
    use = np.where(counts[0] > 0, 0, 1)
    patterns = sums[use, np.arange(num_classes)] / counts[use, np.arange(num_classes)][:, None]
    if fallback:
        warnings.warn(f"she: classes {fallback} have no correctly classified sample; using all their samples",
                      stacklevel=3)
    return patterns


@register_detector("she")
class SHE(Detector):
    """s(x) = <h, m_yhat>, m_k = mean penultimate feature of the correctly classified training samples of class k."""

    label = "SHE"
    reference_code = "OpenOOD openood/postprocessors/she_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features", "logits"})
    paper = ("Zhang et al., Out-of-Distribution Detection based on In-Distribution Data Patterns Memorization with "
             "Modern Hopfield Energy, ICLR 2023")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.patterns: np.ndarray | None = None

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if not isinstance(id_train, FeatureSet):
            raise TypeError("she: fit needs a FeatureSet with features, logits and labels, got "
                            f"{type(id_train).__name__}")
        id_train.require("logits", who=self.name)
        self.patterns = class_patterns(stored_features(id_train, self.name), as_numpy(id_train.logits),
                                       labels_of(id_train, self.name))

    def _score(self, batch: Any) -> np.ndarray:
        if self.patterns is None:
            raise RuntimeError("she: call fit(id_train) before score()")
        if not isinstance(batch, FeatureSet):
            raise TypeError(f"she: score needs a FeatureSet with features and logits, got {type(batch).__name__}")
        pred = logits_of(batch, self.name).argmax(axis=1)
        return streaming.map_rows(lambda rows, h: np.einsum("nd,nd->n", h, self.patterns[pred[rows]]),
                                  stored_features(batch, self.name), np.float64)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.patterns is not None:
            out["patterns"] = self.patterns
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "patterns" in state:
            self.patterns = state["patterns"]
