"""Generalized ODIN (Hsu et al., CVPR 2020), decomposed confidence, as in OpenOOD v1.5 / Open-Insects (`godin_net`).

On penultimate features h: numerators h_k(x) = cos(h, w_k) (cosine similarity: both L2-normalised with +1e-4 on the
norm, no bias; w initialised Kaiming-normal), denominator g(x) = sigmoid(BN(v . h + c)) (a 1-unit linear layer,
BatchNorm1d, sigmoid). Training: CE(h(x) / g(x), y); h trains without weight decay (its own parameter group).
Scores (`score_rule`): "h" = max softmax of the numerators (what OpenOOD's G-ODIN post-processor returns), "g" = g(x).
The reference also perturbs the input image (noise_magnitude 0.0025) before scoring; scores here are computed on
cached features, so that step is not applied (documented deviation).

The closed-set head is the cosine head: `transform` gives L2-normalised features and the numerators as logits;
`trained_head` is the normalised weight matrix with zero bias.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.base import LinearHead, as_numpy, param
from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, softmax64
from pipelines.training import Objective, TrainBatch

NORM_EPS = 1e-4


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / (x.norm(p=2, dim=1, keepdim=True) + NORM_EPS)


class GODINLoss(Objective):
    replaces_head = True

    def __init__(self) -> None:
        super().__init__()
        self.h: nn.Linear | None = None
        self.g: nn.Sequential | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.h = nn.Linear(feature_dim, num_classes, bias=False)
        nn.init.kaiming_normal_(self.h.weight, nonlinearity="relu")
        self.g = nn.Sequential(nn.Linear(feature_dim, 1), nn.BatchNorm1d(1), nn.Sigmoid())

    def no_decay_parameters(self) -> list[nn.Parameter]:
        return list(self.h.parameters())

    def numerators(self, features: torch.Tensor) -> torch.Tensor:
        return _normalise(features) @ _normalise(self.h.weight).T

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"label": self.numerators(features.float())}

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        h = features[: batch.n_id].float()
        return F.cross_entropy(self.numerators(h) / self.g(h), batch.y)


def _norm64(x: np.ndarray) -> np.ndarray:
    return x / (np.linalg.norm(x, axis=1, keepdims=True) + NORM_EPS)


@register_detector("godin")
class GODIN(TrainedDetector):
    """Decomposed confidence h / g; score = max softmax of the cosine numerators h (or g)."""

    paper = "Hsu et al., Generalized ODIN: Detecting Out-of-distribution Image without Learning from OOD Data, CVPR 2020"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        score_rule: Literal["h", "g"] = param("h", "how the trained model scores")

    search_space = {"score_rule": ["h", "g"]}
    score_rules = ("h", "g")

    def objective(self) -> Objective:
        return GODINLoss()

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        linear, bn = objective.g[0], objective.g[1]
        return {"h.weight": as_numpy(objective.h.weight, np.float64),
                "g.weight": as_numpy(linear.weight, np.float64), "g.bias": as_numpy(linear.bias, np.float64),
                "g.bn.weight": as_numpy(bn.weight, np.float64), "g.bn.bias": as_numpy(bn.bias, np.float64),
                "g.bn.running_mean": as_numpy(bn.running_mean, np.float64),
                "g.bn.running_var": as_numpy(bn.running_var, np.float64), "g.bn.eps": np.array([bn.eps])}

    def scored_features(self, features: np.ndarray) -> np.ndarray:
        return _norm64(features)

    @property
    def trained_head(self) -> LinearHead:
        self._check_fitted()
        weight = _norm64(self.extra["h.weight"])
        return LinearHead(weight, np.zeros(len(weight)))

    def closed_logits(self, features: np.ndarray) -> np.ndarray:
        return self.trained_head(features)

    def g_score(self, features: np.ndarray) -> np.ndarray:
        """g(x) in eval mode (batch norm with its running statistics) on raw float64 features."""
        e = self.extra
        u = features @ e["g.weight"][0] + e["g.bias"][0]
        u = (u - e["g.bn.running_mean"][0]) / np.sqrt(e["g.bn.running_var"][0] + e["g.bn.eps"][0]) * e["g.bn.weight"][0] + e["g.bn.bias"][0]
        return 1.0 / (1.0 + np.exp(-u))

    def _score(self, batch) -> np.ndarray:
        if self.params["score_rule"] == "g":
            self._check_fitted()
            batch.require("features", who=self.name)
            return self.g_score(np.asarray(batch.features, dtype=np.float64))
        return softmax64(self.transform(batch).logits).max(1)
