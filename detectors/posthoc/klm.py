"""KL-Matching: distance of the softmax to the nearest class template (Hendrycks et al., ICML 2022)."""
from __future__ import annotations

import warnings
from typing import Any

import numpy as np

from detectors.base import Detector
from detectors.posthoc.common import log_softmax, logits_of
from detectors.registry import register_detector

_TINY = np.finfo(np.float64).tiny


def class_templates(logits: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(classes, templates): mean softmax of the samples predicted as each class that is predicted at least once."""
    probs = np.exp(log_softmax(logits))
    pred = probs.argmax(axis=1)
    classes = np.unique(pred)
    sums = np.zeros((logits.shape[1], logits.shape[1]))
    np.add.at(sums, pred, probs)
    counts = np.bincount(pred, minlength=logits.shape[1])
    return classes, sums[classes] / counts[classes, None]


def kl_to_templates(logits: np.ndarray, templates: np.ndarray) -> np.ndarray:
    """KL(softmax(z_n) || d_k) for every sample n and template k, [N, K] (terms with p = 0 count 0)."""
    log_p = log_softmax(logits)
    p = np.exp(log_p)
    neg_entropy = np.sum(np.where(p > 0, p * log_p, 0.0), axis=1)
    return neg_entropy[:, None] - p @ np.log(np.maximum(templates, _TINY)).T


@register_detector("klm")
class KLMatching(Detector):
    """s(x) = -min_k KL(softmax(z) || d_k), d_k = mean softmax of ID-val (else ID-train) samples predicted as k."""

    label = "KL-Matching"
    aliases = {"KLMatching": "pytorch-ood's"}
    reference_code = "OpenOOD openood/postprocessors/kl_matching_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Hendrycks et al., Scaling Out-of-Distribution Detection for Real-World Settings, ICML 2022"
    fit_inputs = frozenset({"id_val"})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.template_classes: np.ndarray | None = None
        self.templates: np.ndarray | None = None

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        data = id_val if id_val is not None else id_train
        logits = logits_of(data, self.name)
        self.template_classes, self.templates = class_templates(logits)
        missing = logits.shape[1] - len(self.template_classes)
        if missing:
            warnings.warn(f"klm: {missing} of {logits.shape[1]} classes are never predicted on the fitting data; "
                          "they get no template", stacklevel=3)

    def _score(self, batch: Any) -> np.ndarray:
        if self.templates is None:
            raise RuntimeError("klm: call fit() before score()")
        return -kl_to_templates(logits_of(batch, self.name), self.templates).min(axis=1)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.templates is not None:
            out.update({"template_classes": self.template_classes, "templates": self.templates})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "templates" in state:
            self.template_classes, self.templates = state["template_classes"], state["templates"]
