"""RTS (random temperature scaling) as OpenOOD v1.5 trains and scores it: a variance head beside the classifier draws a
per-sample temperature during training; the OOD score is the mean predicted variance.

Reference (OpenOOD at 3c35632): `openood/networks/rts_net.py:15-18` (the head: Linear(D, dof) + BatchNorm1d(dof) on
the backbone's penultimate features, the variance exp of its output, `:22-25`), `openood/trainers/rts_trainer.py:54-71`
(per step: epsilon ~ N(0, 1) of the variance's shape, temperature T = sum_j var_j eps_j^2 / (dof - 2), loss =
CE(logits / T, y) + kl_scale * mean(0.5 (var - log(var + 1e-8) - 1)), gradients clipped to total norm 2.5),
`configs/networks/rts_net.yml:8-9` (dof 32, kl_scale 0.1), `openood/postprocessors/rts_postprocessor.py:16-26` with
`configs/postprocessors/rts.yml:5` (ood_score `var`: the mean of the eval-mode variance over its dof entries, higher
read as more in-distribution by OpenOOD's evaluator; `msp`: the max softmax of the plain logits). ID-val accuracy reads
the plain logits, as OpenOOD's evaluator calls `net(data)`. The recipe's optimiser trains (theirs: SGD, nesterov, lr
0.1, cosine); the clipping is the loop's (`Objective.max_grad_norm`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, linear_arrays, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch

MAX_GRAD_NORM = 2.5
"""rts_trainer.py:68-70: `clip_grad_norm_(net.parameters(), max_norm=2.5)`."""
LOG_FLOOR = 1e-8
"""rts_trainer.py:59: log(var + 1e-8) in the KL term."""


def rts_loss(logits: torch.Tensor, variance: torch.Tensor, epsilon: torch.Tensor, y: torch.Tensor, dof: int,
             kl_scale: float) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(total, cross-entropy, KL) of rts_trainer.py:55-63 for given draws `epsilon` (the shape of `variance`)."""
    temperature = torch.sum(variance * epsilon * epsilon, dim=1, keepdim=True) / (dof - 2)
    kl = ((variance - torch.log(variance + LOG_FLOOR) - 1) * 0.5).mean()
    ce = F.cross_entropy(logits / temperature, y)
    return ce + kl_scale * kl, ce, kl


class RTSLoss(Objective):
    """CE(logits / T, y) + kl_scale * KL, T drawn from the variance head (rts_trainer.py:54-63); `epsilon` from the
    step's generator when the batch carries one, else torch's global generator (as the reference)."""

    max_grad_norm = MAX_GRAD_NORM

    def __init__(self, dof: int = 32, kl_scale: float = 0.1):
        super().__init__()
        if dof <= 2:
            raise ValueError(f"rts: dof={dof}: the temperature divides by dof - 2, so dof must be at least 3")
        self.dof, self.kl_scale = int(dof), float(kl_scale)
        self.logvar: nn.Sequential | None = None
        self.last_terms: dict[str, float] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.logvar = nn.Sequential(nn.Linear(feature_dim, self.dof), nn.BatchNorm1d(self.dof))  # rts_net.py:15-18

    def variance(self, features: torch.Tensor) -> torch.Tensor:
        """exp of the head's output (rts_net.py:23-24). A training batch of fewer than 2 rows (an empty share, a last
        row alone), where batch norm has no batch statistics, reads the running ones (the reference: an error)."""
        if self.logvar is None:
            raise RuntimeError("RTSLoss.setup before the first step: the variance head is not built")
        bn = self.logvar[1]
        if bn.training and len(features) < 2:
            bn.eval()
            try:
                return self.logvar(features).float().exp()
            finally:
                bn.train()
        return self.logvar(features).float().exp()

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        n = batch.n_id
        variance = self.variance(features[:n])
        if batch.generator is not None:
            epsilon = torch.randn(variance.shape, generator=batch.generator).to(variance.device)
        else:
            epsilon = torch.randn_like(variance)
        total, ce, kl = rts_loss(logits[:n].float(), variance, epsilon, batch.y, self.dof, self.kl_scale)
        self.last_terms = {"ce": float(ce.detach()), "kl": float(kl.detach())}
        return total


def rts_variance(extra: dict[str, np.ndarray], features: np.ndarray) -> np.ndarray:
    """float64 [N, dof]: exp(BatchNorm1d_eval(features W^T + b)) from the exported arrays (rts_net.py:23-24)."""
    z = features @ extra["logvar.linear.weight"].T + extra["logvar.linear.bias"]
    scale = extra["logvar.bn.weight"] / np.sqrt(extra["logvar.bn.running_var"] + extra["logvar.bn.eps"])
    return np.exp((z - extra["logvar.bn.running_mean"]) * scale + extra["logvar.bn.bias"])


@register_detector("rts")
class RTS(TrainedDetector):
    """Train a variance head that draws per-sample temperatures; score the mean variance (OpenOOD's `var`) or the
    MSP."""

    label = "RTS"
    paper = "RTS, AAAI 2023, as OpenOOD v1.5 lists and implements it (README.md:289; rts_net, trainer, postprocessor)"
    reference_code = "Jingkang50/OpenOOD openood/trainers/rts_trainer.py"
    released_network = None  # not in the Open-Insect model zoo

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        dof: int = param(32, "degrees of freedom: the variance head's width (rts_net.yml:8)", ge=3)
        kl_scale: float = param(0.1, "weight of the KL term (rts_net.yml:9)", ge=0)
        score_rule: Literal["var", "msp"] = param("var", "the score: mean variance or MSP (rts.yml:5 ood_score)")

    def objective(self) -> Objective:
        return RTSLoss(self.params["dof"], self.params["kl_scale"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        bn = objective.logvar[1]
        out = linear_arrays(objective.logvar[0], "logvar.linear")
        out.update({f"logvar.bn.{k}": bn.state_dict()[k].detach().double().cpu().numpy()
                    for k in ("weight", "bias", "running_mean", "running_var")})
        out["logvar.bn.eps"] = np.array(bn.eps, dtype=np.float64)
        return out

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        return rts_variance(self.extra, features).mean(1)
