"""ARPL (Chen et al., TPAMI 2021): Adversarial Reciprocal Points Learning, without the GAN (as benchmarked by
OpenOOD v1.5 / Open-Insects: the `arpl` trainer with the ARPLoss criterion).

One reciprocal point p_k [D] a class (init 0.1 * N(0, 1)) and a learned radius R (init 0). On penultimate features h:
  logits_k = ||h - p_k||^2 / D - h . p_k        (distance to the class's reciprocal point, minus their inner product)
  loss = CE(logits / temp, y) + weight_pl * mean_i max(0, ||h_i - p_{y_i}||^2 / D - R + 1)
(the second term is MarginRankingLoss(R, d, target 1, margin 1)). The points replace the classifier's head. Scored
with MSP of the logits (OpenOOD's ARPL evaluator scores the criterion's logits with the chosen post-processor, MSP).

As a linear head: logits_k = h @ (-(2 / D + 1) p_k) + ||p_k||^2 / D + ||h||^2 / D; the last term is the same for every
class, so `trained_head` (without it) gives the same softmax; `transform` returns the exact logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.base import LinearHead, as_numpy
from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, logsumexp64, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def arpl_logits(features: torch.Tensor, points: torch.Tensor) -> torch.Tensor:
    """||h - p_k||^2 / D - h . p_k for every class k: [N,C]."""
    dim = features.shape[1]
    sq = (features.pow(2).sum(1, keepdim=True) - 2 * features @ points.T + points.pow(2).sum(1)[None]) / dim
    return sq - features @ points.T


def points_head(points: np.ndarray) -> LinearHead:
    """The reciprocal-point logits as a linear head, without the per-row constant ||h||^2 / D (same softmax)."""
    dim = points.shape[1]
    return LinearHead(-(2.0 / dim + 1.0) * points, (points ** 2).sum(1) / dim)


class ARPLLoss(Objective):
    advances_schedule = False  # the reference trainer never advances its step counter (lr constant within an epoch)
    replaces_head = True

    def __init__(self, weight_pl: float = 0.1, temp: float = 1.0):
        super().__init__()
        self.weight_pl, self.temp = float(weight_pl), float(temp)
        self.points: nn.Parameter | None = None
        self.radius = nn.Parameter(torch.zeros(1))

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.points = nn.Parameter(0.1 * torch.randn(num_classes, feature_dim))

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"label": arpl_logits(features.float(), self.points)}

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        h = features[: batch.n_id].float()
        z = arpl_logits(h, self.points)
        known = (h - self.points[batch.y]).pow(2).mean(1)
        return F.cross_entropy(z / self.temp, batch.y) + self.weight_pl * F.relu(known - self.radius + 1.0).mean()


@register_detector("arpl")
class ARPL(TrainedDetector):
    """Reciprocal points replace the head; score = MSP of the reciprocal-point logits (or their logsumexp)."""

    label = "ARPL"
    paper = "Chen et al., Adversarial Reciprocal Points Learning for Open Set Recognition, TPAMI 2021"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        weight_pl: float = param(0.1, "weight of the reciprocal-point loss", ge=0)
        temp: float = param(1.0, "temperature of the reciprocal-point logits", gt=0)
        score_rule: Literal["msp", "energy"] = param("msp", "how the trained model scores")

    search_space = {"weight_pl": [0.01, 0.1, 1.0]}

    def objective(self) -> Objective:
        return ARPLLoss(self.params["weight_pl"], self.params["temp"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        return {"points": as_numpy(objective.points, np.float64), "radius": as_numpy(objective.radius, np.float64)}

    def closed_logits(self, features: np.ndarray) -> np.ndarray:
        p = self.extra["points"]
        dim = features.shape[1]
        sq = ((features ** 2).sum(1, keepdims=True) - 2 * features @ p.T + (p ** 2).sum(1)[None]) / dim
        return sq - features @ p.T

    @property
    def trained_head(self) -> LinearHead:
        self._check_fitted()
        return points_head(self.extra["points"])

    released_network = "arpl_net"

    def released_arrays(self, parts: dict) -> dict[str, np.ndarray]:
        """The ARPLayer's `points` (= `Dist.centers`) and `radius` (arpl_criterion_<region>.pth)."""
        state = parts["criterion"].state
        return {"points": as_numpy(state["points"], np.float64), "radius": as_numpy(state["radius"], np.float64)}

    def released_head(self, parts: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """netF has no fc (nn.Identity): the reciprocal points' linear head (`points_head`)."""
        head = points_head(self.extra["points"])
        return torch.from_numpy(head.weight).float(), torch.from_numpy(head.bias).float()

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        return softmax64(logits).max(1) if self.params["score_rule"] == "msp" else logsumexp64(logits)
