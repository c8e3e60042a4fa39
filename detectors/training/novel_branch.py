"""NovelBranch (Open-Insects baseline): a second head trained on ID and auxiliary samples together.

Extended (extended.py) shares the loss and the scores defined here.

NovelBranch's second head has C+1 classes (every auxiliary sample is the one "novel" class C); Extended's has C+A
classes (each of the A auxiliary species is its own class). Loss = mean of CE(second head, all samples) and
CE(closed head, ID samples) (only the first term when a batch has no ID sample), as in the Open-Insects trainer. ID and
auxiliary rows come from one pooled, shuffled loader (`pooled=True`, the recipe: batches of `batch_size` mixed rows,
an epoch covers both sets); `pooled=False` draws an ID batch of `batch_size` plus an aux batch in proportion to the
set sizes each step (an epoch covers the ID set). Scores (`score_rule`):
"msp" on the closed head (default), or "novel": NovelBranch -logit_novel (the official postprocessor), Extended
-logsumexp over the A auxiliary logits (the same quantity when the A classes are merged into one).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, apply_linear, linear_arrays, logsumexp64, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


class BranchLoss(Objective):
    """Closed head + second head over C + (1 or A) classes; `per_species` selects Extended (A classes)."""

    uses_aux = True
    aux_batch_ratio = None

    def __init__(self, per_species: bool, pooled: bool = True):
        super().__init__()
        self.per_species, self.pooled = per_species, bool(pooled)
        self.num_classes = 0
        self.branch: nn.Linear | None = None

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        if self.per_species and num_aux_classes < 1:
            raise ValueError("Extended needs auxiliary class indices (aux labels >= 0, e.g. aux_label_field='species')")
        self.num_classes = num_classes
        self.branch = nn.Linear(feature_dim, num_classes + (num_aux_classes if self.per_species else 1))

    def second_targets(self, batch: TrainBatch) -> torch.Tensor:
        """ID samples keep their class; aux samples map to C (NovelBranch) or C + aux index (Extended)."""
        if batch.aux_y is None:
            return batch.y
        if self.per_species:
            if (batch.aux_y < 0).any():
                raise ValueError("Extended got auxiliary samples without an auxiliary class index (-1)")
            aux_t = self.num_classes + batch.aux_y
        else:
            aux_t = torch.full_like(batch.aux_y, self.num_classes)
        return torch.cat([batch.y, aux_t])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        loss_all = F.cross_entropy(self.branch(features).float(), self.second_targets(batch))
        if batch.n_id == 0:
            return loss_all
        return 0.5 * (F.cross_entropy(logits[: batch.n_id].float(), batch.y) + loss_all)


class BranchDetector(TrainedDetector):
    """Shared by NovelBranch and Extended: the second head is `branch`; `per_species` selects Extended."""

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        score_rule: Literal["msp", "novel"] = param("msp", "how the trained model scores")
        pooled: bool = param(True, "one pooled novel class (False: one per branch level)")

    search_space = {"score_rule": ["msp", "novel"]}
    per_species = False

    def objective(self) -> Objective:
        return BranchLoss(self.per_species, self.params["pooled"])

    def export(self, objective: Objective) -> dict[str, np.ndarray]:
        return linear_arrays(objective.branch, "branch")

    released_network = "extended_net"

    def released_arrays(self, parts: dict) -> dict[str, np.ndarray]:
        """extended_net's `fc_extended` is the second head: C+1 classes (NovelBranch) or C+A (Extended)."""
        from detectors.training.released import linear

        made = parts["network"]
        closed, second = made.num_classes, int(made.head("fc_extended")["weight"].shape[0])
        if not self.per_species and second != closed + 1:
            raise made.fail(f"fc_extended has {second} classes where NovelBranch's has the {closed} closed-set ones + "
                            "1 (novel); an Extended file (C+A) loads as `extended`")
        return linear(made, "fc_extended", "branch")

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        second = apply_linear(self.extra, "branch", features)
        novel = second[:, logits.shape[1]:]
        return -novel[:, 0] if not self.per_species else -logsumexp64(novel)

    @property
    def branch_size(self) -> int:
        """Number of classes of the second head (C+1 or C+A) once fitted."""
        return int(self.extra["branch.weight"].shape[0])


@register_detector("novel_branch")
class NovelBranch(BranchDetector):
    label = "NovelBranch"
    paper = "Chen et al., Open-Insects: a benchmark for open-set recognition of insects (NovelBranch baseline)"
