"""AugMix (Hendrycks et al., ICLR 2020) as OpenOOD v1.5 trains it: every training image comes as its clean crop and
two AugMix views of that crop; the three run through the model as ONE batch [clean; aug1; aug2] (3B rows), and the
loss is cross-entropy on the clean rows plus lam times the Jensen-Shannon consistency of the three softmaxes,
    JS = (KL(p_clean || M) + KL(p_aug1 || M) + KL(p_aug2 || M)) / 3,  M = clamp(mean of the three p, 1e-7, 1),
each KL a `batchmean` (sum over classes and rows / B). Without `jsd` the image is one AugMix view and the loss plain CE.

Reference: OpenOOD `openood/trainers/augmix_trainer.py:57-82` (the concatenation, CE on the clean logits, the clamped
mixture and the lam-weighted mean of the three `F.kl_div(log M, p, 'batchmean')`), `:83-88` (no jsd: CE);
`configs/pipelines/train/train_augmix.yml:16-20` (jsd true, lam 12);
`openood/preprocessors/augmix_preprocessor.py:28-33, 65-72` (torchvision's AugMix with the dataset's interpolation,
bilinear; clean + two views of one crop) and `:39-60` (the crop: the ImageNet branch RandomResizedCrop + flip, the
else branch Resize, CenterCrop, flip, RandomCrop padding 4: `augment` imagenet / region);
`configs/preprocessors/augmix_preprocessor.yml:3-7` (severity 1, all_ops, width 3, alpha 1, depth -1;
`scripts/uncertainty/augmix/cifar10_train_augmix.sh` passes severity 3 and jsd False, the ImageNet-200 script keeps
the JSD config); scored with MSP (`scripts/uncertainty/augmix/*_test_ood_msp.sh`). The AugMix pixels are torchvision's
(`pipelines.training.augmix`), drawn from the loader's per-row generator (theirs: torch's global one in the workers).
Images only: the views are made from pixels, so there is no heads-only mode.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch
from pipelines.training.augmix import AugMix as AugMixTransform
from pipelines.training.augmix import AugMixViews

MIXTURE_FLOOR = 1e-7
"""The clamp of the mixture distribution (`augmix_trainer.py:76-78`: it keeps the KL finite)."""


def jsd_consistency(clean: torch.Tensor, aug1: torch.Tensor, aug2: torch.Tensor) -> torch.Tensor:
    """The mean of the three `batchmean` KL(p || M) of the views' softmaxes to their clamped mixture M
    (`augmix_trainer.py:71-82` without lam)."""
    p = [F.softmax(z, dim=1) for z in (clean, aug1, aug2)]
    log_mixture = torch.clamp((p[0] + p[1] + p[2]) / 3.0, MIXTURE_FLOOR, 1).log()
    return sum(F.kl_div(log_mixture, q, reduction="batchmean") for q in p) / 3.0


def stack_views(x: torch.Tensor) -> torch.Tensor:
    """[B, V, C, H, W] views (AugMixViews, collated) -> [V*B, C, H, W], view after view (`torch.cat([orig, aug1,
    aug2])`)."""
    return x.transpose(0, 1).reshape(-1, *x.shape[2:])


class AugMixLoss(Objective):
    """CE on the clean rows + lam * JS consistency of the clean and the two AugMix rows (one forward on all 3B)."""

    def __init__(self, lam: float = 12.0, jsd: bool = True):
        super().__init__()
        self.lam, self.jsd = float(lam), bool(jsd)

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        x = batch.x
        if self.jsd and x.dim() != 5:
            raise ValueError("AugMix with jsd trains on [B, 3, C, H, W] view stacks (clean, aug1, aug2: AugMixViews), "
                             f"got a batch of shape {tuple(x.shape)}; it has no heads-only mode")
        return stack_views(x) if x.dim() == 5 else x

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        n, z = batch.n_id, logits.float()
        loss = F.cross_entropy(z[:n], batch.y)
        if self.jsd and len(z) == 3 * n:
            loss = loss + self.lam * jsd_consistency(z[:n], z[n:2 * n], z[2 * n:3 * n])
        return loss


@register_detector("augmix")
class AugMix(TrainedDetector):
    """Train with AugMix views and the JSD consistency loss, score with MSP (OpenOOD v1.5's evaluation of it)."""

    label = "AugMix"
    paper = ("Hendrycks et al., AugMix: A Simple Data Processing Method to Improve Robustness and Uncertainty, "
             "ICLR 2020")
    reference_code = "Jingkang50/OpenOOD openood/trainers/augmix_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        mode: Literal["full"] = param("full", "AugMix views are made from pixels: full mode only")
        augment: Literal["region", "imagenet"] = param(
            "region", "the crop under the views: the reference preprocessor's else branch (resize, centre crop, flip, "
            "RandomCrop with padding 4) or its ImageNet one (RandomResizedCrop, flip)")
        severity: int = param(1, "AugMix severity: magnitude bins 0..severity-1 of 10", ge=1, le=10)
        mixture_width: int = param(3, "AugMix chains mixed per view", ge=1)
        chain_depth: int = param(-1, "ops per chain; <= 0: uniform in 1..3 per chain")
        alpha: float = param(1.0, "Dirichlet / Beta concentration of the mixing weights", gt=0)
        all_ops: bool = param(True, "also brightness, color, contrast and sharpness")
        interpolation: Literal["bilinear", "nearest"] = param("bilinear", "resampling of the geometric ops")
        jsd: bool = param(True, "clean + two views with the JS consistency loss; false: one AugMix view, plain CE")
        lam: float = param(12.0, "weight of the JS consistency term", ge=0)

    def objective(self) -> Objective:
        return AugMixLoss(self.params["lam"], self.params["jsd"])

    def augmix(self) -> AugMixTransform:
        p = self.params
        return AugMixTransform(p["severity"], p["mixture_width"], p["chain_depth"], p["alpha"], p["all_ops"],
                               p["interpolation"])

    def training_transforms(self, transforms: tuple[Any, Any] | None) -> tuple[Any, Any] | None:
        """The training crop wrapped in the AugMix views; evaluation pixels unchanged."""
        if transforms is None:
            raise ValueError(f"{self.name} makes its views from the training crop: augment must name one")
        train, evaluate = transforms
        return AugMixViews(train, self.augmix(), self.params["jsd"]), evaluate
