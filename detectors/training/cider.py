"""CIDER (Ming et al., ICLR 2023): compactness and dispersion losses on hyperspherical embeddings with class prototypes
updated by EMA; scored by KNN on the trained backbone's normalised features.

OpenOOD `openood/trainers/cider_trainer.py` (at 3c35632): prototypes start as the normalised class means of the
untrained embeddings (`:237-258`; there over the ID val loader, here over the ID-train rows, the loop's pass); each
step first moves the prototype of every row's class, row by row in batch order, to normalise(m p + (1 - m) z)
(`:209-217`; the dispersion loss is taken on these updated prototypes, with the gradient through z, and the stored
ones are detached), then dispersion = T / T_b * mean_c log(mean_{c' != c} exp(p_c . p_c' / T)) (`:218-235`, T_b 0.1)
and compactness = -T / 0.07 * mean_i log softmax_c(z_i . p_c / T)[y_i] on the stored, renormalised prototypes
(`:152-183`); loss = w * compactness + dispersion (`:96-100`). Defaults: `configs/pipelines/train/train_cider.yml:22-24`
(proto_m 0.95, temp 0.1, w 2), `configs/networks/cider_net.yml:8-9` (feat_dim 128, mlp head). Score:
`openood/postprocessors/cider_postprocessor.py:21-53`, minus the squared L2 distance (faiss IndexFlatL2) to the K-th
nearest normalised ID-train feature, `configs/postprocessors/cider.yml:5-7` (K 50, sweep 50 ... 1000).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.embedding import EmbeddingDetector, embed, projection_head
from pipelines.params import param
from pipelines.training import Objective, Pass, TrainBatch


def compactness_loss(z: torch.Tensor, prototypes: torch.Tensor, labels: torch.Tensor, temperature: float,
                     base_temperature: float = 0.07) -> torch.Tensor:
    """CompLoss (`cider_trainer.py:152-183`): -T / T_b * mean_i log softmax(z_i . normalise(p) / T)[y_i]."""
    logits = z @ F.normalize(prototypes, dim=1).T / temperature
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    log_prob = logits - torch.log(torch.exp(logits).sum(1, keepdim=True))
    return -(temperature / base_temperature) * log_prob.gather(1, labels.view(-1, 1)).mean()


def ema_prototypes(prototypes: torch.Tensor, z: torch.Tensor, labels: torch.Tensor, momentum: float) -> torch.Tensor:
    """DisLoss' update (`cider_trainer.py:210-216`): row by row in batch order, p_y <- normalise(m p_y + (1 - m) z)."""
    rows = list(prototypes.unbind(0))
    for j, c in enumerate(labels.tolist()):
        rows[c] = F.normalize(rows[c] * momentum + z[j] * (1 - momentum), dim=0)
    return torch.stack(rows)


def dispersion_loss(prototypes: torch.Tensor, temperature: float, base_temperature: float = 0.1) -> torch.Tensor:
    """DisLoss (`cider_trainer.py:218-235`): T / T_b * mean_c log(mean_{c' != c} exp(p_c . p_c' / T)), NaN rows dropped;
    0 with a single class (the reference: the mean of nothing, NaN)."""
    n = len(prototypes)
    if n < 2:
        return prototypes.sum() * 0.0
    others = 1.0 - torch.eye(n, device=prototypes.device, dtype=prototypes.dtype)
    mean_prob_neg = torch.log((others * torch.exp(prototypes @ prototypes.T / temperature)).sum(1) / others.sum(1))
    mean_prob_neg = mean_prob_neg[~torch.isnan(mean_prob_neg)]
    return temperature / base_temperature * mean_prob_neg.mean()


class CIDERLoss(Objective):
    """w * compactness + dispersion on the projected ID rows; the prototypes are a buffer (checkpointed)."""

    replaces_head = True
    needs_calibration = True

    def __init__(self, proto_m: float = 0.95, temp: float = 0.1, w: float = 2.0, feat_dim: int = 128,
                 head: str = "mlp"):
        super().__init__()
        self.proto_m, self.temp, self.w = float(proto_m), float(temp), float(w)
        self.feat_dim, self.head = int(feat_dim), head
        self.last_terms: dict[str, float] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.projection = projection_head(feature_dim, self.feat_dim, self.head)
        self.register_buffer("prototypes", torch.zeros(num_classes, self.feat_dim))

    @torch.no_grad()
    def calibrate_pass(self, id_pass: Pass, aux_pass: Pass | None) -> None:
        """Prototypes = normalised class means of the untrained embeddings (`cider_trainer.py:237-258`); a class
        without rows keeps a zero prototype (the reference: 0/0)."""
        device = self.prototypes.device
        z = embed(self.projection, id_pass.features.to(device))
        labels = id_pass.labels.to(device)
        sums = torch.zeros_like(self.prototypes).index_add_(0, labels, z)
        counts = torch.bincount(labels, minlength=len(self.prototypes)).clamp(min=1).to(z.dtype)
        self.prototypes = F.normalize(sums / counts[:, None], dim=1)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = embed(self.projection, features[: batch.n_id])
        updated = ema_prototypes(self.prototypes, z, batch.y, self.proto_m)
        dis = dispersion_loss(updated, self.temp)
        self.prototypes = updated.detach()
        comp = compactness_loss(z, self.prototypes, batch.y, self.temp)
        self.last_terms = {"comp": float(comp.detach()), "dis": float(dis.detach())}
        return self.w * comp + dis


@register_detector("cider")
class CIDER(EmbeddingDetector):
    """Train the backbone with CIDER's losses through a projection head; score = -(squared distance to the K-th
    nearest normalised ID-train feature)."""

    label = "CIDER"
    paper = ("Ming et al., How to Exploit Hyperspherical Embeddings for Out-of-Distribution Detection?, ICLR 2023")
    reference_code = "OpenOOD openood/trainers/cider_trainer.py, openood/postprocessors/cider_postprocessor.py"

    @dataclass(frozen=True)
    class Params(EmbeddingDetector.Params):
        proto_m: float = param(0.95, "prototype EMA momentum (train_cider.yml:22)", ge=0, le=1)
        temp: float = param(0.1, "temperature of both losses (train_cider.yml:23)", gt=0)
        w: float = param(2.0, "weight of the compactness loss (train_cider.yml:24)", ge=0)
        feat_dim: int = param(128, "projection (embedding) size (cider_net.yml:8)", ge=1)
        projection: Literal["mlp", "linear"] = param("mlp", "projection head (cider_net.yml:9)")
        k: int = param(50, "the K-th nearest ID-train feature (cider.yml:5)", ge=1)
        score_rule: Literal["knn"] = param("knn", "how the trained model scores")

    search_space = {"k": [50, 100, 200, 500, 1000]}  # cider.yml:7

    def objective(self) -> Objective:
        p = self.params
        return CIDERLoss(p["proto_m"], p["temp"], p["w"], p["feat_dim"], p["projection"])

    def fit_rule(self, unit: np.ndarray, labels: np.ndarray) -> dict[str, np.ndarray]:
        return {"bank": unit.astype(np.float32)}

    def rule_scores(self, unit: np.ndarray) -> np.ndarray:
        """-D[:, K-1] of faiss' IndexFlatL2 over the bank (`cider_postprocessor.py:36-49`)."""
        import faiss

        bank, k = self.extra["bank"], int(self.params["k"])
        if not 1 <= k <= len(bank):
            raise ValueError(f"{self.name}: k={k} must be between 1 and the number of ID-train rows {len(bank)}")
        if getattr(self, "_rule_memo", None) is None:
            self._rule_memo = faiss.IndexFlatL2(bank.shape[1])
            self._rule_memo.add(np.ascontiguousarray(bank, dtype=np.float32))
        distances = self._rule_memo.search(np.ascontiguousarray(unit, dtype=np.float32), k)[0]
        return -distances[:, -1].astype(np.float64)
