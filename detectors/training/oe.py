"""Outlier Exposure (Hendrycks et al., ICLR 2019): CE on ID + lambda * cross-entropy to the uniform on auxiliary
data."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def uniform_ce(logits: torch.Tensor) -> torch.Tensor:
    """Mean over samples of CE(uniform, softmax(z)) = logsumexp(z) - mean_k z_k."""
    return (torch.logsumexp(logits, dim=1) - logits.mean(dim=1)).mean()


class OELoss(Objective):
    """CE(ID) + lam * uniform-CE(aux); aux batch as large as the ID batch."""

    uses_aux = True

    def __init__(self, lam: float = 0.5):
        super().__init__()
        self.lam = float(lam)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        loss = F.cross_entropy(z[: batch.n_id], batch.y)
        if len(z) > batch.n_id:
            loss = loss + self.lam * uniform_ce(z[batch.n_id:])
        return loss


@register_detector("oe")
class OutlierExposure(TrainedDetector):
    """Train with Outlier Exposure on the auxiliary set, score with MSP."""

    label = "OE"
    paper = "Hendrycks et al., Deep Anomaly Detection with Outlier Exposure, ICLR 2019"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        lam: float = param(0.5, "weight of the uniform cross-entropy on outliers", ge=0)

    search_space = {"lam": [0.1, 0.5, 1.0]}

    def objective(self) -> Objective:
        return OELoss(self.params["lam"])
