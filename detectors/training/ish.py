"""ISH, Intermediate tensor SHaping (Xu et al., ICLR 2024) as OpenOOD v1.5 trains it: plain cross-entropy, but the
classifier head's WEIGHT gradient is computed from a pruned and sharpened copy of its input. The forward pass, the
bias gradient and the gradient into the backbone are the ordinary ones.

Reference: OpenOOD `openood/trainers/ish_trainer.py:103-122` (`_ISHTLinear`: forward F.linear(x, W, b); backward
grad_W = g^T pad(select(x)), grad_b = sum g, grad_x = g W), `:128-133` (only in training mode), `:149-173`
(`minksample_expscale`: per row s1 = sum x, the k = int(D * (1 - param)) largest |x| kept (as |x|), s2 their sum,
scaled by exp(s1 / s2), the rest 0), `:246-255` (layer `r1`: the network's `fc` only), `:73-76` (the cross-entropy);
`configs/pipelines/train/train_ish.yml:21-26` (mode minksample_expscale, param 0.85, layer r1; weight_decay_fc 5e-5
beside weight_decay 5e-4 for the rest, `:36-38`, in its SGD's two groups `:26-37`). The paper scores the ISH model
with SCALE (its README); OpenOOD ships no test script for it, so `score_rule` is MSP and `rules: [scale]` in a run
config gives the paper's pairing. Deviations: the recipe's optimiser and one weight decay (theirs: SGD with 5e-5 on
the fc); the other two shapings (`expscale`, `minksample_lnscale`) are offered as `mode`.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch

Mode = Literal["minksample_expscale", "expscale", "minksample_lnscale"]


def shaped(x: torch.Tensor, mode: str, param: float) -> torch.Tensor:
    """The head input the weight gradient reads (`ish_trainer.py:149-231`): per row, s1 = sum x; the k =
    int(D * (1 - param)) largest |x| (kept as |x|) with s2 their sum; `minksample_expscale`: those k values times
    exp(s1 / s2), the rest 0; `minksample_lnscale`: times s1 / s2; `expscale`: every x times exp(s1 / s2)."""
    rows = x.reshape(len(x), -1)
    k = int(rows.shape[1] * (1 - param))
    if k < 1:
        raise ValueError(f"ISH keeps int(D * (1 - param)) = int({rows.shape[1]} * {1 - param}) = 0 features per row; "
                         "lower param or use a wider feature layer")
    s1 = rows.sum(dim=1)
    kept, idxs = rows.abs().topk(k, dim=1, sorted=False)
    scale = s1 / kept.sum(dim=1)
    if mode == "expscale":
        return x * torch.exp(scale).reshape(-1, *([1] * (x.dim() - 1)))
    kept = kept * (torch.exp(scale[:, None]) if mode == "minksample_expscale" else scale[:, None])
    return torch.zeros_like(rows).scatter_(1, idxs, kept).reshape(x.shape)


class _ISHLinear(torch.autograd.Function):
    """F.linear whose weight gradient reads `shaped(x)` (`_ISHTLinear`, ish_trainer.py:103-122)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, mode: str,
                param: float) -> torch.Tensor:
        ctx.has_bias = bias is not None
        with torch.autocast(x.device.type, enabled=False):  # in the weights' dtype (fp32), as the reference runs
            ctx.save_for_backward(shaped(x, mode, param), weight)
            return F.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        x, weight = ctx.saved_tensors
        grad_output = grad_output.to(weight.dtype)
        grad_bias = grad_output.sum(dim=tuple(range(grad_output.dim() - 1))) if ctx.has_bias else None
        grad_weight = grad_output.reshape(-1, weight.shape[0]).T.mm(x.reshape(-1, weight.shape[1]))
        return grad_output.matmul(weight), grad_weight, grad_bias, None, None


class ISHLoss(Objective):
    """CE of the model's own head on the features, its weight gradient from the shaped features."""

    def __init__(self, mode: str = "minksample_expscale", param: float = 0.85):
        super().__init__()
        if not 0 <= param < 1 or math.isnan(param):
            raise ValueError(f"ISH param is the pruned share of the features, in [0, 1); got {param}")
        self.mode, self.param = mode, float(param)
        self._head: list[nn.Linear] = []  # a list: the model's head, not registered twice

    def bind_head(self, head: nn.Linear) -> None:
        self._head = [head]

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        if not self._head:
            raise RuntimeError("ISHLoss needs the model's head: bind_head(head) before training")
        head = self._head[0]
        h = features[: batch.n_id]
        z = _ISHLinear.apply(h.to(head.weight.dtype), head.weight, head.bias, self.mode, self.param)
        return F.cross_entropy(z.float(), batch.y)


@register_detector("ish")
class ISH(TrainedDetector):
    """Train with ISH's shaped head gradient, score with MSP (SCALE as a post-hoc rule is the paper's pairing)."""

    label = "ISH"
    paper = "Xu et al., Scaling for Training Time and Post-hoc Out-of-distribution Detection Enhancement, ICLR 2024"
    reference_code = "Jingkang50/OpenOOD openood/trainers/ish_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        ish_mode: Mode = param("minksample_expscale", "how the head's weight gradient shapes its input")
        ish_param: float = param(0.85, "share of each row's features pruned (k = int(D * (1 - ish_param)) kept)",
                                 ge=0, lt=1)

    def objective(self) -> Objective:
        return ISHLoss(self.params["ish_mode"], self.params["ish_param"])
