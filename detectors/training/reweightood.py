"""ReweightOOD (Regmi et al., CVPR 2024 workshops): a contrastive loss on hyperspherical embeddings whose positive and
negative pairs are re-weighted by sigmoids of their own (detached) similarities; scored by the Mahalanobis distance on
the trained backbone's normalised features.

OpenOOD `openood/trainers/reweightood_trainer.py` (at 3c35632) `:87-98`: z = normalise(projection(h)); over the pairs
i < j of the batch, s_ij = z_i . z_j; positives (same class) weighted w+ = sigmoid(-(m_w s - c_w)), negatives
w- = sigmoid(m_b s - c_b); loss = ELU(logsumexp(-w+ s+ / T) + logsumexp(w- s- / T)). A batch without negative (or
positive) pairs has a logsumexp of nothing, -inf: the loss is ELU(-inf) = -1 with no gradient, as there. Defaults:
`configs/pipelines/train/train_reweightood.yml:21-26` (temp 0.1, m_b 5, c_b 4, m_w 2, c_w 1) on CIDERNet
(`configs/networks/cider_net.yml:8-9`: feat_dim 128, mlp head; `scripts/ood/reweightood/*_train_reweightood.sh`).
Score: `openood/postprocessors/reweightood_postprocessor.py:20-72`, max_c -(h - mu_c)^T P (h - mu_c) with class means
and P the precision of sklearn's EmpiricalCovariance of the class-centred normalised ID-train features (the `mds`
rule on those features; `configs/postprocessors/reweightood.yml`: no sweep).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import torch
import torch.nn.functional as F

from detectors.registry import register_detector
from detectors.training.embedding import MahalanobisOnUnitFeatures, embed, projection_head
from pipelines.params import param
from pipelines.training import Objective, TrainBatch


def reweighted_pair_loss(z: torch.Tensor, labels: torch.Tensor, temp: float, m_b: float, c_b: float, m_w: float,
                         c_w: float) -> torch.Tensor:
    """`reweightood_trainer.py:88-98` on normalised embeddings z [B, d] with their classes."""
    z = F.normalize(z, dim=-1)
    same = labels.view(-1, 1) == labels.view(1, -1)
    pos_mask = same.triu(diagonal=1).view(-1)
    neg_mask = same.logical_not().triu(diagonal=1).view(-1)
    sim = (z @ z.T).view(-1)
    pos, neg = sim[pos_mask], sim[neg_mask]
    weight_pos = torch.sigmoid(-(pos.detach() * m_w - c_w))
    weight_neg = torch.sigmoid(neg.detach() * m_b - c_b)
    pos = torch.logsumexp(-weight_pos * pos / temp, dim=0)
    neg = torch.logsumexp(weight_neg * neg / temp, dim=0)
    return F.elu(pos + neg)


class ReweightOODLoss(Objective):
    """The re-weighted pair loss on the projected ID rows (the classifier's head gets no gradient)."""

    replaces_head = True

    def __init__(self, temp: float = 0.1, m_b: float = 5.0, c_b: float = 4.0, m_w: float = 2.0, c_w: float = 1.0,
                 feat_dim: int = 128, head: str = "mlp"):
        super().__init__()
        self.temp, self.m_b, self.c_b, self.m_w, self.c_w = (float(v) for v in (temp, m_b, c_b, m_w, c_w))
        self.feat_dim, self.head = int(feat_dim), head

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.projection = projection_head(feature_dim, self.feat_dim, self.head)

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = embed(self.projection, features[: batch.n_id])
        return reweighted_pair_loss(z, batch.y, self.temp, self.m_b, self.c_b, self.m_w, self.c_w)


@register_detector("reweightood")
class ReweightOOD(MahalanobisOnUnitFeatures):
    """Train the backbone with ReweightOOD's loss through a projection head; score = max_c -(squared Mahalanobis
    distance) on the normalised backbone features."""

    label = "ReweightOOD"
    paper = ("Regmi et al., ReweightOOD: Loss Reweighting for Distance-based OOD Detection, CVPR 2024 Workshops")
    reference_code = ("OpenOOD openood/trainers/reweightood_trainer.py, "
                      "openood/postprocessors/reweightood_postprocessor.py")

    @dataclass(frozen=True)
    class Params(MahalanobisOnUnitFeatures.Params):
        temp: float = param(0.1, "temperature (train_reweightood.yml:22)", gt=0)
        m_b: float = param(5.0, "slope of the negative pairs' weight (train_reweightood.yml:23)")
        c_b: float = param(4.0, "offset of the negative pairs' weight (train_reweightood.yml:24)")
        m_w: float = param(2.0, "slope of the positive pairs' weight (train_reweightood.yml:25)")
        c_w: float = param(1.0, "offset of the positive pairs' weight (train_reweightood.yml:26)")
        feat_dim: int = param(128, "projection (embedding) size (cider_net.yml:8)", ge=1)
        projection: Literal["mlp", "linear"] = param("mlp", "projection head (cider_net.yml:9)")
        score_rule: Literal["mahalanobis"] = param("mahalanobis", "how the trained model scores")

    def objective(self) -> Objective:
        p = self.params
        return ReweightOODLoss(p["temp"], p["m_b"], p["c_b"], p["m_w"], p["c_w"], p["feat_dim"], p["projection"])
