"""LogitNorm (Wei et al., ICML 2022): cross-entropy on L2-normalised logits divided by a temperature tau."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


class LogitNormLoss(Objective):
    """CE(z / (tau * (||z||_2 + 1e-7)), y) on the ID samples."""

    advances_schedule = False  # the reference trainer never advances its step counter (lr constant within an epoch)

    def __init__(self, tau: float = 0.04):
        super().__init__()
        self.tau = float(tau)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits[: batch.n_id].float()
        z = z / (z.norm(p=2, dim=1, keepdim=True) + 1e-7) / self.tau
        return F.cross_entropy(z, batch.y)


@register_detector("logitnorm")
class LogitNorm(TrainedDetector):
    """Train with LogitNorm, score with MSP on the trained head."""

    label = "LogitNorm"
    paper = "Wei et al., Mitigating Neural Network Overconfidence with Logit Normalization, ICML 2022"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        tau: float = param(0.04, "logit-norm temperature", gt=0)

    search_space = {"tau": [0.01, 0.02, 0.04, 0.06, 0.08]}

    def objective(self) -> Objective:
        return LogitNormLoss(self.params["tau"])
