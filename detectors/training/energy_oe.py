"""Energy-bounded Outlier Exposure (Liu et al., NeurIPS 2020): squared hinge on the energies of ID and auxiliary data.

E(x) = -logsumexp(z). Loss = CE(ID) + lam * (mean relu(E_in - m_in)^2 + mean relu(m_out - E_out)^2), lam 0.1.
Margins: `margins="data"` (default, the Open-Insects recipe) sets m_in / m_out to the mean energy of the starting
model on the whole ID-train / auxiliary sets, once before training; `margins="fixed"` uses m_in / m_out as given
(the paper's CIFAR values -25 / -7 by default). Score: negative energy.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector, logsumexp64, softmax64
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


class EnergyOELoss(Objective):
    uses_aux = True

    def __init__(self, lam: float = 0.1, m_in: float = -25.0, m_out: float = -7.0, margins: str = "data"):
        super().__init__()
        if margins not in ("fixed", "data"):
            raise ValueError(f"margins must be 'fixed' or 'data', got {margins!r}")
        self.lam, self.m_in, self.m_out = float(lam), float(m_in), float(m_out)
        self.needs_calibration = margins == "data"

    def calibrate(self, id_logits: torch.Tensor, aux_logits: torch.Tensor | None) -> None:
        self.m_in = float((-torch.logsumexp(id_logits.double(), dim=1)).mean())
        if aux_logits is not None:
            self.m_out = float((-torch.logsumexp(aux_logits.double(), dim=1)).mean())

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        z_in, z_out = z[: batch.n_id], z[batch.n_id:]
        loss = F.cross_entropy(z_in, batch.y)
        if len(z_out):
            e_in, e_out = -torch.logsumexp(z_in, dim=1), -torch.logsumexp(z_out, dim=1)
            loss = loss + self.lam * (F.relu(e_in - self.m_in).pow(2).mean() + F.relu(self.m_out - e_out).pow(2).mean())
        return loss


@register_detector("energy_oe")
class EnergyOE(TrainedDetector):
    """Train with the energy-bounded OE loss; score = -energy = logsumexp(z) (or MSP)."""

    label = "Energy"
    paper = "Liu et al., Energy-based Out-of-distribution Detection, NeurIPS 2020"

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        lam: float = param(0.1, "weight of the energy margin loss", ge=0)
        m_in: float = param(-25.0, "ID energy margin")
        m_out: float = param(-7.0, "OOD energy margin")
        margins: Literal["fixed", "data"] = param("data", "fixed margins, or calibrated on the data")
        score_rule: Literal["energy", "msp"] = param("energy", "how the trained model scores")

    search_space = {"lam": [0.01, 0.1, 0.5]}

    def objective(self) -> Objective:
        p = self.params
        return EnergyOELoss(p["lam"], p["m_in"], p["m_out"], p["margins"])

    def _score_logits(self, logits: np.ndarray, features: np.ndarray) -> np.ndarray:
        return logsumexp64(logits) if self.params["score_rule"] == "energy" else softmax64(logits).max(1)
