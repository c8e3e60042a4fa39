"""MixOE (Zhang et al., WACV 2023): mix ID and outlier images, train the mixtures toward a soft label that moves from
the ID class to the uniform distribution in proportion to the outlier share.

Defaults: the Open-Insects recipe (its OpenOOD-based `mixoe` trainer, `train_mixoe.yml`): one lam ~ Beta(alpha=0.1,
beta=1.0) per batch, `mix_op="cutmix"` (an outlier box pasted into the ID images, lam reset to the kept ID area; mixup
blends lam * x_id + (1 - lam) * x_aux), soft target lam * onehot(y) + (1 - lam) / C,
loss = CE(ID) + lambda_oe (1.0) * soft-CE(mixtures), the ID batch and the mixtures run as two forward passes
(`passes=2`; 1 = one concatenated pass). The paper's own code (zjysteven/MixOE) draws lam ~ Beta(1, 1) and weights
the mixed term by 5: `alpha=1.0, beta=1.0, lambda_oe=5.0`. In the heads-only mode inputs are feature vectors without a
spatial layout, so cutmix falls back to mixup there (manifold mixup of penultimate features).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def soft_cross_entropy(logits: torch.Tensor, soft_targets: torch.Tensor) -> torch.Tensor:
    return -(soft_targets * F.log_softmax(logits, dim=1)).sum(1).mean()


def cutmix_box(height: int, width: int, lam: float, generator: torch.Generator) -> tuple[int, int, int, int]:
    """A box (top, left, bottom, right) covering about (1 - lam) of the image, centred uniformly at random."""
    cut = math.sqrt(1.0 - lam)
    cut_h, cut_w = int(height * cut), int(width * cut)
    cy = int(torch.randint(height, (1,), generator=generator))
    cx = int(torch.randint(width, (1,), generator=generator))
    top, bottom = min(max(cy - cut_h // 2, 0), height), min(max(cy + cut_h // 2, 0), height)
    left, right = min(max(cx - cut_w // 2, 0), width), min(max(cx + cut_w // 2, 0), width)
    return top, left, bottom, right


class MixOELoss(Objective):
    uses_aux = True

    def __init__(self, mix_op: str = "cutmix", alpha: float = 0.1, beta: float = 1.0, lambda_oe: float = 1.0,
                 passes: int = 2):
        super().__init__()
        if mix_op not in ("mixup", "cutmix"):
            raise ValueError(f"mix_op must be 'mixup' or 'cutmix', got {mix_op!r}")
        if passes not in (1, 2):
            raise ValueError(f"passes must be 1 or 2, got {passes!r}")
        self.mix_op, self.alpha, self.beta, self.lambda_oe, self.passes = (mix_op, float(alpha), float(beta),
                                                                           float(lambda_oe), passes)
        self._mixed: tuple[int, float] = (0, 1.0)

    def mix(self, x: torch.Tensor, aux_x: torch.Tensor,
            generator: torch.Generator | None) -> tuple[torch.Tensor, float]:
        """Mixtures of the first k = min(len(x), len(aux_x)) pairs and the ID share lam."""
        k = min(len(x), len(aux_x))
        x, aux_x = x[:k], aux_x[:k].to(x.dtype)
        generator = generator if generator is not None else torch.default_generator
        lam = beta_sample(self.alpha, self.beta, generator)
        if self.mix_op == "mixup" or x.dim() != 4:  # feature vectors (heads-only) cannot be cut: mixup
            return lam * x + (1.0 - lam) * aux_x, lam
        top, left, bottom, right = cutmix_box(x.shape[-2], x.shape[-1], lam, generator)
        mixed = x.clone()
        mixed[:, :, top:bottom, left:right] = aux_x[:, :, top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (x.shape[-2] * x.shape[-1])
        return mixed, lam

    def inputs(self, batch: TrainBatch) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if batch.aux_x is None:
            self._mixed = (0, 1.0)
            return batch.x
        mixed, lam = self.mix(batch.x, batch.aux_x, batch.generator)
        self._mixed = (len(mixed), lam)
        return (batch.x, mixed) if self.passes == 2 else torch.cat([batch.x, mixed])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        loss = F.cross_entropy(z[: batch.n_id], batch.y)
        k, lam = self._mixed
        if k:
            num_classes = z.shape[1]
            onehot = F.one_hot(batch.y[:k], num_classes).float()
            soft = lam * onehot + (1.0 - lam) / num_classes
            loss = loss + self.lambda_oe * soft_cross_entropy(z[batch.n_id: batch.n_id + k], soft)
        return loss


def beta_sample(a: float, b: float, generator: torch.Generator) -> float:
    """One Beta(a, b) draw from two seeded Gamma draws, X / (X + Y) (torch's Beta sampler takes no generator)."""
    g = torch._standard_gamma(torch.tensor([a, b], dtype=torch.float64), generator=generator)
    return float(g[0] / g.sum())


@register_detector("mixoe")
class MixOE(TrainedDetector):
    """Train with MixOE on ID + auxiliary data, score with MSP."""

    label = "MixOE"
    paper = ("Zhang et al., Mixture Outlier Exposure: Towards Out-of-Distribution Detection in Fine-grained "
             "Environments, WACV 2023")

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        mix_op: Literal["mixup", "cutmix"] = param("cutmix", "how ID and outlier images are mixed")
        alpha: float = param(0.1, "Beta(alpha, beta) mixing distribution: alpha", gt=0)
        beta: float = param(1.0, "Beta(alpha, beta) mixing distribution: beta", gt=0)
        lambda_oe: float = param(1.0, "weight of the mixed-target loss", ge=0)
        passes: int = param(2, "forward passes per step", ge=1)

    search_space = {"lambda_oe": [1.0, 5.0, 10.0]}

    def objective(self) -> Objective:
        p = self.params
        return MixOELoss(p["mix_op"], p["alpha"], p["beta"], p["lambda_oe"], p["passes"])
