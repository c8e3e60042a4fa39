"""PALM (Lu et al., ICLR 2024): a mixture of prototypes per class on the hypersphere, rows softly assigned to their
class's prototypes by Sinkhorn-Knopp, prototypes updated by EMA; scored by the Mahalanobis distance on the trained
backbone's normalised features.

OpenOOD `openood/trainers/palm_trainer.py` (at 3c35632): n_proto prototypes per class (prototype j of class j mod C),
uniform random then normalised (`:65-68`); `sinkhorn` (`:70-98`) on exp(z . p / epsilon) of the detached prototypes;
`mle_loss` (`:100-152`): the assignment restricted to the row's class and to its k largest entries, normalised over
prototypes then rows, moves the prototypes to normalise(m p + (1 - m) Q^T z) (keeping the gradient through z), then
a second Sinkhorn on the moved prototypes weights the positives of -mean(sum_j q_ij z_i . p_j / T - log sum_j
exp(z_i . p_j / T)); `proto_contra` (`:154-188`): a supervised contrastive loss among the moved prototypes (T 0.5, with
their gradient); loss = mle + lambda_pcon * pcon, the prototypes detached after the step (`:216-226`). Defaults:
`configs/pipelines/train/train_palm.yml:22-29` (proto_m 0.999, n_proto 6, k 5, temp 0.1, epsilon 0.05, sinkhorn_iter
3, lambda_pcon 1; `scripts/ood/palm/cifar100_train_palm.sh` keeps proto_m 0.999 at batch 512, the CIFAR-10 script sets
0.9 at batch 16), `configs/networks/palm_net.yml:8-9` (feat_dim 128, mlp head). Score: `scripts/eval_ood.py:130-136`
evaluates PALMNet with the `mds` postprocessor on its normalised backbone features (`palm_net.py:27-33`,
`mds_postprocessor.py:20-77`).

`nviews` (2 there: the two-view batch, targets repeated per view) is the number of rows per label here, read off the
batch: the loop feeds one view per row (`embedding`).
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


def sinkhorn(z: torch.Tensor, prototypes: torch.Tensor, epsilon: float, iterations: int) -> torch.Tensor:
    """`palm_trainer.py:70-98`: [B, K] soft assignment, rows summing to 1 (no gradient). Its re-normalising branch for
    an infinite sum is never reached with unit vectors (exp(1 / epsilon) is finite)."""
    q = torch.exp((z @ prototypes.detach().T).detach() / epsilon).T
    n_protos, rows = q.shape
    q = q / q.sum()
    for _ in range(iterations):
        q = F.normalize(q, dim=1, p=1) / n_protos
        q = F.normalize(q, dim=0, p=1) / rows
    return (q * rows).T


def proto_contrast(prototypes: torch.Tensor, num_classes: int) -> torch.Tensor:
    """`palm_trainer.py:154-188`: supervised contrast among the prototypes (same class positive), temperature 0.5."""
    protos = F.normalize(prototypes, dim=1)
    labels = torch.arange(num_classes, device=protos.device).repeat(len(protos) // num_classes).view(-1, 1)
    mask = torch.eq(labels, labels.T).float()
    logits = protos @ protos.T / 0.5
    logits = logits - logits.max(dim=1, keepdim=True).values.detach()
    not_self = 1.0 - torch.eye(len(protos), device=protos.device)
    mask = mask * not_self
    pos = torch.sum(F.normalize(mask, dim=1, p=1) * logits, dim=1)
    neg = torch.log(torch.sum(not_self * torch.exp(logits), dim=1))
    return -torch.mean(pos - neg)


class PALMLoss(Objective):
    """mle + lambda_pcon * pcon on the projected rows; the prototypes are a buffer (checkpointed)."""

    replaces_head = True

    def __init__(self, proto_m: float = 0.999, n_proto: int = 6, k: int = 5, temp: float = 0.1,
                 epsilon: float = 0.05, sinkhorn_iter: int = 3, lambda_pcon: float = 1.0, feat_dim: int = 128,
                 head: str = "mlp"):
        super().__init__()
        self.proto_m, self.temp, self.epsilon, self.lambda_pcon = (float(v) for v in (proto_m, temp, epsilon,
                                                                                       lambda_pcon))
        self.n_proto, self.k, self.sinkhorn_iter = int(n_proto), min(int(k), int(n_proto)), int(sinkhorn_iter)
        self.feat_dim, self.head = int(feat_dim), head
        self.last_terms: dict[str, float] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.projection = projection_head(feature_dim, self.feat_dim, self.head)
        self.num_classes = num_classes
        self.register_buffer("protos", F.normalize(torch.rand(self.n_proto * num_classes, self.feat_dim), dim=-1))

    def _topk(self, weights: torch.Tensor) -> torch.Tensor:
        return torch.zeros_like(weights).scatter(1, torch.topk(weights, self.k, dim=1)[1], 1)

    def mle(self, z: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(`mle_loss`, the moved prototypes with their gradient through z), `palm_trainer.py:100-152`."""
        views = len(z) // len(labels)
        anchor = labels.repeat(views).view(-1, 1)
        proto_labels = torch.arange(self.num_classes, device=z.device).repeat(self.n_proto).view(-1, 1)
        mask = torch.eq(anchor, proto_labels.T).float()
        q = sinkhorn(z, self.protos, self.epsilon, self.sinkhorn_iter)
        if self.k > 0:
            update = mask * q
            update = F.normalize(F.normalize(self._topk(update) * update, dim=1, p=1), dim=0, p=1)
        else:
            update = F.normalize(F.normalize(mask * q, dim=1, p=1), dim=0, p=1)
        moved = F.normalize(self.proto_m * self.protos + (1 - self.proto_m) * (update.T @ z), dim=1, p=2)
        q = sinkhorn(z, moved, self.epsilon, self.sinkhorn_iter)
        logits = z @ moved.detach().T / self.temp
        if self.k > 0:
            weights = F.normalize(self._topk(update) * (mask * q), dim=1, p=1)
        else:
            weights = F.normalize(q * mask, dim=1, p=1)
        pos = torch.sum(weights * logits, dim=1)
        neg = torch.log(torch.sum(torch.exp(logits), dim=1, keepdim=True))
        return -torch.mean(pos - neg), moved

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = embed(self.projection, features)
        loss, moved = self.mle(z, batch.y)
        terms = {"mle": float(loss.detach())}
        if self.lambda_pcon > 0:
            pcon = self.lambda_pcon * proto_contrast(moved, self.num_classes)
            loss = loss + pcon
            terms["pcon"] = float(pcon.detach())
        self.protos = moved.detach()
        self.last_terms = terms
        return loss


@register_detector("palm")
class PALM(MahalanobisOnUnitFeatures):
    """Train the backbone with PALM's losses through a projection head; score = max_c -(squared Mahalanobis distance)
    on the normalised backbone features (OpenOOD evaluates PALM with `mds`)."""

    label = "PALM"
    paper = "Lu et al., Learning with Mixture of Prototypes for Out-of-Distribution Detection, ICLR 2024"
    reference_code = "OpenOOD openood/trainers/palm_trainer.py, openood/postprocessors/mds_postprocessor.py"

    @dataclass(frozen=True)
    class Params(MahalanobisOnUnitFeatures.Params):
        proto_m: float = param(0.999, "prototype EMA momentum (train_palm.yml:22)", ge=0, le=1)
        n_proto: int = param(6, "prototypes per class (train_palm.yml:23)", ge=1)
        k: int = param(5, "prototypes each row updates and weighs, at most n_proto; 0: all (train_palm.yml:24)", ge=0)
        temp: float = param(0.1, "MLE temperature (train_palm.yml:25)", gt=0)
        epsilon: float = param(0.05, "Sinkhorn temperature (train_palm.yml:27)", gt=0)
        sinkhorn_iter: int = param(3, "Sinkhorn-Knopp iterations (train_palm.yml:28)", ge=0)
        lambda_pcon: float = param(1.0, "weight of the prototype contrast (train_palm.yml:29)", ge=0)
        feat_dim: int = param(128, "projection (embedding) size (palm_net.yml:8)", ge=1)
        projection: Literal["mlp", "linear"] = param("mlp", "projection head (palm_net.yml:9)")
        score_rule: Literal["mahalanobis"] = param("mahalanobis", "how the trained model scores")

    def objective(self) -> Objective:
        p = self.params
        return PALMLoss(p["proto_m"], p["n_proto"], p["k"], p["temp"], p["epsilon"], p["sinkhorn_iter"],
                        p["lambda_pcon"], p["feat_dim"], p["projection"])
