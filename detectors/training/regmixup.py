"""RegMixup (Pinto et al., NeurIPS 2022) as OpenOOD v1.5 trains it: mixup as a regulariser beside the clean batch.
The clean batch and its mixup blend run through the model as ONE concatenated batch (2B rows), and the loss is
lam * CE([y, y]) + (1 - lam) * CE([y, y[perm]]) over all 2B rows: plain cross-entropy on the clean half plus the
mixup loss on the blended half, each mean over 2B.

Reference: OpenOOD `openood/trainers/regmixup_trainer.py:14-30` (lam ~ Beta(alpha, alpha), 1 when alpha is 0; a
random permutation; the blend; the lam-weighted criterion), `:73-84` (the concatenation and the loss);
`configs/pipelines/train/train_regmixup.yml:19-21` (alpha 20; `scripts/uncertainty/regmixup/imagenet_train_regmixup.sh`
passes 10 for the ImageNet fine-tune); the benchmark scores it with MSP
(`scripts/uncertainty/regmixup/cifar10_test_ood_msp.sh`). The draws come from the step's seeded generator (theirs:
the global numpy / torch RNGs). In the heads-only mode the blend is a manifold mixup of penultimate features.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from detectors.training.mixup import MixupLoss, blend
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


class RegMixupLoss(MixupLoss):
    """CE on the clean rows and the lam-weighted mixup CE on the blended rows, one mean over both halves (mixup's pairs,
    drawn from Beta(20, 20) by default)."""

    def __init__(self, alpha: float = 20.0):
        super().__init__(alpha)

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        self._pairs = self.draw(batch)
        return torch.cat([batch.x, blend(batch.x, self._pairs)])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        if self._pairs is None or len(z) == batch.n_id:  # not through `inputs`: the clean rows only
            return F.cross_entropy(z[: batch.n_id], batch.y)
        z = z[: 2 * batch.n_id]
        lam = self._pairs.lam
        y_a = torch.cat([batch.y, batch.y])
        y_b = torch.cat([batch.y, batch.y[self._pairs.index.to(batch.y.device)]])
        return lam * F.cross_entropy(z, y_a) + (1 - lam) * F.cross_entropy(z, y_b)


@register_detector("regmixup")
class RegMixup(TrainedDetector):
    """Train with RegMixup, score with MSP (OpenOOD v1.5's evaluation of it)."""

    label = "RegMixup"
    paper = ("Pinto et al., Using Mixup as a Regularizer Can Surprisingly Improve Accuracy and Out Distribution "
             "Robustness, NeurIPS 2022")
    reference_code = "Jingkang50/OpenOOD openood/trainers/regmixup_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        alpha: float = param(20.0, "Beta(alpha, alpha) mixing distribution (0: the blend is the clean batch)", ge=0)

    def objective(self) -> Objective:
        return RegMixupLoss(self.params["alpha"])
