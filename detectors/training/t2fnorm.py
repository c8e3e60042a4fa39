"""T2FNorm (Regmi et al., CVPR Workshops 2024) as OpenOOD v1.5 trains and scores it: the classifier's head is trained
on L2-normalised penultimate features divided by a temperature tau; at OOD inference the head reads the features
divided by tau WITHOUT the normalisation, and the score is the MSP of those logits.

Reference: OpenOOD `openood/networks/t2fnorm_net.py:18-22` (training forward: fc(normalize(h) / tau), `F.normalize`'s
eps 1e-12), `:24-31` (OOD inference: fc(h / tau), but fc(h) when the network has 1000 classes: "Imagenet-1k experiment
is not trained from scratch"), `openood/trainers/t2fnorm_trainer.py:9-13` (the base trainer's cross-entropy,
`openood/trainers/base_trainer.py:57-58`, with the network's tau set), `configs/pipelines/train/train_t2fnorm.yml:20-22`
(tau 0.1), `openood/postprocessors/t2fnorm_postprocessor.py:13-18` (MSP of the inference logits,
`configs/postprocessors/t2fnorm.yml`). ID-val accuracy during training is read from the training forward, as
OpenOOD's evaluator calls the network. `transform` hands post-hoc rules the inference features (h / tau, or h) with
the trained head.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, TrainBatch
from pipelines.training.objectives import PRIMARY

IMAGENET_CLASSES = 1000  # t2fnorm_net.py:28: a 1000-class network scores fc(h) (no division by tau)


class T2FNormLoss(Objective):
    """CE(fc(normalize(h) / tau), y): the model's own head on the normalised, tau-scaled features."""

    def __init__(self, tau: float = 0.1):
        super().__init__()
        self.tau = float(tau)
        self._head: list[nn.Linear] = []  # a list: the model's head, not registered twice

    def bind_head(self, head: nn.Linear) -> None:
        self._head = [head]

    def training_logits(self, features: torch.Tensor) -> torch.Tensor:
        if not self._head:
            raise RuntimeError("T2FNormLoss needs the model's head: bind_head(head) before training")
        return self._head[0](F.normalize(features, dim=-1) / self.tau)

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {PRIMARY: self.training_logits(features)}

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        return F.cross_entropy(self.training_logits(features[: batch.n_id]).float(), batch.y)


@register_detector("t2fnorm")
class T2FNorm(TrainedDetector):
    """Train the head on normalised features / tau; score with the MSP of fc(h / tau) (OpenOOD's t2fnorm rule)."""

    label = "T2FNorm"
    paper = ("Regmi et al., T2FNorm: Train-time Feature Normalization for OOD Detection in Image Classification, "
             "CVPR Workshops 2024")
    reference_code = "Jingkang50/OpenOOD openood/networks/t2fnorm_net.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        tau: float = param(0.1, "feature temperature", gt=0)
        inference_scale: Literal["auto", "tau", "none"] = param(
            "auto", "OOD-inference features: h / tau (`tau`), h (`none`), or as the reference: h / tau unless the "
                    "network has 1000 classes (`auto`)")

    def objective(self) -> Objective:
        return T2FNormLoss(self.params["tau"])

    def scored_features(self, features: np.ndarray) -> np.ndarray:
        """h / tau, or h (`inference_scale`; `auto`: h for a 1000-class head, t2fnorm_net.py:28-30)."""
        rule = self.params["inference_scale"]
        if rule == "auto":
            rule = "none" if len(self.head.bias) == IMAGENET_CLASSES else "tau"
        return features / self.params["tau"] if rule == "tau" else features
