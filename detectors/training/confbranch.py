"""ConfBranch (DeVries & Taylor, 2018): a confidence branch c = sigmoid(w.h + b) learned with "hints".

p' = c * p + (1 - c) * onehot(y) for a random half of the samples (the others keep c = 1, i.e. no hint); loss =
NLL(log p') + lmbda * mean(-log c), with p and c clamped to [eps, 1 - eps]. After each step lmbda is divided by
1.01 when the confidence loss is under `budget` and by 0.99 otherwise (as in the OpenOOD / Open-Insects trainer).
Score = c (or MSP of the closed head).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, apply_linear, linear_arrays, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def hint_mask(n: int, generator: torch.Generator | None) -> torch.Tensor:
    """[n,1] float mask: 1 = use the predicted confidence, 0 = no hint (confidence set to 1); each with probability
    1/2."""
    return (torch.rand(n, 1, generator=generator) < 0.5).float()


class ConfBranchLoss(Objective):
    def __init__(self, lmbda: float = 0.1, budget: float = 0.3, eps: float = 1e-12):
        super().__init__()
        self.lmbda, self.budget, self.eps = float(lmbda), float(budget), float(eps)
        self.branch: nn.Linear | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.branch = nn.Linear(feature_dim, 1)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        n = batch.n_id
        p = F.softmax(logits[:n].float(), dim=1).clamp(self.eps, 1 - self.eps)
        c = torch.sigmoid(self.branch(features[:n]).float()).clamp(self.eps, 1 - self.eps)
        b = hint_mask(n, batch.generator).to(c.device)
        conf = c * b + (1 - b)
        onehot = F.one_hot(batch.y, p.shape[1]).float()
        mixed = p * conf + onehot * (1 - conf)
        nll = F.nll_loss(torch.log(mixed), batch.y)
        conf_loss = (-torch.log(c)).mean()
        total = nll + self.lmbda * conf_loss
        if self.training:
            self.lmbda = self.lmbda / 1.01 if self.budget > float(conf_loss.detach()) else self.lmbda / 0.99
        return total


@register_detector("confbranch")
class ConfBranch(TrainedDetector):
    """Train a confidence branch with hints; score = predicted confidence."""

    label = "ConfBranch"
    aliases = {"conf_branch": "OpenOOD's"}
    paper = "DeVries & Taylor, Learning Confidence for Out-of-Distribution Detection in Neural Networks, 2018"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        lmbda: float = param(0.1, "initial weight of the confidence penalty", ge=0)
        budget: float = param(0.3, "target confidence penalty (lmbda adapts to it)", gt=0)
        eps: float = param(1e-12, "numerical floor of the confidence", gt=0)
        score_rule: Literal["confidence", "msp"] = param("confidence", "how the trained model scores")

    search_space = {"budget": [0.1, 0.3, 0.5]}

    def objective(self) -> Objective:
        p = self.params
        return ConfBranchLoss(p["lmbda"], p["budget"], p["eps"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        return linear_arrays(objective.branch, "branch")

    released_network = "conf_branch_net"

    def released_arrays(self, parts: dict) -> dict[str, np.ndarray]:
        """conf_branch_net's `confidence` layer is the branch."""
        from detectors.training.released import linear

        return linear(parts["network"], "confidence", "branch")

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        return 1.0 / (1.0 + np.exp(-apply_linear(self.extra, "branch", features)[:, 0]))
