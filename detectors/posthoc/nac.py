"""NAC, neuron activation coverage (Liu et al., ICLR 2024) on the pooled penultimate layer: each neuron's state
sigmoid(alpha h_j dKL/dh_j) is binned; a sample scores the mean over neurons of how well ID training data covered
its bin, min(count / O, 1).

The official code (BierOne/ood_coverage at b002780) runs by default on the avgpool layer only
(`configs/postprocessors/nac/resnet/nac_cifar10.yml:3-13`: APS off, layer_names [avgpool], valid_num 1000, O 50,
M 50, sig_alpha 100, method sigmoid(o*g_kl)). There the gradient of KL(u || softmax) w.r.t. the pooled features is
W^T (softmax(z) - 1/C) (`openood/postprocessors/nac/instr_state.py:66-76`), so this detector needs the features and
the linear head, no backward pass. `nac_postprocessor.py:95-97` with `nac/utils.py:42-60` fits on a class-balanced
subset: int(valid_num / K) rows per class, each class's rows shuffled by np.random.RandomState(1);
`nac/utils.py:18-22, 110-112` the state 1 / (1 + exp(-alpha o g)) in float32; `nac/coverage.py:267-274` M thresholds
(a log-scale ladder on [0, 1], then 1.01 and 1.2, float64), `:295-314` counts per interval [t_i, t_i+1),
`:316-326` coverage min(count / O, 1), `:328-336` a sample's mean over neurons of its intervals' coverage (0 outside
every interval), averaged over layers (`:120-125`). The hidden-layer variants (layer1-3, per-layer O / M / alpha)
need input gradients through the backbone and are not this detector.

pytorch-ood 0.4.0's `NACUE` (`ai_coded`) differs: its own geometric bins on (1e-6, 1 - 1e-6), torch.sigmoid, the
KL as -mean log(p + 1e-12), every fit row counted (`variant: pytorch-ood` with `valid_num: null` is it).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np
import torch

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import model_precision, stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param


def official_thresholds(m: int) -> np.ndarray:
    """The official `logspace(1e3, M)`: M float64 thresholds (M - 1 intervals)."""
    half = int(m / 2)
    x_l = np.emath.logn(1e3, np.linspace(1, np.sqrt(1e3), num=half))
    x = np.concatenate([x_l[:-1], (1 - x_l)[::-1]])
    x[-1] += 1e-2
    return np.append(x, 1.2)


NACUE_EPS = 1e-6
"""pytorch-ood's clamp of the states and the ends of its geometric bins."""


def nacue_edges(m: int) -> torch.Tensor:
    """pytorch-ood's `_bin_indices_geometric` edges: float32 logspace on [1e-6, 0.5], mirrored onto [0.5, 1 - 1e-6]."""
    left = torch.logspace(torch.log10(torch.tensor(NACUE_EPS)), torch.log10(torch.tensor(0.5)), steps=m // 2 + 1)
    return torch.cat([left, (1.0 - left.flip(0))[1:]])


def balanced_subset(labels: np.ndarray, valid_num: int) -> np.ndarray:
    """The official TrainSubset rows: per class (in order of first appearance) its rows shuffled by
    np.random.RandomState(1), the first int(valid_num / K) of them (at most the smallest class's count; at least 1)."""
    classes, first = np.unique(labels, return_index=True)
    classes = classes[np.argsort(first)]
    groups = [np.flatnonzero(labels == c) for c in classes]
    per_class = max(1, min(int(valid_num / len(classes)), min(len(g) for g in groups)))
    rows = []
    for g in groups:
        g = list(g)
        np.random.RandomState(1).shuffle(g)
        rows += g[:per_class]
    return np.asarray(rows, dtype=np.int64)


@register_detector("nac")
class NAC(Detector):
    """s = mean_j min(count_j(bin(sigmoid(alpha h_j g_j))) / O, 1), g = W^T (softmax(W h + b) - 1/C)."""

    label = "NAC"
    aliases = {"NACUE": "pytorch-ood's"}
    reference_code = "BierOne/ood_coverage openood/postprocessors/nac/coverage.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = ("Liu et al., Neuron Activation Coverage: Rethinking Out-of-distribution Detection and Generalization, "
             "ICLR 2024")

    @dataclass(frozen=True)
    class Params(Params):
        o_star: int = param(50, "count at which a bin is fully covered (the official O)", ge=1)
        m_bins: int = param(50, "number of thresholds (the official M; pytorch-ood: number of bins)", ge=3)
        sig_alpha: float = param(100.0, "steepness of the sigmoid of h dKL/dh", gt=0)
        valid_num: int | None = param(1000, "class-balanced training rows counted (null: every row)", ge=1)
        variant: Literal["official", "pytorch-ood"] = param(
            "official", "official: its log-scale thresholds; pytorch-ood: NACUE's geometric bins and KL")

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if self.variant == "official" and self.m_bins % 2:  # its logspace gives 2 * int(M / 2) thresholds
                raise ValueError(f"m_bins must be even for variant 'official' (the official code's thresholds), "
                                 f"got {self.m_bins}")

    fit_inputs = frozenset({"head"})
    search_space = {"o_star": [10, 50]}  # the official avgpool sweep (nac_cifar10.yml:33-37)
    grids = {"openood_v1.5": {}}  # APS_mode: False in nac_cifar10.yml: its defaults run
    needs_head = True

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        if len(h) == 0:
            raise ValueError(f"{self.name}: no training features to count")
        if self.params["valid_num"] is not None:
            if id_train.labels is None:
                raise ValueError(f"{self.name}: valid_num needs training labels (its subset is class-balanced); "
                                 "valid_num: null counts every row")
            labels = np.asarray(id_train.labels).reshape(-1)
            h = model_precision(h[np.sort(balanced_subset(labels, self.params["valid_num"]))])
        raw = 0
        for _, block in streaming.chunks(h):  # the states of a chunk at a time (N x D of them, int64 columns)
            columns, column_bin = self._columns(model_precision(block))
            raw = raw + torch.bincount(columns.view(-1), minlength=columns.numel() // len(block) * len(column_bin))
        d = h.shape[1]
        raw = raw.view(d, len(column_bin)).numpy()
        kept = column_bin >= 0
        self.counts = np.zeros((d, self._intervals()), np.int64)
        np.add.at(self.counts.T, column_bin[kept], raw[:, kept].T)

    def _intervals(self) -> int:
        return self.params["m_bins"] - 1 if self.params["variant"] == "official" else self.params["m_bins"]

    def _states(self, h: np.ndarray) -> torch.Tensor:
        """sigmoid(alpha h g) in float32 as each reference computes it."""
        x = torch.from_numpy(np.ascontiguousarray(h, dtype=np.float32))
        w = torch.from_numpy(np.ascontiguousarray(self.head.weight, dtype=np.float32))
        b = torch.from_numpy(np.ascontiguousarray(self.head.bias, dtype=np.float32))
        p = torch.softmax(x @ w.T + b, 1)
        c = p.shape[1]
        if self.params["variant"] == "official":  # d/dz of -mean_k log_softmax(z)_k; 1 / (1 + exp(-alpha o g))
            g = (p - 1.0 / c) @ w
            return g.mul_(x).mul_(-self.params["sig_alpha"]).exp_().add_(1).reciprocal_()
        r = p / (p + 1e-12)  # d/dz of -mean_k log(p_k + 1e-12)
        g = ((r - p * r.sum(1, keepdim=True)) / -c) @ w
        return torch.sigmoid_(g.mul_(x).mul_(self.params["sig_alpha"]))

    def _columns(self, h: np.ndarray) -> tuple[torch.Tensor, np.ndarray]:
        """(row, neuron) -> neuron * width + the state's column, from one bucketize pass over float32 boundaries that
        hold every value where the reference's bin can change; and each column's bin (-1: outside every interval),
        the reference's own rule applied to a value of that column. Official: the float64 thresholds rounded up to
        float32 (a float32 state compares alike), intervals [t_i, t_i+1); pytorch-ood: NACUE's float32 edges and its
        clamp to (1e-6, 1 - 1e-6), bins clamp(bucketize - 1, 0, m - 1)."""
        s = self._states(h)
        if self.params["variant"] == "official":
            t = official_thresholds(self.params["m_bins"])
            up = t.astype(np.float32)
            bounds = np.where(up < t, np.nextafter(up, np.float32(np.inf)), up).astype(np.float32)
            columns = torch.bucketize(s, torch.from_numpy(bounds), right=True)  # column c: bounds[c-1] <= s < bounds[c]
            values = np.concatenate([[-np.inf], bounds]).astype(np.float64)
            column_bin = np.searchsorted(t, values, side="right") - 1
            column_bin[(column_bin < 0) | (column_bin > self.params["m_bins"] - 2)] = -1
        else:
            edges = nacue_edges(self.params["m_bins"])
            ends = torch.tensor([0.0, 1.0]).clamp(NACUE_EPS, 1 - NACUE_EPS)
            bounds = torch.unique(torch.cat([edges, ends]))  # sorted
            columns = torch.bucketize(s, bounds, right=False)  # column c: bounds[c-1] < s <= bounds[c]
            values = torch.cat([bounds, torch.tensor([np.inf])]).clamp(NACUE_EPS, 1 - NACUE_EPS)
            column_bin = (torch.bucketize(values, edges, right=False) - 1).clamp(0, self.params["m_bins"] - 1).numpy()
        width = len(column_bin)
        columns += torch.arange(0, s.shape[1] * width, width)
        return columns, column_bin

    def _score(self, batch) -> np.ndarray:
        coverage = np.minimum(self.counts / np.float32(self.params["o_star"]), 1).astype(np.float32)
        table = None

        def rows(_, h: np.ndarray) -> np.ndarray:
            nonlocal table
            columns, column_bin = self._columns(model_precision(h))
            if table is None:
                table = torch.from_numpy(np.ascontiguousarray(
                    np.where(column_bin >= 0, coverage[:, np.maximum(column_bin, 0)], np.float32(0))))
            return torch.take(table, columns).sum(1, dtype=torch.float64).numpy() / h.shape[1]

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "counts": self.counts}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.counts = state["counts"]
