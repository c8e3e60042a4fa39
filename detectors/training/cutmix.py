"""CutMix (Yun et al., ICCV 2019) as OpenOOD v1.5 trains it: with probability `cutmix_prob` a box of the batch is
replaced by the same box of a shuffled copy, and the loss weighs the two labels by the kept area.

Reference: OpenOOD `openood/trainers/cutmix_trainer.py:58-75` (r ~ U(0, 1); when beta > 0 and r < cutmix_prob:
lam ~ Beta(beta, beta), a random permutation, the box, lam reset to the kept area, loss
lam * CE(y) + (1 - lam) * CE(y[perm]); else plain CE, `:76-79`), `:98-114` (`rand_bbox`: side sqrt(1 - lam) of each
spatial size, truncated; centre uniform over dim 2 then dim 3; corners clipped to the image);
`configs/pipelines/train/train_cutmix.yml:17-19` (beta 1.0, cutmix_prob 1.0; the CIFAR training scripts
`scripts/uncertainty/cutmix/cifar10_train_cutmix.sh:22` pass 0.5); the benchmark scores it with MSP
(`scripts/uncertainty/cutmix/cifar10_test_ood_msp.sh`). The draws come from the step's seeded generator (theirs: the
global numpy / torch RNGs). In the heads-only mode the inputs are feature vectors without a spatial layout, so the box
falls back to mixup of the features with the same lam (as MixOE's cutmix there).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from detectors.training.mixoe import beta_sample
from detectors.training.mixup import MixPairs, blend
from pipelines.params import param
from pipelines.training import Objective, TrainBatch

Box = tuple[int, int, int, int]


def box_at(size: tuple[int, ...], lam: float, cx: int, cy: int) -> Box:
    """(x1, y1, x2, y2): rows x1:x2 of dim 2 and columns y1:y2 of dim 3 around centre (cx, cy), as
    `cutmix_trainer.py:98-114` cuts them (side sqrt(1 - lam) of each size, truncated; corners clipped)."""
    w, h = size[2], size[3]
    cut = math.sqrt(1.0 - lam)
    cut_w, cut_h = int(w * cut), int(h * cut)
    return (min(max(cx - cut_w // 2, 0), w), min(max(cy - cut_h // 2, 0), h),
            min(max(cx + cut_w // 2, 0), w), min(max(cy + cut_h // 2, 0), h))


def rand_bbox(size: tuple[int, ...], lam: float, generator: torch.Generator) -> Box:
    """The box around a uniform centre, drawn over dim 2 then dim 3."""
    cx = int(torch.randint(size[2], (1,), generator=generator))
    cy = int(torch.randint(size[3], (1,), generator=generator))
    return box_at(size, lam, cx, cy)


@dataclass(frozen=True)
class CutPairs(MixPairs):
    """A CutMix draw: partners `index`, the box (None on feature vectors: blend with `lam`), `lam` the kept share."""

    box: Box | None = None


def paste(x: torch.Tensor, pairs: CutPairs) -> torch.Tensor:
    """x with the box taken from x[index] (a copy; the reference writes into its batch)."""
    if pairs.box is None:
        return blend(x, pairs)
    x1, y1, x2, y2 = pairs.box
    out = x.clone()
    out[:, :, x1:x2, y1:y2] = x[pairs.index.to(x.device), :, x1:x2, y1:y2]
    return out


def kept_area(size: tuple[int, ...], box: Box) -> float:
    """1 - box area / image area (`cutmix_trainer.py:69-70`)."""
    x1, y1, x2, y2 = box
    return 1 - ((x2 - x1) * (y2 - y1) / (size[-1] * size[-2]))


class CutMixLoss(Objective):
    """lam * CE(y) + (1 - lam) * CE(y[perm]) on the pasted batch; plain CE on batches left unmixed."""

    def __init__(self, beta: float = 1.0, cutmix_prob: float = 1.0):
        super().__init__()
        self.beta, self.cutmix_prob = float(beta), float(cutmix_prob)
        self._pairs: CutPairs | None = None

    def draw(self, batch: TrainBatch) -> CutPairs | None:
        """None (no mixing) or the draw, in the reference's order: r, lam, permutation, box centre."""
        generator = batch.generator if batch.generator is not None else torch.default_generator
        r = float(torch.rand(1, generator=generator, dtype=torch.float64))
        if not (self.beta > 0 and r < self.cutmix_prob):
            return None
        lam = beta_sample(self.beta, self.beta, generator)
        index = torch.randperm(batch.n_id, generator=generator)
        if batch.x.dim() != 4:
            return CutPairs(index, lam)
        box = rand_bbox(tuple(batch.x.shape), lam, generator)
        return CutPairs(index, kept_area(tuple(batch.x.shape), box), box)

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        self._pairs = self.draw(batch)
        return batch.x if self._pairs is None else paste(batch.x, self._pairs)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits[: batch.n_id].float()
        if self._pairs is None:
            return F.cross_entropy(z, batch.y)
        lam, partner = self._pairs.lam, batch.y[self._pairs.index.to(z.device)]
        return F.cross_entropy(z, batch.y) * lam + F.cross_entropy(z, partner) * (1 - lam)


@register_detector("cutmix")
class CutMix(TrainedDetector):
    """Train with CutMix, score with MSP (OpenOOD v1.5's evaluation of it)."""

    label = "CutMix"
    paper = ("Yun et al., CutMix: Regularization Strategy to Train Strong Classifiers with Localizable Features, "
             "ICCV 2019")
    reference_code = "Jingkang50/OpenOOD openood/trainers/cutmix_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        beta: float = param(1.0, "Beta(beta, beta) box-area distribution (0: never mix)", ge=0)
        cutmix_prob: float = param(1.0, "probability that a batch is mixed", ge=0, le=1)

    def objective(self) -> Objective:
        return CutMixLoss(self.params["beta"], self.params["cutmix_prob"])
