"""Generalized ODIN (Hsu et al., CVPR 2020), decomposed confidence, as in OpenOOD v1.5 / Open-Insects (`godin_net`).

On penultimate features h: numerators h_k(x) = cos(h, w_k) (cosine similarity: both L2-normalised with +1e-4 on the
norm, no bias; w initialised Kaiming-normal), denominator g(x) = sigmoid(BN(v . h + c)) (a 1-unit linear layer,
BatchNorm1d, sigmoid). Training: CE(h(x) / g(x), y); h trains without weight decay (its own parameter group,
`h_optimizer: no_decay`). The reference trainer (`godin_trainer.py`) puts h.weight in the decayed AdamW over all
parameters and again in a weight-decay-0 `h_optimizer`, so h takes two Adam steps per batch (`h_optimizer: both`,
protocol `open-insects`): both optimisers see the same gradients, so their moments agree and the second step is
lr * m_hat / (sqrt(v_hat) + eps) from the first one's state; its lr stays the base lr (the reference's `h_scheduler`
wraps the other optimiser). Its `scheduler.step()` without the epoch timm requires would stop the published trainer;
the main optimiser follows the protocol's schedule here.
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

from detectors.base import LinearHead, as_numpy
from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch

NORM_EPS = 1e-4


def _normalise(x: torch.Tensor) -> torch.Tensor:
    return x / (x.norm(p=2, dim=1, keepdim=True) + NORM_EPS)


class GODINLoss(Objective):
    replaces_head = True

    def __init__(self, h_optimizer: str = "no_decay") -> None:
        super().__init__()
        self.h_optimizer = h_optimizer
        self.h: nn.Linear | None = None
        self.g: nn.Sequential | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.h = nn.Linear(feature_dim, num_classes, bias=False)
        nn.init.kaiming_normal_(self.h.weight, nonlinearity="relu")
        self.g = nn.Sequential(nn.Linear(feature_dim, 1), nn.BatchNorm1d(1), nn.Sigmoid())

    def no_decay_parameters(self) -> list[nn.Parameter]:
        return [] if self.h_optimizer == "both" else list(self.h.parameters())

    def twice_stepped_parameters(self) -> list[nn.Parameter]:
        return list(self.h.parameters()) if self.h_optimizer == "both" else []

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

    label = "G-ODIN"
    paper = ("Hsu et al., Generalized ODIN: Detecting Out-of-distribution Image without Learning from OOD Data, CVPR "
             "2020")

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        score_rule: Literal["h", "g"] = param("h", "how the trained model scores")
        h_optimizer: Literal["no_decay", "both"] = param(
            "no_decay", "h without weight decay, or as the reference: in the decayed AdamW and a weight-decay-0 one")

    search_space = {"score_rule": ["h", "g"]}

    def objective(self) -> Objective:
        return GODINLoss(self.params["h_optimizer"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        linear, bn = objective.g[0], objective.g[1]
        return {"h.weight": as_numpy(objective.h.weight, np.float64),
                "g.weight": as_numpy(linear.weight, np.float64), "g.bias": as_numpy(linear.bias, np.float64),
                "g.bn.weight": as_numpy(bn.weight, np.float64), "g.bn.bias": as_numpy(bn.bias, np.float64),
                "g.bn.running_mean": as_numpy(bn.running_mean, np.float64),
                "g.bn.running_var": as_numpy(bn.running_var, np.float64), "g.bn.eps": np.array([bn.eps])}

    released_network = "godin_net"

    def released_arrays(self, parts: dict) -> dict[str, np.ndarray]:
        """godin_net's cosine `h.h` and its g = Sequential(Linear `g.0`, BatchNorm1d `g.1` (eps 1e-5), Sigmoid)."""
        made = parts["network"]
        h, g, bn = made.head("h.h"), made.head("g.0"), made.head("g.1")
        arrays = {"h.weight": h["weight"], "g.weight": g["weight"], "g.bias": g["bias"], "g.bn.weight": bn["weight"],
                  "g.bn.bias": bn["bias"], "g.bn.running_mean": bn["running_mean"],
                  "g.bn.running_var": bn["running_var"]}
        return {**{k: as_numpy(v, np.float64) for k, v in arrays.items()},
                "g.bn.eps": np.array([nn.BatchNorm1d(1).eps])}

    def released_head(self, parts: dict) -> tuple[torch.Tensor, torch.Tensor]:
        """No linear head: the run classifier's head becomes the normalised h (its argmax is the cosine head's)."""
        weight = torch.from_numpy(_norm64(self.extra["h.weight"])).float()
        return weight, torch.zeros(len(weight))

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
        u = ((u - e["g.bn.running_mean"][0]) / np.sqrt(e["g.bn.running_var"][0] + e["g.bn.eps"][0])
             * e["g.bn.weight"][0] + e["g.bn.bias"][0])
        return 1.0 / (1.0 + np.exp(-u))

    def _score(self, batch) -> np.ndarray:
        if self.params["score_rule"] == "g":
            self._check_fitted()
            batch.require("features", who=self.name)
            return self.g_score(np.asarray(batch.features, dtype=np.float64))
        return softmax64(self.transform(batch).logits).max(1)
