"""ASCOOD (Regmi, 2024) as OpenOOD v1.5 trains and scores it: virtual outliers synthesised from each ID batch with the
input gradient of the true-class logit (pixels moved along it, or the most attributed pixels shuffled), trained towards
a uniform prediction beside the ID cross-entropy, on a head that reads z-scored penultimate features times sigma.

Reference: OpenOOD (3c35632) `openood/networks/ascood_net.py:5-9, 22-29` (logits fc(sigma * (h - mean h) / (std h +
1e-6)), std over the feature axis with Bessel's correction; `return_feature` hands the raw h), `openood/trainers/
ascood_trainer.py:72-83` (`get_grad`: the network in eval mode, the gradient of logit[y] w.r.t. the input), `:85-105`
(`shuffle`: the n = int(H W p_inv) positions of largest sum over channels of exp(grad), permuted among themselves by the
argsort of uniform draws, the same permutation for every channel), `:107-116` (`gradient`: the int(C H W p_inv) entries
of largest |grad| moved by alpha * grad), `:131-134` (alpha from alpha_max at epoch 0 down to alpha_min at the last,
epochs counted from 1), `:145-167` (ID and outlier rows in one forward; CE(ID) + w * KL(uniform || softmax(outliers))
with `batchmean`, or with `kl_div: False` the CE of an MLP Linear(1, 512)-ReLU-Linear(512, 2) telling the logsumexp of
ID rows (1) from outliers' (0)); `configs/pipelines/train/train_ascood.yml:21-28` (w 1, sigma 0.5, p_inv 0.1,
gradient, alpha 10 to 10, kl_div True). The released scripts train `shuffle` (`scripts/ood/ascood/
cifar10_train_ascood.sh`: p_inv 0.15; `cifar100_train_ascood.sh`: w 5, fc lr factor 0.05) and score with `scale`
(`*_test_ascood.sh`): the evaluator wraps the network in `ScaleNet` (`openood/evaluation_api/evaluator.py:118-119`),
whose `forward_threshold` (`openood/networks/scale_net.py:17-22`) applies the fc to SCALE's scaled RAW features h (not
z-scored), scored by logsumexp (`openood/postprocessors/scale_postprocessor.py:18-23`, `configs/postprocessors/
scale.yml`: percentile 85, swept over 65 ... 95 on OOD validation there).

Here `transform` hands post-hoc rules the raw features (what the reference network returns as its feature) and the
closed-set logits fc(sigma z(h)); `trained_head` is the plain fc, which `scale` applies to h as ScaleNet does (a
`rules: [scale]` entry gives the same scores). Deviations: the recipe's optimiser and schedule (theirs: SGD, nesterov,
lr 0.1, the fc at fc_lr_factor x lr, cosine per step to 1e-6, `:37-62`); `percentile` is not swept (training methods
run their defaults); the shuffle draws come from the step's seeded generator (theirs: torch's global generator); the
input gradient is taken with `torch.autograd.grad` on the input alone (theirs also fills the parameters' .grad,
cleared before the step). Heads mode treats a feature vector as one channel of D positions (`shuffle`) or D entries
(`gradient`).
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.posthoc.common import logsumexp_rows
from detectors.posthoc.scale import scale_logits
from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch
from pipelines.training.objectives import PRIMARY

STD_EPS = 1e-6  # ascood_net.py:8


def z_std(h: torch.Tensor) -> torch.Tensor:
    """(h - mean) / (std + 1e-6) over the last axis, std with Bessel's correction (`ascood_net.py:5-9`)."""
    return (h - h.mean(dim=-1, keepdim=True)) / (h.std(dim=-1, keepdim=True) + STD_EPS)


def z_std64(h: np.ndarray) -> np.ndarray:
    """`z_std` in float64 numpy (the scoring side)."""
    return (h - h.mean(axis=-1, keepdims=True)) / (h.std(axis=-1, ddof=1, keepdims=True) + STD_EPS)


def alpha_at(epoch: int, epochs: int, alpha_min: float, alpha_max: float) -> float:
    """The step size of epoch `epoch` (from 0): (alpha_max - alpha_min) (1 - (epoch + 1) / epochs) + alpha_min
    (`ascood_trainer.py:131-134`, whose epochs count from 1)."""
    return (alpha_max - alpha_min) * (1 - (epoch + 1) / epochs) + alpha_min


def input_gradient(model: nn.Module, logits_of: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor,
                   y: torch.Tensor) -> torch.Tensor:
    """d logit[y] / d x per row, the model in eval mode (`ascood_trainer.py:72-83`); `logits_of(features)` maps the
    model's features to the logits it differentiates. The model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.enable_grad():
            leaf = x.detach().clone().requires_grad_(True)
            _, features = model(leaf)
            logits = logits_of(features)
            score = logits[torch.arange(len(leaf), device=logits.device), y]
            (grad,) = torch.autograd.grad(score.sum(), leaf)
    finally:
        model.train(was_training)
    return grad


def _as_channels(x: torch.Tensor) -> torch.Tensor:
    """[B, C, positions]: an image's channels and pixels, or a feature vector as one channel of D positions."""
    return x.reshape(len(x), 1, -1) if x.dim() == 2 else x.reshape(len(x), x.shape[1], -1)


def shuffle_outliers(x: torch.Tensor, grad: torch.Tensor, p_inv: float,
                     generator: torch.Generator | None = None) -> torch.Tensor:
    """x with its int(positions * p_inv) most attributed positions (largest sum over channels of exp(grad)) permuted
    among themselves, one permutation per row for all channels: the argsort of uniform draws (`ascood_trainer.py:
    85-105`)."""
    flat, g = _as_channels(x), _as_channels(grad)
    batch, channels, positions = flat.shape
    top = torch.topk(g.exp().sum(dim=1), int(positions * p_inv), dim=1).indices
    draws = torch.rand(top.shape, generator=generator, dtype=torch.float32)
    order = torch.argsort(draws.to(top.device), dim=1)
    where = top.unsqueeze(1).expand(-1, channels, -1)
    picked = torch.gather(flat, 2, where)
    out = flat.clone()
    out.scatter_(2, where, torch.gather(picked, 2, order.unsqueeze(1).expand(-1, channels, -1)))
    return out.view_as(x).detach()


def gradient_outliers(x: torch.Tensor, grad: torch.Tensor, p_inv: float, alpha: float) -> torch.Tensor:
    """x + alpha * grad on its int(numel * p_inv) entries of largest |grad| per row (`ascood_trainer.py:107-116`)."""
    absolute = grad.abs().reshape(len(x), -1)
    top = torch.topk(absolute, int(absolute.shape[1] * p_inv), dim=1).indices
    mask = torch.zeros_like(absolute).scatter_(1, top, 1.0).view_as(x)
    return (x + grad * alpha * mask).detach()


class ASCOODLoss(Objective):
    """CE(ID) + w * (KL to uniform, or the energy MLP's CE) on outliers synthesised from the batch itself; `epochs`
    (the run's) paces alpha."""

    def __init__(self, w: float = 1.0, sigma: float = 0.5, p_inv: float = 0.1,
                 ood_type: str = "gradient", alpha_min: float = 10.0, alpha_max: float = 10.0, kl_div: bool = True,
                 *, epochs: int):
        super().__init__()
        if ood_type not in ("gradient", "shuffle"):
            raise ValueError(f"ascood: ood_type must be 'gradient' or 'shuffle', got {ood_type!r}")
        self.w, self.sigma, self.p_inv = float(w), float(sigma), float(p_inv)
        self.ood_type, self.kl_div, self.epochs = ood_type, bool(kl_div), int(epochs)
        self.alpha_min, self.alpha_max = float(alpha_min), float(alpha_max)
        self._head: list[nn.Linear] = []  # the model's head, kept out of the registered submodules
        self.last_terms: dict[str, float] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        if not self.kl_div:  # ascood_trainer.py:31-35, trained with the network
            self.logistic_regression = nn.Sequential(nn.Linear(1, 512), nn.ReLU(), nn.Linear(512, 2))

    def bind_head(self, head: nn.Linear) -> None:
        self._head = [head]

    def training_logits(self, features: torch.Tensor) -> torch.Tensor:
        """fc(sigma * z(h)), the reference network's forward (`ascood_net.py:22-29`)."""
        if not self._head:
            raise RuntimeError("ASCOODLoss needs the model's head: bind_head(head) before training")
        return self._head[0](z_std(features) * self.sigma)

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {PRIMARY: self.training_logits(features)}

    def outliers(self, model: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """`get_ood_sample` (`ascood_trainer.py:118-123`) of the batch's ID rows."""
        grad = input_gradient(model, self.training_logits, batch.x, batch.y)
        if self.ood_type == "shuffle":
            return shuffle_outliers(batch.x, grad, self.p_inv, batch.generator)
        alpha = alpha_at(batch.epoch, self.epochs, self.alpha_min, self.alpha_max)
        return gradient_outliers(batch.x, grad, self.p_inv, alpha)

    def model_inputs(self, model: nn.Module, batch: TrainBatch) -> torch.Tensor:
        """ID rows, then their outliers, in one forward (`ascood_trainer.py:145-148`)."""
        return torch.cat([batch.x, self.outliers(model, batch).to(batch.x.dtype)])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = self.training_logits(features).float()
        n = batch.n_id
        ce = F.cross_entropy(z[:n], batch.y)
        if self.kl_div:  # ascood_trainer.py:150-157: KLDivLoss(batchmean) of log-softmax against 1 / C
            uniform = torch.full_like(z[n:], 1.0 / z.shape[1])
            ood = F.kl_div(F.log_softmax(z[n:], dim=1), uniform, reduction="batchmean")
        else:  # :158-165: the energies of all rows, ID 1 and outliers 0
            out = self.logistic_regression(torch.logsumexp(z, dim=1).reshape(-1, 1))
            target = torch.cat([torch.ones(n), torch.zeros(len(z) - n)]).long().to(z.device)
            ood = F.cross_entropy(out, target)
        self.last_terms = {"ce": float(ce.detach()), "ood": float(ood.detach())}
        return ce + self.w * ood


@register_detector("ascood")
class ASCOOD(TrainedDetector):
    """Train on outliers synthesised from the ID images; score with SCALE on the raw features (the test scripts)."""

    label = "ASCOOD"
    paper = "Regmi, Going Beyond Conventional OOD Detection, arXiv:2411.10794, 2024"
    reference_code = "Jingkang50/OpenOOD openood/trainers/ascood_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        w: float = param(1.0, "weight of the outlier loss (train_ascood.yml:22)", ge=0)
        sigma: float = param(0.5, "scale of the z-scored features the head reads (train_ascood.yml:23)", gt=0)
        p_inv: float = param(0.1, "share of pixels treated as invariant and destroyed (train_ascood.yml:24)",
                             ge=0, le=1)
        ood_type: Literal["gradient", "shuffle"] = param(
            "gradient", "outlier synthesis: step along the input gradient, or shuffle the most attributed pixels "
                        "(train_ascood.yml:25; the released training scripts pass shuffle)")
        alpha_min: float = param(10.0, "gradient step at the last epoch (train_ascood.yml:27)")
        alpha_max: float = param(10.0, "gradient step at epoch 0, decreasing linearly (train_ascood.yml:26)")
        kl_div: bool = param(True, "outlier loss: KL to the uniform prediction, or an MLP on the energies "
                                   "(train_ascood.yml:28)")
        percentile: float = param(85, "SCALE's percentile at scoring (configs/postprocessors/scale.yml:5)",
                                  ge=0, lt=100)
        score_rule: Literal["scale", "msp"] = param(
            "scale", "how the trained model scores: SCALE's energy of fc on the scaled raw features (the test "
                     "scripts), or the MSP of the network's own logits fc(sigma z(h))")

    def objective(self) -> Objective:
        p = self.params
        return ASCOODLoss(p["w"], p["sigma"], p["p_inv"], p["ood_type"], p["alpha_min"], p["alpha_max"], p["kl_div"],
                          epochs=p["epochs"])

    def closed_logits(self, features: np.ndarray) -> np.ndarray:
        """fc(sigma * z(h)) in float64: the trained network's own logits."""
        return self.head(z_std64(features) * self.params["sigma"])

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        return logsumexp_rows(scale_logits(features, self.head.weight, self.head.bias, self.params["percentile"]))
