"""LTS, logit scaling (Djurisic et al., 2024): the logits times (sum(relu h) / sum of its top k)^2, then energy.

The official code (andrijazz/lts at 9509d96): `lts.py:61-72` takes relu(h) of the pooled features, k = D -
round(D * percentile / 100), the squared ratio of the sum of all to the sum of the k largest; the models multiply
their logits by it (`models/resnet_imagenet.py:243-250`, the head on the unscaled h) and `ood_eval.py:75, 118` scores
energy (`scoring_method: "energy"`, `method: "lts@95"` in every `config/*_config.yml:13, 15`). No sweep is run there.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector
from detectors.posthoc import threads
from detectors.posthoc.common import logsumexp_rows, stored_features
from detectors.posthoc.scale import SCORE_ROWS, scale_ratio
from detectors.registry import register_detector
from pipelines.params import Params, param


def lts_factor(features: np.ndarray, percentile: float) -> np.ndarray:
    """(sum(relu h) / sum of the k largest relu h)^2 per row, float64 (1 for an all-non-positive row, where the
    official code divides 0 by 0)."""
    return scale_ratio(np.asarray(features), percentile, relu=True) ** 2


@register_detector("lts")
class LTS(Detector):
    """s = logsumexp(S(h) (W h + b)), S(h) = (sum(relu h) / top-k sum of relu h)^2: the logits scaled per sample."""

    label = "LTS"
    reference_code = "andrijazz/lts lts.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Djurisic et al., Logit Scaling for Out-of-Distribution Detection, arXiv 2409.01175, 2024"

    @dataclass(frozen=True)
    class Params(Params):
        percentile: float = param(95, "the ratio's denominator sums relu(h) above its per-sample p-th percentile "
                                  "(lts@95 in the official configs)", ge=0, lt=100)

    fit_inputs = frozenset({"head"})
    needs_head = True

    def _score(self, batch) -> np.ndarray:
        def rows(h: np.ndarray) -> np.ndarray:
            logits = self.head(h)
            logits *= lts_factor(h, self.params["percentile"])[:, None].astype(np.float32)
            return logsumexp_rows(logits)

        return threads.map_rows(rows, stored_features(batch, self.name), np.float32, SCORE_ROWS)
