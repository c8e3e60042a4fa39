"""RP-MSP, RP-EBO and RP-GradNorm: scores re-weighted by the ID class prior (Jiang et al., ICML 2023).

RP-GradNorm as Open-Insects runs it (src/openood/postprocessors/rp_gradnorm_postprocessor.py, after the class-prior
authors' funcs.py): ||h||_1 * ||prior - softmax(Wh + b)||_1 / (D * C), the L1 norm of the gradient w.r.t. W of the
cross-entropy to the prior (the code divides by 2048, ResNet-50's D, and C; a constant). RP-ODIN: rp_odin.py.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of, logits_of, raw_features, softmax
from detectors.posthoc.ebo import energy_score
from detectors.registry import register_detector
from pipelines.params import Params, param


def class_prior(labels: np.ndarray, num_classes: int) -> np.ndarray:
    """Empirical class frequencies of the training labels, [C] summing to 1."""
    labels = np.asarray(labels, dtype=np.int64)
    if labels.size == 0 or labels.min() < 0 or labels.max() >= num_classes:
        raise ValueError(f"class prior needs labels in [0, {num_classes}), got {labels.size} label(s)")
    return np.bincount(labels, minlength=num_classes) / labels.size


class PriorState:
    """The class prior `prior` [C] of a fitted detector, saved with its state (mixed in before the Detector base)."""

    prior: np.ndarray | None = None

    def fitted_prior(self) -> np.ndarray:
        """The prior, or a clear error before fit."""
        if self.prior is None:
            raise RuntimeError(f"{self.name}: call fit(id_train) before score() (the prior comes from the training "
                               "labels)")
        return self.prior

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()  # type: ignore[misc]
        if self.prior is not None:
            out["prior"] = self.prior
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)  # type: ignore[misc]
        if "prior" in state:
            self.prior = state["prior"]


class _PriorDetector(PriorState, Detector):
    """Shared fitting and state: the class prior estimated from the ID training labels."""

    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Jiang et al., Detecting Out-of-distribution Data through In-distribution Class Prior, ICML 2023"
    fit_inputs = frozenset({"head"})

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.prior: np.ndarray | None = None

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if not isinstance(id_train, FeatureSet):
            raise TypeError(f"{self.name}: fit needs a FeatureSet with labels, got {type(id_train).__name__}")
        if id_train.logits is not None:
            num_classes = id_train.logits.shape[1]
        elif self.head is not None:
            num_classes = self.head.weight.shape[0]
        else:
            num_classes = int(labels_of(id_train, self.name).max()) + 1
        self.prior = class_prior(labels_of(id_train, self.name), num_classes)

    def _probs_and_prior(self, batch: Any) -> tuple[np.ndarray, np.ndarray]:
        prior = self.fitted_prior()
        logits = logits_of(batch, self.name)
        if logits.shape[1] != len(prior):
            raise ValueError(f"{self.name}: logits have {logits.shape[1]} classes, the prior {len(prior)}")
        return logits, softmax(logits)


@register_detector("rp_msp")
class RPMSP(_PriorDetector):
    """s(x) = max_k (softmax(z)_k - prior_k)."""

    label = "RP-MSP"
    reference_code = "the paper's formulas (not in OpenOOD)"

    def _score(self, batch: Any) -> np.ndarray:
        _, probs = self._probs_and_prior(batch)
        return (probs - self.prior[None, :]).max(axis=1)


@register_detector("rp_ebo")
class RPEBO(_PriorDetector):
    """s(x) = T logsumexp(z / T) * (1 - cos(softmax(z), prior))."""

    label = "RP-EBO"
    reference_code = "the paper's formulas (not in OpenOOD)"
    grids = {"openood_v1.5": {"temperature": [1]}}  # Open-Insect rp_ebo.yml:4-7

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1.0, "energy temperature T", gt=0)

    def _score(self, batch: Any) -> np.ndarray:
        logits, probs = self._probs_and_prior(batch)
        cosine = probs @ self.prior / (np.linalg.norm(probs, axis=1) * np.linalg.norm(self.prior))
        return energy_score(logits, self.params["temperature"]) * (1.0 - cosine)


def rp_gradnorm_score(features: np.ndarray, weight: np.ndarray, bias: np.ndarray, prior: np.ndarray) -> np.ndarray:
    """||h||_1 * ||prior - softmax(Wh + b)||_1 / (D * C); the projection in the features' precision, the rest
    float64."""
    h = np.asarray(features)
    probs = softmax(h @ weight.T.astype(h.dtype, copy=False) + bias.astype(h.dtype, copy=False))
    return np.abs(h).sum(axis=1, dtype=np.float64) * np.abs(prior[None, :] - probs).sum(axis=1) / weight.size


@register_detector("rp_gradnorm")
class RPGradNorm(_PriorDetector):
    """GradNorm with the class prior in place of the uniform target, on penultimate features and the linear head."""

    label = "RP-GradNorm"
    reference_code = "RolnickLab/Open-Insect src/openood/postprocessors/rp_gradnorm_postprocessor.py"
    inputs = frozenset({"features"})
    needs_head = True

    def _score(self, batch: Any) -> np.ndarray:
        if self.prior is None or self.head is None:
            raise RuntimeError("rp_gradnorm: call fit(id_train, head=LinearHead(W, b)) before score()")
        return rp_gradnorm_score(raw_features(batch, self.name), self.head.weight, self.head.bias, self.prior)
