"""DICE (Sun & Li, ECCV 2022): sparsify the head by keeping the weights with the largest contribution, then energy."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import feature_mean, logsumexp, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


@register_detector("dice")
class DICE(Detector):
    """s = logsumexp((W * M) h + b), M = [mean_train(h)_j * W_cj > its `percentile`-th percentile over all (c, j)].

    The mean activation is over ID train (OpenOOD v1.5), streamed in chunks; the percentile is over the C x D
    contribution matrix, which is small.
    """

    label = "DICE"
    reference_code = "OpenOOD openood/postprocessors/dice_postprocessor.py"
    family = "posthoc"
    fits_from_shards = True  # its statistics are sums: each process may fit its shard (streaming.across_processes)
    inputs = frozenset({"features"})
    paper = "Sun & Li, DICE: Leveraging Sparsification for Out-of-Distribution Detection, ECCV 2022"

    @dataclass(frozen=True)
    class Params(Params):
        percentile: float = param(90, "sparsity p: weight contributions below their p-th percentile are zeroed", ge=0,
                                  lt=100)

    fit_inputs = frozenset({"head"})
    needs_head = True
    # no search_space: OpenOOD v1.5 fixes p at 90 (configs/postprocessors/dice.yml: APS_mode False, p_list [90])

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        mean_activation = feature_mean(id_train, self.name)
        contribution = mean_activation[None, :] * self.head.weight
        keep = contribution > np.percentile(contribution, self.params["percentile"])
        self.masked_weight = np.ascontiguousarray((self.head.weight * keep).astype(np.float32))

    def _score(self, batch) -> np.ndarray:
        bias = self.head.bias.astype(np.float32)

        def rows(_, h: np.ndarray) -> np.ndarray:
            return logsumexp(h.astype(np.float32, copy=False) @ self.masked_weight.T + bias)

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "masked_weight": self.masked_weight}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.masked_weight = state["masked_weight"]
