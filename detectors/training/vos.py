"""VOS (Du et al., ICLR 2022): virtual outliers sampled from class-conditional Gaussians of the penultimate features,
an energy-based uncertainty loss separating ID rows from them; scored by the energy of the trained classifier.

OpenOOD `openood/trainers/vos_trainer.py` (at 3c35632), step by step (`:61-152`): a queue of `sample_number`
penultimate features per class fills first (rows of a full class are dropped, `:137-145`; no uncertainty loss yet);
once every queue is full, each step rolls the batch's rows in (`:75-82`), fits class means and one tied covariance
X^T X / N + 1e-4 I over the class-centred queues (`:83-97`), draws `sample_from` points of each class's Gaussian and
keeps the `select` of lowest density (`:98-111`, torch's global generator), and adds `loss_weight` times the
cross-entropy of a logistic regression (Linear(1, 2)) telling the batch's energies (label 1) from the virtual outliers'
(the classifier's head on them, label 0) (`:112-136`). Its energy (`log_sum_exp`, `:162-186`) weighs exp(z - max)
by relu of a freshly initialised Linear(C, 1) at every call, floors it at -1 and rebuilds it as a new tensor: the
uncertainty loss trains the logistic regression only (no gradient reaches the network), as here. Loss = CE(ID) +
loss_weight * that (`:147-148`). Defaults: `configs/pipelines/train/train_vos.yml` (sample_number 1000, sample_from
10000, select 1, loss_weight 0.1, start_epoch 0: sampling from the first full queue on). Score:
`scripts/ood/vos/*_test_vos.sh` evaluate with `ebo` (`configs/postprocessors/ebo.yml`: temperature 1), logsumexp of the
closed-set logits.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions.multivariate_normal import MultivariateNormal

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, logsumexp64, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def weighted_energy(logits: torch.Tensor) -> torch.Tensor:
    """`vos_trainer.py:162-186` with `dim=1`: max + log sum relu(w) exp(z - max), w of a new nn.Linear(C, 1) (torch's
    global generator), floored at -1, returned without gradient."""
    weight = nn.Linear(logits.shape[1], 1).to(logits.device).weight
    top = logits.max(dim=1, keepdim=True).values
    out = top.squeeze(1) + torch.log(torch.sum(F.relu(weight) * torch.exp(logits - top), dim=1))
    return out.detach().clamp(min=-1.0)


class VOSLoss(Objective):
    """CE + loss_weight * the uncertainty loss on the queues' virtual outliers (`vos_trainer.py:61-152`)."""

    def __init__(self, sample_number: int = 1000, sample_from: int = 10000, select: int = 1,
                 loss_weight: float = 0.1):
        super().__init__()
        if select > sample_from:
            raise ValueError(f"vos: select={select} of sample_from={sample_from} draws: select at most sample_from")
        self.sample_number, self.sample_from, self.select = int(sample_number), int(sample_from), int(select)
        self.loss_weight = float(loss_weight)
        self._head: list[nn.Linear] = []
        self.last_terms: dict[str, float] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.logistic_regression = nn.Linear(1, 2)
        self.register_buffer("queue", torch.zeros(num_classes, self.sample_number, feature_dim))
        self.register_buffer("counts", torch.zeros(num_classes, dtype=torch.long))

    def bind_head(self, head: nn.Linear) -> None:
        self._head = [head]  # kept out of the registered submodules: the head is the model's

    def virtual_outliers(self) -> torch.Tensor:
        """`vos_trainer.py:83-111`: per class, the `select` lowest-density of `sample_from` Gaussian draws."""
        means = self.queue.mean(1)
        centred = (self.queue - means[:, None]).reshape(-1, self.queue.shape[2])
        covariance = centred.T @ centred / len(centred)
        covariance = covariance + 0.0001 * torch.eye(self.queue.shape[2], device=covariance.device)
        picked = []
        for c in range(len(means)):
            gaussian = MultivariateNormal(loc=means[c], covariance_matrix=covariance)
            draws = gaussian.rsample((self.sample_from,))
            picked.append(draws[torch.topk(-gaussian.log_prob(draws), self.select)[1]])
        return torch.cat(picked)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z, h = logits.float(), features.float().detach()
        ce = F.cross_entropy(z, batch.y)
        reg = z.new_zeros(())
        full = bool((self.counts == self.sample_number).all())
        if full:
            for row, c in enumerate(batch.y.tolist()):
                self.queue[c] = torch.cat([self.queue[c][1:], h[row:row + 1]])
            outliers = self.virtual_outliers()
            energy_id = weighted_energy(z)
            energy_ood = weighted_energy(self._head[0](outliers).float())
            scores = torch.cat([energy_id, energy_ood]).view(-1, 1)
            targets = torch.cat([torch.ones(len(energy_id)), torch.zeros(len(energy_ood))]).long().to(z.device)
            reg = F.cross_entropy(self.logistic_regression(scores), targets)
        else:
            for row, c in enumerate(batch.y.tolist()):
                if self.counts[c] < self.sample_number:
                    self.queue[c, self.counts[c]] = h[row]
                    self.counts[c] += 1
        self.last_terms = {"ce": float(ce.detach()), "reg": float(reg.detach())}
        return ce + self.loss_weight * reg


@register_detector("vos")
class VOS(TrainedDetector):
    """Train with VOS' virtual-outlier regularisation; score with the energy (`ebo`) of the trained head."""

    label = "VOS"
    paper = "Du et al., VOS: Learning What You Don't Know by Virtual Outlier Synthesis, ICLR 2022"
    reference_code = "OpenOOD openood/trainers/vos_trainer.py"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        sample_number: int = param(1000, "queued penultimate features per class (train_vos.yml:15)", ge=1)
        sample_from: int = param(10000, "Gaussian draws per class and step (train_vos.yml:16)", ge=1)
        select: int = param(1, "lowest-density draws kept per class (train_vos.yml:17)", ge=1)
        loss_weight: float = param(0.1, "weight of the uncertainty loss (train_vos.yml:26)", ge=0)
        score_rule: Literal["ebo", "msp"] = param("ebo", "how the trained model scores (ebo: vos test scripts)")

    def objective(self) -> Objective:
        p = self.params
        return VOSLoss(p["sample_number"], p["sample_from"], p["select"], p["loss_weight"])

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        if self.params["score_rule"] == "msp":
            return softmax64(logits).max(1)
        return logsumexp64(logits)
