"""MCD (Yu & Aizawa, ICCV 2019, "Unsupervised Out-of-Distribution Detection by Maximum Classifier Discrepancy"), as
OpenOOD v1.5 / Open-Insects train and score it (`mcd_net`, `mcd_trainer`, `mcd_postprocessor`).

Two classifier heads on one backbone: fc1 (here the classifier's own head, the closed-set head) and fc2 (a new linear
layer). Each step runs ID and auxiliary rows (one aux batch as large as the ID batch) through the backbone:
loss = CE(fc1(ID), y) + CE(fc2(ID), y) + lambda_oe * relu(margin - mean(H(fc1(aux)) - H(fc2(aux)))), lambda_oe 1,
margin 1.2. H is the trainer's `entropy`, which takes the softmax and the sum over dim 0, i.e. over the batch: a
per-class entropy of the batch's columns (`entropy_over="batch"`, the code's default); `entropy_over="classes"` takes
the usual per-sample entropy over classes. Score = -sum_k |softmax(fc1)_k - softmax(fc2)_k| (higher = more ID), or "msp"
of fc1.

The trainer's `start_epoch_ft` (90 in train_mcd.yml) trains both heads with CE only, on ID batches alone, while
epoch_idx (from 1) is below it. Open-Insects fine-tunes 30 epochs with that yml, so its MCD never reaches the aux term:
protocol `open-insects` sets `start_epoch_ft: 90` (`detectors/harness/protocols.py`). The default, 0 (protocol `exact`),
runs the aux phase throughout, the method as published.
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


def mcd_entropy(logits: torch.Tensor, over: str = "batch") -> torch.Tensor:
    """OpenOOD's `entropy`: softmax and sum over dim 0 ("batch": one value per class) or over classes (one per row)."""
    dim = 0 if over == "batch" else 1
    p = torch.softmax(logits, dim=dim)
    return -(p * torch.log(p)).sum(dim=dim)


def discrepancy(logits1: np.ndarray, logits2: np.ndarray) -> np.ndarray:
    """sum_k |softmax(z1)_k - softmax(z2)_k| per row, float64."""
    return np.abs(softmax64(logits1) - softmax64(logits2)).sum(1)


class MCDLoss(Objective):
    uses_aux = True

    def __init__(self, lambda_oe: float = 1.0, margin: float = 1.2, entropy_over: str = "batch",
                 start_epoch_ft: int = 0):
        super().__init__()
        if entropy_over not in ("batch", "classes"):
            raise ValueError(f"entropy_over must be 'batch' or 'classes', got {entropy_over!r}")
        self.lambda_oe, self.margin, self.entropy_over = float(lambda_oe), float(margin), entropy_over
        self.start_epoch_ft = int(start_epoch_ft)
        self.fc2: nn.Linear | None = None

    def aux_active(self, epoch: int) -> bool:
        """The reference's `epoch_idx >= start_epoch_ft` (epoch_idx = epoch + 1): before it, ID batches only."""
        return epoch + 1 >= self.start_epoch_ft

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.fc2 = nn.Linear(feature_dim, num_classes)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        n = batch.n_id
        z1, z2 = logits.float(), self.fc2(features).float()
        loss = F.cross_entropy(z1[:n], batch.y) + F.cross_entropy(z2[:n], batch.y)
        if len(z1) > n:
            ent = (mcd_entropy(z1[n:], self.entropy_over) - mcd_entropy(z2[n:], self.entropy_over)).mean()
            loss = loss + self.lambda_oe * F.relu(self.margin - ent)
        return loss


@register_detector("mcd")
class MCD(TrainedDetector):
    """Two heads whose discrepancy on auxiliary data is maximised; score = minus their discrepancy on a sample."""

    label = "MCD"
    paper = "Yu & Aizawa, Unsupervised Out-of-Distribution Detection by Maximum Classifier Discrepancy, ICCV 2019"
    released_network = None  # not in the Open-Insect model zoo

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        lambda_oe: float = param(1.0, "weight of the discrepancy loss on auxiliary data", ge=0)
        margin: float = param(1.2, "discrepancy margin", ge=0)
        entropy_over: Literal["batch", "classes"] = param("batch", "entropy over the batch (the code) or over classes")
        start_epoch_ft: int = param(0, "first epoch (from 1) with the auxiliary term; train_mcd.yml: 90 (never reached "
                                       "in a 30-epoch fine-tune)", ge=0)
        score_rule: Literal["discrepancy", "msp"] = param("discrepancy", "how the trained model scores")

    search_space = {"margin": [0.6, 1.2, 2.4]}

    def objective(self) -> Objective:
        p = self.params
        return MCDLoss(p["lambda_oe"], p["margin"], p["entropy_over"], p["start_epoch_ft"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        return linear_arrays(objective.fc2, "fc2")

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        return -discrepancy(logits, apply_linear(self.extra, "fc2", features))
