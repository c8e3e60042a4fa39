"""Mixup (Zhang et al., ICLR 2018) as OpenOOD v1.5 trains it: each batch is blended with a shuffled copy of itself,
lam * x + (1 - lam) * x[perm], and the model is fitted to the blended one-hot labels with a soft cross-entropy.

Reference: OpenOOD `openood/trainers/mixup_trainer.py:14-31` (one lam ~ Beta(alpha, alpha) per batch, 1 when alpha is
0; a random permutation of the batch), `:76-82` (inputs and soft labels mixed alike, `soft_cross_entropy` of
`openood/losses/sce.py:4-35, 56-74`, the mean over the batch); `configs/pipelines/train/train_mixup.yml:20-21`
(alpha 0.2); the benchmark scores it with MSP (`scripts/uncertainty/mixup/cifar100_test_ood_msp.sh`,
`configs/postprocessors/msp.yml`). The draws come from the step's seeded generator (theirs: the global numpy / torch
RNGs). In the heads-only mode the inputs are penultimate features, so the blend is a manifold mixup of features.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from detectors.training.mixoe import beta_sample, soft_cross_entropy
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


@dataclass(frozen=True)
class MixPairs:
    """One batch's mixing draw: partner rows `index` [B] and the share `lam` of the original rows."""

    index: torch.Tensor
    lam: float


def draw_pairs(n: int, alpha: float, generator: torch.Generator | None) -> MixPairs:
    """lam ~ Beta(alpha, alpha) (1 when alpha <= 0), then a random permutation of the n rows, in the reference's
    order (`mixup_trainer.py:16-25`)."""
    generator = generator if generator is not None else torch.default_generator
    lam = beta_sample(alpha, alpha, generator) if alpha > 0 else 1.0
    return MixPairs(torch.randperm(n, generator=generator), lam)


def blend(x: torch.Tensor, pairs: MixPairs) -> torch.Tensor:
    """lam * x + (1 - lam) * x[index] (`mixup_trainer.py:30-31`)."""
    return pairs.lam * x + (1 - pairs.lam) * x[pairs.index.to(x.device)]


class MixupLoss(Objective):
    """Soft cross-entropy of the blended batch against the blended one-hot labels."""

    def __init__(self, alpha: float = 0.2):
        super().__init__()
        self.alpha = float(alpha)
        self._pairs: MixPairs | None = None

    def draw(self, batch: TrainBatch) -> MixPairs:
        return draw_pairs(batch.n_id, self.alpha, batch.generator)

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        self._pairs = self.draw(batch)
        return blend(batch.x, self._pairs)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits[: batch.n_id].float()
        if self._pairs is None:  # not through `inputs` (no mixing drawn): plain cross-entropy
            return F.cross_entropy(z, batch.y)
        onehot = F.one_hot(batch.y, z.shape[1]).float()
        return soft_cross_entropy(z, blend(onehot, self._pairs))


@register_detector("mixup")
class Mixup(TrainedDetector):
    """Train with mixup, score with MSP (OpenOOD v1.5's evaluation of it)."""

    label = "Mixup"
    paper = "Zhang et al., mixup: Beyond Empirical Risk Minimization, ICLR 2018"
    reference_code = "Jingkang50/OpenOOD openood/trainers/mixup_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        alpha: float = param(0.2, "Beta(alpha, alpha) mixing distribution (0: no mixing)", ge=0)

    def objective(self) -> Objective:
        return MixupLoss(self.params["alpha"])
