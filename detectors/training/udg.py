"""UDG (Yang et al., ICCV 2021, "Semantically Coherent Out-of-Distribution Detection"), as in OpenOOD v1.5 /
Open-Insects (`udg` trainer, `udg` network: closed head + a cluster head `fc_aux`).

Before every epoch, on the features of every ID-train and auxiliary row (model in eval mode):
1. PCA-whitening to `pca_dim` (eigenvalue power -0.5), L2 normalisation, k-means with `num_clusters` clusters (20
   iterations; faiss, as the reference; k is capped at the number of rows).
2. Cluster re-weighting: a row's weight is (1 / size of its cluster)^0.5, divided by the mean over clusters.
3. In-distribution filtering: the labels so far (ID: class; aux: last epoch's pseudo label, -1 at first) give each
   cluster a purity per label; a cluster with a label of purity > `purity_ind_thresh` gives that label (the smallest
   such, -1 first) to all its aux rows; else one with purity > `purity_ood_thresh` whose label is -1 gets OOD
   confidence `oe_enhance_ratio` for its rows (with both thresholds at 0.8, the reference's, that branch never fires).
4. The cluster head is re-initialised (weights N(0, 0.01), bias 0).
Each step (ID and aux batches as two forward passes):
  loss = CE(closed head, rows with label != -1; aux rows use their pseudo label)
       + lambda_oe  * mean over rows with label -1 of conf * CE(uniform, softmax(closed logits))
       + lambda_aux * mean over all rows of weight * CE(cluster head, cluster id)
Score: MSP of the closed head.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from detectors.registry import register_detector
from detectors.training.common import TrainedDetector
from pipelines.params import param
from pipelines.training import Objective, Pass, TrainBatch


def pca_whiten(x: np.ndarray, dim: int) -> np.ndarray:
    """Centre, project on the top `dim` principal axes, scale each by eigenvalue^-0.5, then L2-normalise the rows."""
    x = np.asarray(x, dtype=np.float64)
    centred = x - x.mean(0)
    values, vectors = np.linalg.eigh(centred.T @ centred / max(len(x) - 1, 1))
    order = np.argsort(values)[::-1][: min(dim, x.shape[1])]
    z = centred @ vectors[:, order] / np.sqrt(np.maximum(values[order], 1e-12))
    return z / np.linalg.norm(z, axis=1, keepdims=True)


def kmeans(x: np.ndarray, k: int, seed: int, niter: int = 20) -> np.ndarray:
    """Cluster index of each row (faiss k-means, `niter` iterations, seeded)."""
    import faiss

    x = np.ascontiguousarray(x, dtype=np.float32)
    km = faiss.Kmeans(x.shape[1], int(k), niter=niter, seed=int(seed), max_points_per_centroid=10_000_000,
                      verbose=False)
    km.train(x)
    return km.index.search(x, 1)[1].reshape(-1).astype(np.int64)


def cluster_weights(cluster: np.ndarray, k: int) -> np.ndarray:
    """Per row: (1 / (cluster size + 1e-10))^0.5, normalised by the mean over the k clusters (empty ones included)."""
    inv = np.power(1.0 / (np.bincount(cluster, minlength=k) + 1e-10), 0.5)
    inv = inv / inv.mean()
    return inv[cluster]


def filter_clusters(cluster: np.ndarray, labels: np.ndarray, k: int, num_classes: int, ind_thresh: float,
                    ood_thresh: float, enhance: float) -> tuple[np.ndarray, np.ndarray]:
    """(new pseudo label, OOD confidence) of every row from its cluster's label purities (step 3 of the docstring)."""
    counts = np.zeros((k, num_classes + 1), dtype=np.int64)  # column 0 = label -1, column j = label j - 1
    np.add.at(counts, (cluster, labels + 1), 1)
    purity = counts / np.maximum(counts.sum(1, keepdims=True), 1)
    ind = purity > ind_thresh
    has_ind = ind.any(1)
    majority = np.where(has_ind, ind.argmax(1) - 1, -1)
    ood = ~has_ind & (purity > ood_thresh).any(1)
    ood &= ((purity > ood_thresh).argmax(1) == 0)
    pseudo = np.where(has_ind[cluster], majority[cluster], -1)
    conf = np.where(ood[cluster], enhance, 1.0)
    return pseudo, conf


class UDGLoss(Objective):
    uses_aux = True
    needs_epoch_pass = True

    def __init__(self, num_clusters: int = 1000, pca_dim: int = 256, purity_ind_thresh: float = 0.8,
                 purity_ood_thresh: float = 0.8, oe_enhance_ratio: float = 2.0, lambda_oe: float = 0.5,
                 lambda_aux: float = 0.1, seed: int = 0):
        super().__init__()
        self.num_clusters, self.pca_dim = int(num_clusters), int(pca_dim)
        self.ind_thresh, self.ood_thresh = float(purity_ind_thresh), float(purity_ood_thresh)
        self.enhance, self.lambda_oe, self.lambda_aux, self.seed = (float(oe_enhance_ratio), float(lambda_oe),
                                                                    float(lambda_aux), seed)
        self.aux_head: nn.Linear | None = None
        self.num_classes = 0
        self.state: dict[str, torch.Tensor] = {}

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        self.num_classes = num_classes
        self.aux_head = nn.Linear(feature_dim, self.num_clusters)

    def epoch_start(self, epoch: int, id_pass: Pass, aux_pass: Pass | None) -> None:
        id_index, aux_index = id_pass.index.numpy(), aux_pass.index.numpy()
        features = torch.cat([id_pass.features, aux_pass.features]).double().cpu().numpy()
        k = min(self.num_clusters, len(features))
        xb = pca_whiten(features, self.pca_dim)
        if np.isnan(xb).any():  # the reference falls back to L2-normalised (or raw) features
            xb = features / np.linalg.norm(features, axis=1, keepdims=True)
            xb = features if np.isnan(xb).any() else xb
        cluster = kmeans(xb, k, self.seed * 1_000 + epoch)
        weight = cluster_weights(cluster, self.num_clusters)
        n_id = len(id_index)
        old_aux = self._table("aux_pseudo", aux_index, -1)
        labels = np.concatenate([id_pass.labels.numpy(), old_aux])
        pseudo, conf = filter_clusters(cluster, labels, self.num_clusters, self.num_classes, self.ind_thresh,
                                       self.ood_thresh, self.enhance)
        self._store("id_cluster", id_index, cluster[:n_id], -1)
        self._store("id_weight", id_index, weight[:n_id], 0.0)
        self._store("aux_cluster", aux_index, cluster[n_id:], -1)
        self._store("aux_weight", aux_index, weight[n_id:], 0.0)
        self._store("aux_pseudo", aux_index, pseudo[n_id:], -1)
        self._store("aux_conf", aux_index, conf[n_id:], 1.0)
        with torch.no_grad():
            self.aux_head.weight.normal_(0.0, 0.01)
            self.aux_head.bias.zero_()

    def _table(self, name: str, index: np.ndarray, default: float) -> np.ndarray:
        table = self.state.get(name)
        out = np.full(len(index), default, dtype=np.float64 if isinstance(default, float) else np.int64)
        if table is not None:
            inside = index < len(table)
            out[inside] = table.numpy()[index[inside]]
        return out

    def _store(self, name: str, index: np.ndarray, values: np.ndarray, default: float) -> None:
        size = int(index.max()) + 1 if len(index) else 0
        dtype = torch.float64 if isinstance(default, float) else torch.int64
        table = torch.full((size,), default, dtype=dtype)
        table[torch.as_tensor(index)] = torch.as_tensor(values, dtype=dtype)
        self.state[name] = table

    def _lookup(self, name: str, index: torch.Tensor, default: float) -> torch.Tensor:
        table = self.state[name].to(index.device)
        inside = index < len(table)
        out = torch.full(index.shape, default, dtype=table.dtype, device=index.device)
        out[inside] = table[index[inside]]
        return out

    def inputs(self, batch: TrainBatch) -> tuple[torch.Tensor, ...]:
        return (batch.x,) if batch.aux_x is None else (batch.x, batch.aux_x.to(batch.x.dtype))

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        z = logits.float()
        n = batch.n_id
        aux_idx = batch.aux_index if batch.aux_index is not None else torch.zeros(0, dtype=torch.long, device=z.device)
        labels = torch.cat([batch.y, self._lookup("aux_pseudo", aux_idx, -1)])
        known = labels != -1
        loss = F.cross_entropy(z[known], labels[known]) if known.any() else z.sum() * 0
        unknown = ~known
        if unknown.any():
            conf = torch.cat([torch.ones(n, device=z.device, dtype=torch.float64),
                              self._lookup("aux_conf", aux_idx, 1.0)])
            uniform_ce = torch.logsumexp(z[unknown], 1) - z[unknown].mean(1)
            loss = loss + self.lambda_oe * (uniform_ce * conf[unknown].float()).mean()
        cluster = torch.cat([self._lookup("id_cluster", batch.index, -1), self._lookup("aux_cluster", aux_idx, -1)])
        weight = torch.cat([self._lookup("id_weight", batch.index, 0.0),
                            self._lookup("aux_weight", aux_idx, 0.0)]).float()
        per_row = F.cross_entropy(self.aux_head(features).float(), cluster.clamp(min=0), reduction="none")
        loss = loss + self.lambda_aux * (per_row * weight * (cluster >= 0).float()).mean()
        return loss


@register_detector("udg")
class UDG(TrainedDetector):
    """Unsupervised dual grouping on ID + auxiliary data; score = MSP of the closed head."""

    label = "UDG"
    paper = "Yang et al., Semantically Coherent Out-of-Distribution Detection, ICCV 2021"
    released_network = "udg_net"  # scored by its closed head `fc`; the cluster head `fc_aux` only trains

    @dataclass(frozen=True)
    class Params(TrainedDetector.Params):
        num_clusters: int = param(1000, "k-means clusters", ge=1)
        pca_dim: int = param(256, "PCA dimension before clustering", ge=1)
        purity_ind_thresh: float = param(0.8, "cluster purity to count as ID", ge=0, le=1)
        purity_ood_thresh: float = param(0.8, "cluster purity to count as OOD", ge=0, le=1)
        oe_enhance_ratio: float = param(2.0, "outlier-exposure enhancement ratio", gt=0)
        lambda_oe: float = param(0.5, "weight of the OE loss", ge=0)
        lambda_aux: float = param(0.1, "weight of the auxiliary clustering loss", ge=0)

    search_space = {"num_clusters": [100, 500, 1000]}

    def objective(self) -> Objective:
        p = self.params
        return UDGLoss(p["num_clusters"], p["pca_dim"], p["purity_ind_thresh"], p["purity_ood_thresh"],
                       p["oe_enhance_ratio"], p["lambda_oe"], p["lambda_aux"], p["seed"])
