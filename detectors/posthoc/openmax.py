"""OpenMax: Weibull-recalibrated logits with an explicit "unknown" class (Bendale & Boult, CVPR 2016).

Per class k: the mean activation vector (MAV) of the correctly classified training logits, and a Weibull model of the
largest `tailsize` distances of those logits to the MAV, fitted as libMR's `FitHigh` does (the tail is shifted by
libMR's default `translate_amount` 1 minus its smallest value, then a two-parameter maximum-likelihood Weibull fit). At
test time the `alpha` top classes have their logits reduced by v_k * w_k * (alpha + 1 - rank) / alpha, w_k the Weibull
CDF of the sample's distance to MAV_k; the removed mass is the unknown class's logit, and a softmax over the C + 1
entries gives the OpenMax probabilities.

Defaults follow OpenOOD v1.5 (Jingkang50/OpenOOD, openood/postprocessors/openmax_postprocessor.py): euclidean distance
to the MAV, tail 20, alpha 3, score -P(unknown). The original code's eucos distance (euclidean / 200 + cosine) and the
other scores are options.
"""
from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from scipy.optimize import brentq

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import labels_of, logits_of, logsumexp
from detectors.registry import register_detector
from pipelines.params import Params, param

LIBMR_TRANSLATE = 1.0  # libMR's default translate_amount (libmr.MR().translate_amount), which OpenOOD keeps
DISTANCES = ("eucos", "euclidean", "cosine")
ROW_BLOCK = 4096


def mav_distances(logits: np.ndarray, mavs: np.ndarray, distance: str = "eucos",
                  eu_weight: float = 1 / 200) -> np.ndarray:
    """[N, K] distances of each row of `logits` to each MAV: euclidean * eu_weight + cosine distance ("eucos"),
    euclidean, or cosine distance (1 - cos)."""
    if distance not in DISTANCES:
        raise ValueError(f"openmax: distance must be one of {DISTANCES}, got {distance!r}")
    x = np.asarray(logits, dtype=np.float64)
    m = np.asarray(mavs, dtype=np.float64)
    sq = np.sum(x**2, axis=1)[:, None] + np.sum(m**2, axis=1)[None, :] - 2.0 * x @ m.T
    euclid = np.sqrt(np.maximum(sq, 0.0))
    if distance == "euclidean":
        return euclid
    norms = np.maximum(np.linalg.norm(x, axis=1)[:, None] * np.linalg.norm(m, axis=1)[None, :],
                       np.finfo(np.float64).tiny)
    cosine = 1.0 - (x @ m.T) / norms
    return cosine if distance == "cosine" else euclid * eu_weight + cosine


def weibull_mle(data: np.ndarray) -> tuple[float, float]:
    """Two-parameter (location 0) maximum-likelihood Weibull fit: (shape k, scale lambda).

    Solves sum(x^k ln x) / sum(x^k) - 1/k - mean(ln x) = 0 (increasing in k) on x / max(x), which leaves k unchanged
    and keeps x^k finite for the very large shapes a translated tail produces.
    """
    x = np.asarray(data, dtype=np.float64)
    if x.size < 2 or np.any(x <= 0):
        raise ValueError(f"Weibull fit needs at least 2 positive values, got {x.size} (min "
                         f"{x.min() if x.size else None})")
    top = x.max()
    log_y = np.log(x / top)
    if np.ptp(log_y) == 0:
        raise ValueError("Weibull fit needs at least 2 distinct values; all tail distances are equal")

    def equation(k: float) -> float:
        w = np.exp(k * log_y)
        return float(np.sum(w * log_y) / np.sum(w) - 1.0 / k - np.mean(log_y))

    hi = 1.0
    while equation(hi) < 0:
        hi *= 2.0
    shape = brentq(equation, hi / 2.0 if hi > 1.0 else 1e-8, hi, xtol=1e-14, rtol=1e-14, maxiter=500)
    scale = top * np.mean(np.exp(shape * log_y)) ** (1.0 / shape)
    return float(shape), float(scale)


def fit_weibull_high(distances: np.ndarray, tailsize: int,
                     translate: float = LIBMR_TRANSLATE) -> tuple[float, float, float]:
    """libMR FitHigh: (shape, scale, small_score) of the `tailsize` largest values shifted by translate - small_score.

    A tail without spread once shifted (one or two samples, whose distances to their mean are equal up to rounding)
    gets the MLE's limit, shape = inf: a step CDF that is 1 beyond the tail value and 0 below it. (libMR marks an
    exactly constant tail invalid, w_score -9999, and fits a shape near 1e15 to one that differs in the last bits.)
    """
    tail = np.sort(np.asarray(distances, dtype=np.float64))[-int(tailsize):]
    small = float(tail[0])
    shifted = tail + translate - small
    if np.ptp(np.log(shifted / shifted.max())) == 0:
        return float("inf"), float(shifted.max()), small
    shape, scale = weibull_mle(shifted)
    return shape, scale, small


def weibull_cdf_high(x: np.ndarray, shape: np.ndarray, scale: np.ndarray, small: np.ndarray,
                     translate: float = LIBMR_TRANSLATE) -> np.ndarray:
    """libMR W_score of a FitHigh model: Weibull CDF at x + translate - small_score (0 below the support)."""
    t = np.maximum(np.asarray(x, dtype=np.float64) + translate - small, 0.0)
    with np.errstate(over="ignore"):  # (t / scale) ** shape -> inf far in the tail: CDF 1, as intended
        return -np.expm1(-((t / scale) ** shape))


def openmax_probabilities(logits: np.ndarray, distances: np.ndarray, shape: np.ndarray, scale: np.ndarray,
                          small: np.ndarray, alpha: int) -> np.ndarray:
    """[N, C + 1] OpenMax probabilities (last column: unknown) from logits and their [N, C] MAV distances."""
    v = np.asarray(logits, dtype=np.float64)
    n, c = v.shape
    ranks = min(int(alpha), c)
    candidates = np.argpartition(-v, ranks - 1, axis=1)[:, :ranks]  # the top `ranks` classes, then ordered
    top = np.take_along_axis(candidates, np.argsort(-np.take_along_axis(v, candidates, axis=1), axis=1), axis=1)
    omega = np.zeros_like(v)
    omega[np.arange(n)[:, None], top] = (alpha - np.arange(ranks)) / float(alpha)
    w = weibull_cdf_high(distances, shape[None, :], scale[None, :], small[None, :])
    revised = v * (1.0 - w * omega)
    unknown = np.sum(v - revised, axis=1, keepdims=True)
    extended = np.concatenate([revised, unknown], axis=1)
    return np.exp(extended - logsumexp(extended, axis=1)[:, None])


@register_detector("openmax")
class OpenMax(Detector):
    """OpenMax on logits.

    `score`: "openood" -P(unknown), OpenOOD v1.5's confidence (default); "unknown" 1 - P(unknown) (the same ranking);
    "max_known" max_k P(k); "max_all" the max over all C + 1 OpenMax probabilities (OpenOOD before v1.5, whose ranking
    puts confidently-unknown samples among the most ID). `distance`: "euclidean" (OpenOOD v1.5, default), "eucos"
    (euclidean * eu_weight + cosine; the original code uses eu_weight = 1/200, OpenOOD's helper 0.5) or "cosine".
    """

    label = "OpenMax"
    reference_code = "OpenOOD openood/postprocessors/openmax_postprocessor.py with libMR's FitHigh / W_score"
    family = "posthoc"
    inputs = frozenset({"logits"})
    paper = "Bendale & Boult, Towards Open Set Deep Networks, CVPR 2016"

    @dataclass(frozen=True)
    class Params(Params):
        tailsize: int = param(20, "largest distances per class the Weibull is fitted to", ge=2)
        alpha: int = param(3, "top classes whose activations are revised", ge=1, le="classes")
        distance: Literal["eucos", "euclidean", "cosine"] = param("euclidean",
                                                                  "distance to the mean activation vectors")
        eu_weight: float = param(1 / 200, "weight of the euclidean term in eucos", ge=0)
        score: Literal["openood", "unknown", "max_known", "max_all"] = param("openood", "the confidence returned")

    def __init__(self, **params: Any) -> None:
        super().__init__(**params)
        self.mavs: np.ndarray | None = None
        self.weibull: np.ndarray | None = None  # [C, 3]: shape, scale, small_score

    def _distances(self, logits: np.ndarray, mavs: np.ndarray) -> np.ndarray:
        return mav_distances(logits, mavs, self.params["distance"], float(self.params["eu_weight"]))

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if not isinstance(id_train, FeatureSet):
            raise TypeError(f"openmax: fit needs a FeatureSet with logits and labels, got {type(id_train).__name__}")
        logits, labels = logits_of(id_train, self.name), labels_of(id_train, self.name)
        num_classes = logits.shape[1]
        correct = logits.argmax(axis=1) == labels
        mavs = np.zeros((num_classes, num_classes))
        weibull = np.zeros((num_classes, 3))
        fallback = []
        for k in range(num_classes):
            members = labels == k
            chosen = members & correct
            if not chosen.any():
                fallback.append(k)
                chosen = members
            if not chosen.any():
                raise ValueError(f"openmax: class {k} has no training sample; every class needs a mean activation "
                                 "vector")
            mavs[k] = logits[chosen].mean(axis=0)
            dists = self._distances(logits[chosen], mavs[k : k + 1])[:, 0]
            weibull[k] = fit_weibull_high(dists, int(self.params["tailsize"]))
        if fallback:
            warnings.warn(f"openmax: classes {fallback} have no correctly classified sample; using all their samples",
                          stacklevel=3)
        self.mavs, self.weibull = mavs, weibull

    def probabilities(self, batch: Any) -> np.ndarray:
        """[N, C + 1] OpenMax probabilities, the last column for the unknown class."""
        if self.mavs is None:
            raise RuntimeError("openmax: call fit(id_train) before score()")
        logits = logits_of(batch, self.name)
        shape, scale, small = self.weibull.T
        # bounds [N, C] temporaries
        blocks = [logits[start:start + ROW_BLOCK] for start in range(0, len(logits), ROW_BLOCK)]
        return np.concatenate([openmax_probabilities(block, self._distances(block, self.mavs), shape, scale, small,
                                                     int(self.params["alpha"])) for block in blocks]
                                                     or [np.zeros((0, len(self.mavs) + 1))])

    def _score(self, batch: Any) -> np.ndarray:
        probs = self.probabilities(batch)
        if self.params["score"] == "openood":
            return -probs[:, -1]
        if self.params["score"] == "unknown":
            return 1.0 - probs[:, -1]
        if self.params["score"] == "max_known":
            return probs[:, :-1].max(axis=1)
        return probs.max(axis=1)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.mavs is not None:
            out.update({"mavs": self.mavs, "weibull": self.weibull})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "mavs" in state:
            self.mavs, self.weibull = state["mavs"], state["weibull"]
