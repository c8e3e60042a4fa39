"""RotPred (Hendrycks et al., NeurIPS 2019, "Using Self-Supervised Learning Can Improve Model Robustness and
Uncertainty"), as in OpenOOD v1.5 / Open-Insects (`rot_net` + `rotpred` trainer and post-processor).

Training (images only: rotations of feature vectors mean nothing, so there is no heads-only mode): each batch x is
run once as [x, rot90(x), rot180(x), rot270(x)]; a 4-way rotation head on the penultimate features learns which.
loss = CE(closed head on the unrotated rows, y) + CE(rotation head on all 4B rows, rotation index).
Fine-tuned with batch 256 (the Open-Insects recipe for RotPred; the 4 rotations make 1024 rows a step).
Score ("rotpred", needs the images and the fine-tuned classifier): with p = softmax(closed logits of x) and q_r =
softmax(rotation logits of rot_r(x)), s = KL(uniform || p) - mean_r KL(onehot_r || q_r) = KL(uniform || p) + mean_r
log2 q_r[r], KL in bits (log2) as the post-processor computes it; higher = more ID. "msp": MSP of the fine-tuned
closed head (on images, or on a FeatureSet of the fine-tuned model).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.base import ImageSet, as_numpy
from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, apply_linear, linear_arrays, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def rotations(x: torch.Tensor) -> torch.Tensor:
    """[4B,...]: x, then x rotated by 90, 180 and 270 degrees (in the image plane)."""
    if x.dim() != 4:
        raise ValueError("RotPred trains on images [B,C,H,W]; it has no heads-only mode (fit on images with a "
                         "classifier)")
    return torch.cat([torch.rot90(x, k, dims=(2, 3)) for k in range(4)])


def rotation_targets(n: int, device: Any = None) -> torch.Tensor:
    return torch.arange(4, device=device).repeat_interleave(n)


class RotPredLoss(Objective):
    def __init__(self) -> None:
        super().__init__()
        self.rot_head: nn.Linear | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.rot_head = nn.Linear(feature_dim, 4)

    def inputs(self, batch: TrainBatch) -> torch.Tensor:
        return rotations(batch.x)

    def heads(self, logits: torch.Tensor, features: torch.Tensor) -> dict[str, torch.Tensor]:
        return {"label": logits}

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        n = batch.n_id
        loss_cls = F.cross_entropy(logits[:n].float(), batch.y)
        loss_rot = F.cross_entropy(self.rot_head(features).float(), rotation_targets(n, features.device))
        return loss_cls + loss_rot


def rotpred_score(logits: np.ndarray, rot_logits: np.ndarray) -> np.ndarray:
    """KL(uniform || softmax(logits)) - mean_r KL(onehot_r || softmax(rot_logits_r)), in bits; `logits` [N,C] of the
    unrotated images, `rot_logits` [4,N,4] of the four rotations."""
    c = logits.shape[1]
    p = softmax64(logits)
    cls = (np.log2(1.0 / c) - np.log2(p)).sum(1) / c
    rot = np.stack([-np.log2(softmax64(rot_logits[r])[:, r]) for r in range(4)])
    return cls - rot.mean(0)


@register_detector("rotpred")
class RotPred(TrainedDetector):
    """Rotation prediction as an auxiliary task; score from the class and rotation heads on rotated images."""

    label = "RotPred"
    paper = ("Hendrycks et al., Using Self-Supervised Learning Can Improve Model Robustness and Uncertainty, NeurIPS "
             "2019")

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        score_rule: Literal["rotpred", "msp"] = param("rotpred", "how the trained model scores")
        mode: Literal["full"] = param("full", "rotating needs images: full mode only")
        batch_size: int = param(256, "global batch size (split across processes; Open-Insects' RotPred: 256)",
                                ge=1)

    def objective(self) -> Objective:
        return RotPredLoss()

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        return linear_arrays(objective.rot_head, "rot")

    released_network = "rot_net"

    def released_arrays(self, parts: dict) -> dict[str, np.ndarray]:
        """rot_net's `rot_fc` is the rotation head."""
        from detectors.training.released import linear

        return linear(parts["network"], "rot_fc", "rot")

    @torch.no_grad()
    def _score(self, batch: Any) -> np.ndarray:
        self._check_fitted()
        if self.params["score_rule"] == "msp":
            return softmax64(self.transform(batch).logits).max(1)
        if not isinstance(batch, ImageSet):
            raise TypeError("rotpred scores images (an ImageSet) with the fine-tuned classifier; "
                            "score_rule='msp' scores cached features")
        if self.classifier is None:
            raise ValueError("rotpred needs the fine-tuned classifier to score images: build('rotpred', "
                             "classifier=...)")
        self.classifier.eval()
        device = self.classifier.device
        out = []
        for _, images in batch.batches(self.params["score_batch_size"]):
            x = self.classifier.preprocess(images).to(device)
            logits, features = self.classifier(rotations(x))
            logits = as_numpy(logits, np.float64)
            rot = apply_linear(self.extra, "rot", as_numpy(features, np.float64)).reshape(4, len(images), 4)
            out.append(rotpred_score(logits[: len(images)], rot))
        return np.concatenate(out)
