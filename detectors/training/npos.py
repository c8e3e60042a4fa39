"""NPOS (Tao et al., ICLR 2023): CIDER's compactness and dispersion losses plus outliers synthesised around the
boundary of each class's queue of penultimate features (non-parametric: k-th nearest-neighbour distances), told
apart from the ID rows by a small MLP; scored by KNN on the trained backbone's normalised features.

OpenOOD `openood/trainers/npos_trainer.py` (at 3c35632), step by step (`:145-213`): a queue of `sample_number`
detached penultimate features per class fills first (rows of a full class dropped, `:197-203`); once every queue is
full, each step rolls the batch's rows in (`:145-161`) and, from epoch `start_epoch_KNN` on, draws `sample_from`
standard Gaussian vectors (torch's global generator, once per step, `:162-166`) and, per class (`:167-183`),
`generate_outliers` (`:373-401`): the queue's normalised rows, shuffled (numpy's global generator, `sampling_ratio`
1), form the KNN bank; the `select` rows of largest K-th nearest squared L2 distance are the boundary
(`KNN_dis_search_decrease`, `:431-449`), `pick_nums` of them drawn without replacement (numpy); around each, the
Gaussian vectors times `cov_mat` are candidates, and per column of the candidates' K-th distances viewed as
[sample_from, pick_nums] the `ID_points_num` largest are kept (`KNN_dis_search_distance`, `:404-428`; the view
interleaves the points' candidates, so the kept row of column j is candidate j * sample_from + r, ranked by the
distance of candidate r * pick_nums + j: reproduced as it runs). Then `loss_weight` times BCE-with-logits of the MLP
(Linear(D, feat_dim), ReLU, Linear(feat_dim, 1), `openood/networks/npos_net.py:23-24`) on the batch's penultimate
features (label 1, with their gradient) and the synthesised points (label 0) (`:185-196`). Loss = w_disp * dispersion
+ w_comp * compactness (CIDER's `DispLoss` and `CompLoss`, `:205-213`, `:265-370`) + that. The reference's faiss
(`faiss.GpuIndexFlatL2`, exact, squared L2) is replaced by the same exact search in torch (`kth_distance`); its
`minD_idx.squeeze()` (`:424`), which fails when `ID_points_num` or `pick_nums` is 1, is left out. Its per-epoch
zeroed queue (`:115-116`, with the counts kept full, so each epoch's first KNN steps search over zero rows whose
normalisation is 0/0) is not reproduced: the queues persist across epochs, as VOS'. The `mlp_decay_rate` group lr
(`:59, 70`) never takes effect in the reference (`adjust_learning_rate` and the warm-up set every group's lr,
`:239-262`). As there, a class with fewer ID-train rows than `sample_number` keeps every queue from filling, so no
outlier is ever synthesised; a run of fewer epochs than `start_epoch_knn` neither (both: CIDER's losses alone).
Defaults: `configs/pipelines/train/train_npos.yml:22-34`, `configs/networks/npos_net.yml:8-9`; the score:
`openood/postprocessors/npos_postprocessor.py:21-53` with `configs/postprocessors/npos.yml:5-7` (CIDER's rule, K 50).
"""
from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.distributions import MultivariateNormal

from detectors.registry import register_detector
from detectors.training.cider import CIDER, CIDERLoss, compactness_loss, dispersion_loss, ema_prototypes
from detectors.training.embedding import EmbeddingDetector, embed
from pipelines.params import param
from pipelines.training import Objective, TrainBatch

log = logging.getLogger(__name__)


FAISS_BLAS_THRESHOLD = 128_000
"""faiss' `distance_compute_blas_threshold` (faiss/utils/distances.cpp from 1.15; 1.15.1 made the goldens): its exact
IndexFlatL2 search sums the squared differences where queries x dimension is below it, and takes ||q||^2 + ||b||^2 -
2 q.b through BLAS from there on, as the reference's GpuIndexFlatL2 always does (faiss up to 1.14 switched at 20
queries). The two round differently, and the boundary's top-k can turn on that rounding: at the reference's sizes
(1,000 queue rows of 128-d features) the BLAS form."""


DIRECT_ELEMENTS = 1 << 22
"""Most squared differences held at once by the direct form (16 MiB of float32): a 2,000-row queue of 64-d features
would otherwise take 1 GB."""


def kth_distance(queries: torch.Tensor, bank: torch.Tensor, k: int) -> torch.Tensor:
    """The K-th smallest squared L2 distance of each query to the bank's rows, by exhaustive search (faiss'
    IndexFlatL2.search(queries, k)[0][:, -1]), float32 and computed as faiss computes it: the squared differences
    summed below `FAISS_BLAS_THRESHOLD`, else ||q||^2 + ||b||^2 - 2 q.b floored at 0."""
    if queries.numel() < FAISS_BLAS_THRESHOLD:  # [queries, bank, D] differences, a block of queries at a time
        step = max(1, DIRECT_ELEMENTS // max(bank.numel(), 1))
        d = torch.cat([((block[:, None, :] - bank[None]) ** 2).sum(-1) for block in queries.split(step)])
    else:
        d = ((queries * queries).sum(1, keepdim=True) + (bank * bank).sum(1)[None] - 2.0 * queries @ bank.T)
        d = d.clamp_min(0.0)
    return torch.topk(d, k, dim=1, largest=False).values[:, -1]


def _unit(x: torch.Tensor) -> torch.Tensor:
    """x / ||x|| without a floor, as `npos_trainer.py:384-385, 416-417, 443-444` (a zero row gives NaN there too)."""
    return x / torch.norm(x, p=2, dim=1, keepdim=True)


def generate_outliers(queue: torch.Tensor, gaussian: torch.Tensor, k: int, select: int, pick_nums: int,
                      id_points_num: int, cov_mat: float, rng=np.random) -> torch.Tensor:
    """`generate_outliers` (`npos_trainer.py:373-401`) for one class's queue [S, D] and the step's Gaussian draws
    [L, D]: pick_nums * id_points_num synthesised points. `rng`: numpy's global generator by default, as there."""
    length = len(gaussian)
    unit = _unit(queue)
    bank = unit[torch.as_tensor(rng.choice(len(unit), len(unit), replace=False), device=queue.device)]
    boundary = torch.topk(kth_distance(_unit(queue), bank, k), select).indices
    centres = boundary[torch.as_tensor(rng.choice(select, pick_nums, replace=False), device=queue.device)]
    candidates = cov_mat * gaussian.repeat(pick_nums, 1) + queue[centres].repeat_interleave(length, 0)
    grid = kth_distance(_unit(candidates), bank, k).view(length, -1)
    rows = torch.topk(grid, id_points_num, dim=0).indices
    picked = torch.cat([j * length + rows[:, j] for j in range(rows.shape[1])])
    return candidates[picked]


class NPOSLoss(CIDERLoss):
    """w_disp * dispersion + w_comp * compactness (CIDER's, on the projected ID rows) + loss_weight * the BCE of the
    MLP on the ID rows' penultimate features against the outliers synthesised from the class queues (buffers,
    checkpointed with the prototypes)."""

    def __init__(self, proto_m: float = 0.95, temp: float = 0.1, w_disp: float = 0.5, w_comp: float = 1.0,
                 loss_weight: float = 0.1, sample_number: int = 1000, sample_from: int = 600,
                 start_epoch_knn: int = 40, k: int = 300, select: int = 200, cov_mat: float = 0.1,
                 id_points_num: int = 200, pick_nums: int = 2, feat_dim: int = 128, head: str = "mlp"):
        super().__init__(proto_m, temp, 1.0, feat_dim, head)
        for what, n, most, of in (("K", k, sample_number, "sample_number"),
                                  ("select", select, sample_number, "sample_number"),
                                  ("pick_nums", pick_nums, select, "select"),
                                  ("ID_points_num", id_points_num, sample_from, "sample_from")):
            if not 1 <= n <= most:
                raise ValueError(f"npos: {what}={n} must be between 1 and {of}={most}")
        self.w_disp, self.w_comp, self.loss_weight = float(w_disp), float(w_comp), float(loss_weight)
        self.sample_number, self.sample_from, self.start_epoch_knn = int(sample_number), int(sample_from), \
            int(start_epoch_knn)
        self.k, self.select, self.cov_mat = int(k), int(select), float(cov_mat)
        self.id_points_num, self.pick_nums = int(id_points_num), int(pick_nums)
        self.epoch_idx = 1
        self._outliers: torch.Tensor | None = None  # private: kept out of the checkpoint's attributes

    def setup(self, feature_dim: int, num_classes: int, num_aux_classes: int = 0) -> None:
        super().setup(feature_dim, num_classes, num_aux_classes)
        self.mlp = nn.Sequential(nn.Linear(feature_dim, self.feat_dim), nn.ReLU(inplace=True),
                                 nn.Linear(self.feat_dim, 1))
        self.register_buffer("queue", torch.zeros(num_classes, self.sample_number, feature_dim))
        self.register_buffer("counts", torch.zeros(num_classes, dtype=torch.long))

    @property
    def last_outliers(self) -> torch.Tensor | None:
        """The points the last step synthesised (None when it synthesised none)."""
        return self._outliers

    def epoch_begin(self, epoch: int) -> None:
        """The reference's `epoch_idx` (from 1) the KNN phase compares with `start_epoch_KNN`."""
        self.epoch_idx = epoch + 1

    def synthesise(self) -> torch.Tensor:
        """`npos_trainer.py:162-183`: one Gaussian draw [sample_from, D] per step, `generate_outliers` per class; in
        float32 under any autocast (the K-th distances rank the boundary and the candidates)."""
        dim, device = self.queue.shape[2], self.queue.device
        with torch.autocast(device.type, enabled=False):
            gaussian = MultivariateNormal(torch.zeros(dim, device=device),
                                          torch.eye(dim, device=device)).rsample((self.sample_from,))
            return torch.cat([generate_outliers(self.queue[c], gaussian, self.k, self.select, self.pick_nums,
                                                self.id_points_num, self.cov_mat) for c in range(len(self.queue))])

    def loss(self, logits: torch.Tensor, features: torch.Tensor, batch: TrainBatch) -> torch.Tensor:
        h = features[: batch.n_id].float()
        reg = h.new_zeros(())
        self._outliers = None
        if bool((self.counts == self.sample_number).all()):
            for row, c in enumerate(batch.y.tolist()):
                self.queue[c] = torch.cat([self.queue[c][1:], h[row:row + 1].detach()])
            if self.epoch_idx >= self.start_epoch_knn:
                outliers = self.synthesise()
                self._outliers = outliers.detach()
                scores = torch.cat([self.mlp(h), self.mlp(outliers)]).view(-1)
                targets = torch.cat([torch.ones(len(h)), torch.zeros(len(outliers))]).to(scores.device)
                reg = F.binary_cross_entropy_with_logits(scores, targets)
        else:
            for row, c in enumerate(batch.y.tolist()):
                if self.counts[c] < self.sample_number:
                    self.queue[c, self.counts[c]] = h[row].detach()
                    self.counts[c] += 1
        z = embed(self.projection, h)
        updated = ema_prototypes(self.prototypes, z, batch.y, self.proto_m)
        disp = dispersion_loss(updated, self.temp)
        self.prototypes = updated.detach()
        comp = compactness_loss(z, self.prototypes, batch.y, self.temp)
        self.last_terms = {"disp": float(disp.detach()), "comp": float(comp.detach()), "reg": float(reg.detach())}
        return self.w_disp * disp + self.w_comp * comp + self.loss_weight * reg


@register_detector("npos")
class NPOS(EmbeddingDetector):
    """Train the backbone with NPOS' losses through a projection head and a boundary MLP; score = -(squared distance
    to the K-th nearest normalised ID-train feature), CIDER's rule (`npos_postprocessor.py` is CIDER's)."""

    label = "NPOS"
    paper = "Tao et al., Non-Parametric Outlier Synthesis, ICLR 2023"
    reference_code = "OpenOOD openood/trainers/npos_trainer.py, openood/postprocessors/npos_postprocessor.py"

    @dataclass(frozen=True)
    class Params(EmbeddingDetector.Params):
        proto_m: float = param(0.95, "prototype EMA momentum (train_npos.yml:22)", ge=0, le=1)
        temp: float = param(0.1, "temperature of both CIDER losses (train_npos.yml:23)", gt=0)
        sample_number: int = param(1000, "queued penultimate features per class (train_npos.yml:24)", ge=1)
        sample_from: int = param(600, "Gaussian draws per step (train_npos.yml:25)", ge=1)
        start_epoch_knn: int = param(40, "first epoch (from 1) that synthesises outliers (train_npos.yml:26)", ge=0)
        synthesis_k: int = param(300, "the K-th nearest queue row of the synthesis (train_npos.yml:27: K)", ge=1)
        cov_mat: float = param(0.1, "scale of the Gaussian around a boundary point (train_npos.yml:28)", ge=0)
        select: int = param(200, "boundary rows per class (train_npos.yml:29)", ge=1)
        id_points_num: int = param(200, "candidates kept per boundary point (train_npos.yml:30)", ge=1)
        pick_nums: int = param(2, "boundary points drawn per class and step (train_npos.yml:31)", ge=1)
        w_disp: float = param(0.5, "weight of the dispersion loss (train_npos.yml:32)", ge=0)
        w_comp: float = param(1.0, "weight of the compactness loss (train_npos.yml:33)", ge=0)
        loss_weight: float = param(0.1, "weight of the synthesis BCE (train_npos.yml:34)", ge=0)
        feat_dim: int = param(128, "projection and MLP width (npos_net.yml:8)", ge=1)
        projection: Literal["mlp", "linear"] = param("mlp", "projection head (npos_net.yml:9)")
        k: int = param(50, "the K-th nearest ID-train feature of the score (npos.yml:5)", ge=1)
        score_rule: Literal["knn"] = param("knn", "how the trained model scores")

    search_space = {"k": [50, 100, 200, 500, 1000]}  # npos.yml:7

    def objective(self) -> Objective:
        """The loss; a run of fewer epochs than `start_epoch_knn` never synthesises (logged: train_npos.yml runs 100,
        from 40 on, and the loop's recipe 30), so NPOS is then CIDER's losses, weighted 0.5 / 1."""
        p = self.params
        if p["start_epoch_knn"] > p["epochs"]:
            log.warning("npos: start_epoch_knn=%d is past the run's %d epochs: no outlier will be synthesised",
                        p["start_epoch_knn"], p["epochs"])
        return NPOSLoss(p["proto_m"], p["temp"], p["w_disp"], p["w_comp"], p["loss_weight"], p["sample_number"],
                        p["sample_from"], p["start_epoch_knn"], p["synthesis_k"], p["select"], p["cov_mat"],
                        p["id_points_num"], p["pick_nums"], p["feat_dim"], p["projection"])

    fit_rule = CIDER.fit_rule
    rule_scores = CIDER.rule_scores
