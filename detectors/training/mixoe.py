"""MixOE (Zhang et al., WACV 2023): mix ID and outlier images, train the mixtures toward a soft label that moves from
the ID class to the uniform distribution in proportion to the outlier share.

Following the official code (zjysteven/MixOE): one lam ~ Beta(alpha, alpha) per batch; cutmix pastes an outlier box
into the ID images and resets lam to the kept ID area; mixup blends lam * x_id + (1 - lam) * x_aux. Soft target
lam * onehot(y) + (1 - lam) / C; loss = CE(ID) + beta * soft-CE(mixtures). (The OpenOOD / Open-Insects port draws
lam ~ Beta(alpha, beta) and weights with lambda_oe; we keep the paper's code.) In the heads-only mode inputs are
feature vectors, so only mixup applies (manifold mixup of penultimate features).
"""
from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
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

    def __init__(self, mix_op: str = "mixup", alpha: float = 1.0, beta: float = 5.0):
        super().__init__()
        if mix_op not in ("mixup", "cutmix"):
            raise ValueError(f"mix_op must be 'mixup' or 'cutmix', got {mix_op!r}")
        self.mix_op, self.alpha, self.beta = mix_op, float(alpha), float(beta)
        self._mixed: tuple[int, float] = (0, 1.0)

    def mix(self, x: torch.Tensor, aux_x: torch.Tensor, generator: torch.Generator | None) -> tuple[torch.Tensor, float]:
        """Mixtures of the first k = min(len(x), len(aux_x)) pairs and the ID share lam."""
        k = min(len(x), len(aux_x))
        x, aux_x = x[:k], aux_x[:k].to(x.dtype)
        generator = generator if generator is not None else torch.default_generator
        lam = _beta_sample(self.alpha, generator)
        if self.mix_op == "mixup":
            return lam * x + (1.0 - lam) * aux_x, lam
        if x.dim() != 4:
            raise ValueError("mix_op='cutmix' needs image inputs [B,C,H,W]; use mix_op='mixup' on cached features")
        top, left, bottom, right = cutmix_box(x.shape[-2], x.shape[-1], lam, generator)
        mixed = x.clone()
        mixed[:, :, top:bottom, left:right] = aux_x[:, :, top:bottom, left:right]
        lam = 1.0 - (bottom - top) * (right - left) / (x.shape[-2] * x.shape[-1])
        return mixed, lam

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        if batch.aux_x is None:
            self._mixed = (0, 1.0)
            return batch.x
        mixed, lam = self.mix(batch.x, batch.aux_x, batch.generator)
        self._mixed = (len(mixed), lam)
        return torch.cat([batch.x, mixed])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        loss = F.cross_entropy(z[: batch.n_id], batch.y)
        k, lam = self._mixed
        if k:
            num_classes = z.shape[1]
            onehot = F.one_hot(batch.y[:k], num_classes).float()
            soft = lam * onehot + (1.0 - lam) / num_classes
            loss = loss + self.beta * soft_cross_entropy(z[batch.n_id: batch.n_id + k], soft)
        return loss


def _beta_sample(alpha: float, generator: torch.Generator) -> float:
    """Beta(alpha, alpha) from two seeded Gamma draws (torch's Beta sampler takes no generator)."""
    a = torch._standard_gamma(torch.tensor([alpha, alpha], dtype=torch.float64), generator=generator)
    return float(a[0] / a.sum())


@register_detector("mixoe")
class MixOE(TrainedDetector):
    """Train with MixOE on ID + auxiliary data, score with MSP."""

    paper = "Zhang et al., Mixture Outlier Exposure: Towards Out-of-Distribution Detection in Fine-grained Environments, WACV 2023"
    method_defaults = {"mix_op": "mixup", "alpha": 1.0, "beta": 5.0, "score_rule": "msp"}
    search_space = {"beta": [1.0, 5.0, 10.0]}

    def objective(self) -> Objective:
        p = self.params
        return MixOELoss(p["mix_op"], p["alpha"], p["beta"])
