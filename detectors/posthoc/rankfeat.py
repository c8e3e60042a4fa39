"""RankFeat (Song et al., NeurIPS 2022): remove the rank-1 component of the last blocks' feature maps, then energy.

As OpenOOD v1.5 implements it (openood/postprocessors/rankfeat_postprocessor.py, the version Open-Insects runs): each
image's block-4 map X [C, HW] loses s1 u1 v1^T (its top singular triple) and goes through average pooling and the head
(logits1); the block-3 map loses its own rank-1 part, then runs through block 4, pooling and the head (logits2); the
score is the energy T logsumexp(((logits1 + logits2) / 2) / T), T = 1. `blocks="4"` (or "3") keeps one branch only.
`power_iteration=True` replaces the SVD by OpenOOD's 20-step power iteration from a random start (its `accelerate`
option; seeded here).

Needs a transformers ResNet-style classifier (`base_model.encoder.stages`, `pooler`, a linear head) or a module with
torchvision's names (`layer4`, `avgpool`, `hidden_states`: OpenOOD's ResNet18_32x32): "block 4" is the last stage,
"block 3" the one before.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch

from detectors.base import Detector, as_numpy
from detectors.posthoc.common import logsumexp
from detectors.posthoc.pixels import eval_mode, pixel_batches
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress


def remove_rank1(feature_map: torch.Tensor) -> torch.Tensor:
    """X - s1 u1 v1^T for each map of a [B,C,H,W] batch (maps flattened to [C, HW]), by SVD."""
    b, c, h, w = feature_map.shape
    x = feature_map.reshape(b, c, h * w)
    u, s, vh = torch.linalg.svd(x, full_matrices=False)
    return (x - s[:, 0:1, None] * u[:, :, 0:1].bmm(vh[:, 0:1, :])).reshape(b, c, h, w)


def remove_rank1_power(feature_map: torch.Tensor, iterations: int = 20, seed: int = 0) -> torch.Tensor:
    """The same with OpenOOD's power iteration: u, v from one random start shared by the batch, `iterations` steps."""
    b, c, h, w = feature_map.shape
    x = feature_map.reshape(b, c, h * w)
    gen = torch.Generator().manual_seed(seed)
    u = torch.randn(1, 1, c, generator=gen).repeat(b, 1, 1).to(x)
    v = torch.randn(1, h * w, 1, generator=gen).repeat(b, 1, 1).to(x)

    def unit(t: torch.Tensor) -> torch.Tensor:
        return t / (torch.norm(t, dim=2, keepdim=True) + 1e-10)

    for _ in range(iterations):
        v = unit(u.bmm(x)).transpose(1, 2)
        u = unit(x.bmm(v).transpose(1, 2))
    sigma = u.bmm(x).bmm(v)
    return (x - sigma * u.transpose(1, 2).bmm(v.transpose(1, 2))).reshape(b, c, h, w)


def resnet_parts(classifier: Any) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(last stage, pooler) of a transformers ResNet-style classifier, or of a module with torchvision's names
    (`layer4`, `avgpool`: OpenOOD's ResNet18_32x32, `pipelines.resnet18_32x32`)."""
    model = getattr(classifier, "model", None)
    if isinstance(getattr(model, "layer4", None), torch.nn.Module) and hasattr(model, "avgpool"):
        return model.layer4, model.avgpool
    base = getattr(model, "base_model", None)
    stages = getattr(getattr(base, "encoder", None), "stages", None)
    if stages is None or len(stages) < 2 or getattr(base, "pooler", None) is None:
        raise TypeError("rankfeat needs a transformers ResNet-style classifier (base_model.encoder.stages, pooler)")
    return stages[-1], base.pooler


@register_detector("rankfeat")
class RankFeat(Detector):
    """s(x) = T logsumexp(mean of the rank-1-removed branches' logits / T). Needs the classifier and images."""

    label = "RankFeat"
    reference_code = "OpenOOD openood/postprocessors/rankfeat_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = "Song et al., RankFeat: Rank-1 Feature Removal for Out-of-distribution Detection, NeurIPS 2022"

    @dataclass(frozen=True)
    class Params(Params):
        temperature: float = param(1.0, "energy temperature T", gt=0)
        blocks: Literal["3", "4", "3+4"] = param("3+4", "stages whose rank-1 component is removed (branches averaged)")
        power_iteration: bool = param(False, "power iteration instead of an exact SVD")
        iterations: int = param(20, "power iterations", ge=1)

    needs = frozenset({"classifier"})

    def __init__(self, classifier: Any = None, batch_size: int = 32, **params: Any) -> None:
        super().__init__(**params)
        self.classifier, self.batch_size = classifier, int(batch_size)

    def _remove(self, feature_map: torch.Tensor) -> torch.Tensor:
        if self.params["power_iteration"]:
            return remove_rank1_power(feature_map, int(self.params["iterations"]))
        return remove_rank1(feature_map)

    @torch.no_grad()
    def block_logits(self, x: torch.Tensor) -> np.ndarray:
        """float64 logits [B,K] of the branches kept by `blocks`, averaged."""
        clf = self.classifier
        last_stage, pooler = resnet_parts(clf)
        _, hidden = clf.hidden_maps(x)
        branches = []
        if "4" in self.params["blocks"]:
            branches.append(self._remove(hidden[-1]))
        if "3" in self.params["blocks"]:
            branches.append(last_stage(self._remove(hidden[-2])))
        logits = [as_numpy(clf.head(pooler(m).flatten(1)), np.float64) for m in branches]
        return sum(logits) / len(logits)

    def _score(self, batch: Any) -> np.ndarray:
        if self.classifier is None:
            raise ValueError("rankfeat needs the classifier: build('rankfeat', classifier=ImageClassifier...)")
        temperature = float(self.params["temperature"])
        chunks, total = pixel_batches(self.classifier, batch, self.batch_size, self.name)
        with eval_mode(self.classifier):
            parts = [temperature * logsumexp(self.block_logits(x) / temperature, axis=1)
                     for x in progress(chunks, total=total, desc="rankfeat", leave=False, disable=total < 2)]
        return np.concatenate(parts) if parts else np.zeros(0)
