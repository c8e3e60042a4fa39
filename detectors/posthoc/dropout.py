"""MC Dropout (Gal and Ghahramani, ICML 2016): the max softmax of the mean logits of several passes with dropout on the
penultimate features.

OpenOOD (`openood/postprocessors/dropout_postprocessor.py`) runs `dropout_times` = 5 forward passes per batch
(`:16`, `configs/postprocessors/dropout.yml:6`), averages their logits in float32 (`:17-20`) and scores the max
softmax (`:21-22`); its `DropoutNet` (`openood/networks/dropout_net.py:17-20`) drops the penultimate features with
p = 0.5 (`configs/networks/dropout_net.yml:8`; `F.dropout2d` on [B, D], which drops single elements, as `F.dropout`)
before the classifier's fc. APS off, no sweep. OpenOOD trains that network with the same dropout
(`scripts/uncertainty/mc_dropout/*_train_mc_dropout.sh`); here the passes run on any classifier's features and head.
The masks come from torch's generator seeded `seed` (the reference: the global one, unseeded), drawn as the reference
draws them batch by batch: `batch_rows` rows at a time (OpenOOD's evaluator: 200), `times` masks per batch.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from detectors.base import Detector
from detectors.posthoc.common import softmax, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


def mc_dropout_logits(h: np.ndarray, weight: torch.Tensor, bias: torch.Tensor, p: float, times: int) -> np.ndarray:
    """The mean over `times` passes of W dropout_p(h) + b, in float32 as there (the masks from torch's global
    generator: the caller seeds it)."""
    x = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
    total = torch.zeros(len(x), len(bias), dtype=torch.float32)
    for _ in range(times):
        total += torch.nn.functional.linear(torch.nn.functional.dropout(x, p, training=True), weight, bias)
    return (total / times).numpy()


@register_detector("dropout")
class MCDropout(Detector):
    """s(x) = max_k softmax(mean over T passes of W dropout_p(h) + b)_k."""

    label = "MC Dropout"
    reference_code = "OpenOOD openood/postprocessors/dropout_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Gal and Ghahramani, Dropout as a Bayesian Approximation, ICML 2016"

    @dataclass(frozen=True)
    class Params(Params):
        p: float = param(0.5, "dropout probability of each feature (dropout_net.yml:8)", ge=0, lt=1)
        times: int = param(5, "passes averaged (dropout.yml:6)", ge=1)
        seed: int = param(0, "seed of torch's generator for the masks (the reference: unseeded)")
        batch_rows: int = param(200, "rows per batch of masks (OpenOOD's evaluator batch size, evaluator.py:33): "
                                "the masks depend on it", ge=1)

    fit_inputs = frozenset({"head"})
    needs_head = True

    def _score(self, batch) -> np.ndarray:
        h = stored_features(batch, self.name)
        weight = torch.from_numpy(np.ascontiguousarray(self.head.weight, dtype=np.float32))
        bias = torch.from_numpy(np.ascontiguousarray(self.head.bias, dtype=np.float32))
        out = np.empty(len(h))
        with torch.random.fork_rng(devices=[]):  # the global generator as the reference uses it, restored after
            torch.manual_seed(self.params["seed"])
            rows = self.params["batch_rows"]
            for start in range(0, len(h), rows):
                logits = mc_dropout_logits(h[start:start + rows], weight, bias, self.params["p"], self.params["times"])
                out[start:start + len(logits)] = softmax(logits).max(axis=1)
        return out
