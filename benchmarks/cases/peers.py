"""Our post-hoc detectors beside pytorch-ood 0.4's, fit + score on the same float32 features in one process.

Each case builds both detectors inside the clock (pytorch-ood's ViM computes u = -pinv(W) b in its constructor, part
of the fit), fits on the train rows and scores the test rows; the arrays are shared (torch.from_numpy, no copy, outside
the clock). Repeats alternate which side runs first; the ratio is pytorch-ood's best over ours, and the spread of the
per-repeat ratios says how noisy the machine was. The scores are compared after mapping pytorch-ood's outlier score
to ours (negated).
"""
from __future__ import annotations

import math
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import numpy as np
import torch

import detectors
from detectors import FeatureSet, LinearHead
from detectors.posthoc.nnguide import bank_rows
from detectors.posthoc.vim import principal_dim


def pytorch_ood_module() -> Any:
    """`pytorch_ood.detector`, imported without the package `__init__` (which imports torchvision)."""
    import importlib
    import importlib.util
    import types

    if "pytorch_ood" not in sys.modules:
        found = importlib.util.find_spec("pytorch_ood")
        if found is None:
            raise ImportError("pytorch-ood is not installed (pip install --no-deps pytorch-ood==0.4.0)")
        package = types.ModuleType("pytorch_ood")
        package.__path__ = list(found.submodule_search_locations)
        sys.modules["pytorch_ood"] = package
    return importlib.import_module("pytorch_ood.detector")


@dataclass
class Data:
    """The shared inputs: numpy for ours, torch views of the same memory for pytorch-ood."""

    train: FeatureSet
    test: FeatureSet
    head: LinearHead
    weights: np.ndarray  # WEBO's class weights

    def __post_init__(self) -> None:
        self.t = {"train": torch.from_numpy(self.train.features), "labels": torch.from_numpy(self.train.labels),
                  "test": torch.from_numpy(self.test.features), "test_logits": torch.from_numpy(self.test.logits)}
        self.linear = torch.nn.Linear(self.head.weight.shape[1], self.head.weight.shape[0])
        with torch.no_grad():
            self.linear.weight.copy_(torch.from_numpy(self.head.weight.astype(np.float32)))
            self.linear.bias.copy_(torch.from_numpy(self.head.bias.astype(np.float32)))


def _theirs_vim(pood: Any, data: Data, d: int) -> np.ndarray:
    det = pood.ViM(None, d=d, w=data.linear.weight.detach(), b=data.linear.bias.detach())
    det.fit_features(data.t["train"], data.t["labels"])
    return det.predict_features(data.t["test"]).numpy()


def _theirs_scale(pood: Any, data: Data) -> np.ndarray:
    det = pood.SCALE(backbone=lambda x: x, head=lambda x: data.linear(x.flatten(1)), percentile=0.85)
    with torch.no_grad():
        return det.predict_feature_maps(data.t["test"][:, :, None, None]).numpy()


def _theirs_nnguide(pood: Any, data: Data) -> np.ndarray:
    """Fitted on the rows our default banks (the official 1%; pytorch-ood banks whatever it is fitted on)."""
    rows = torch.from_numpy(bank_rows(len(data.train.features), 0.01, 10, 0))
    det = pood.NNGuide(None, head=data.linear, k=10)
    det.fit_features(data.t["train"][rows], data.t["labels"][rows])
    return det.predict_features(data.t["test"]).numpy()


def _theirs_pnml(pood: Any, data: Data) -> np.ndarray:
    det = pood.PNML(None, head=data.linear)
    det.fit_features(data.t["train"], data.t["labels"])
    return det.predict_features(data.t["test"]).numpy()


def _theirs_vra(pood: Any, data: Data) -> np.ndarray:
    det = pood.VRA(backbone=None, head=data.linear, lower_percentile=0.6, upper_percentile=0.9)
    det.fit_feature_maps(data.t["train"], data.t["labels"])
    return det.predict_feature_maps(data.t["test"]).numpy()


def _theirs_graduncertainty(pood: Any, data: Data, rows: int = 500) -> np.ndarray:
    """In blocks of `rows`: its per-sample head gradients are [rows, C, D] at once (all 20k rows would be 16 GB)."""
    det = pood.GradUncertainty(data.linear)
    return torch.cat([det.predict(block) for block in data.t["test"].split(rows)]).numpy()


def _theirs_gmm(pood: Any, data: Data, rows: int = 500) -> np.ndarray:
    """Scored in blocks of `rows`: its differences to every mean are [K, rows, D] float64 at once, twice (all 20k rows
    would be 2 x 33 GB)."""
    det = pood.GMM(None)
    det.fit_features(data.t["train"], data.t["labels"])
    return torch.cat([det.predict_features(block) for block in data.t["test"].split(rows)]).numpy()


class _Maps(torch.nn.Module):
    """Stands in for our MultiMahalanobis's classifier: its "images" are the precomputed maps [N, D, 1, 1] and its
    hidden maps their two channel halves (no forward pass on either side: pytorch-ood is handed the same halves)."""

    def __init__(self):
        super().__init__()
        self.anchor = torch.nn.Parameter(torch.zeros(1), requires_grad=False)  # the device and dtype it is read at

    def standardize(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def hidden_maps(self, x: torch.Tensor, layers: str = "hidden_states") -> tuple[None, list[torch.Tensor]]:
        return None, list(x.tensor_split(2, dim=1))


def _maps(data: Data, split: str) -> torch.Tensor:
    """The features of `split` as maps [N, D, 1, 1] (a view), carrying the labels our fit reads."""
    maps = data.t[split][:, :, None, None]
    maps.labels = data.train.labels if split == "train" else None
    return maps


def _ours_mmahalanobis(data: Data) -> np.ndarray:
    det = detectors.build("mmahalanobis", classifier=_Maps(), batch_size=1024)
    return det.fit(_maps(data, "train")).score(_maps(data, "test"))


def _theirs_mmahalanobis(pood: Any, data: Data, rows: int = 256) -> np.ndarray:
    """Two identity layers fitted on the channel halves (`fit_structured` takes them pooled, [N, D/2]: a 1 x 1 map's
    mean is itself), scored in blocks of `rows`: each class's (z - mu) P (z - mu)^T is [rows, rows] before its
    diagonal is taken (all 20k rows: 1.6 GB per class; 256, a loader batch, wastes half its products on it)."""
    det = pood.MultiMahalanobis([torch.nn.Identity(), torch.nn.Identity()])
    det.fit_structured([h.contiguous() for h in data.t["train"].tensor_split(2, dim=1)], data.t["labels"])
    return torch.cat([det.predict_structured([h.contiguous() for h in block.tensor_split(2, dim=1)])
                      for block in data.t["test"].split(rows)]).numpy()


class _Pooled(torch.nn.Module):
    """[B, D, 1, 1] maps -> average pool -> the head: the avgpool layer NACUE hooks."""

    def __init__(self, linear: torch.nn.Linear):
        super().__init__()
        self.pool, self.fc = torch.nn.AdaptiveAvgPool2d(1), linear

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(self.pool(x).flatten(1))


def _theirs_nac(pood: Any, data: Data, rows: int = 1024) -> np.ndarray:
    """NACUE on the pooled layer (our `variant: pytorch-ood`, every fit row), fitted from batches of `rows`."""
    model = _Pooled(data.linear).eval()
    det = pood.NACUE(model, layers=[model.pool], m_bins=50, alpha=100.0, o_star=50)
    maps = data.t["train"][:, :, None, None]
    with torch.enable_grad():
        det.fit([block.requires_grad_() for block in maps.split(rows)])
        return det.predict(data.t["test"][:, :, None, None].clone().requires_grad_()).numpy()


CASES: dict[str, Callable[[Any, Data], np.ndarray]] = {
    # ours -> pytorch-ood's fit + score (outlier scores), at our defaults
    "entropy": lambda pood, data: pood.Entropy(None).predict_logits(data.t["test_logits"]).numpy(),
    "webo": lambda pood, data: pood.WeightedEBO(None, torch.from_numpy(data.weights.astype(np.float32)))
    .predict_logits(data.t["test_logits"]).numpy(),
    "scale": _theirs_scale,
    "lts": lambda pood, data: pood.LTS(None, head=data.linear, p=0.05).predict_features(data.t["test"]).numpy(),
    "vim": lambda pood, data: _theirs_vim(pood, data, principal_dim(data.head.weight.shape[1])),
    "nnguide": _theirs_nnguide,
    "pnml": _theirs_pnml,
    "vra": _theirs_vra,
    "graduncertainty": _theirs_graduncertainty,
    "nac": _theirs_nac,
    "gmm": _theirs_gmm,
    "mmahalanobis": _theirs_mmahalanobis,
}
"""The detectors compared with pytorch-ood (the feature-level methods both libraries ship, ViM, and MultiMahalanobis
on the features as two precomputed 1 x 1 maps of D/2 channels: neither side runs a network)."""


FRAME_PIXELS, FRAME_CLASSES = 1024 * 2048, 19
"""Entropy's input at its paper's scale: Chan et al. (ICCV 2021) score every pixel of 1024 x 2048 Cityscapes frames
over its 19 classes, i.e. 2M logit rows per frame (the test set's 20k x 200 logits took milliseconds: too short to
time against the pause and the threads' wake-up)."""


def segmentation_frame(data: Data, seed: int = 1) -> Data:
    """`data` with its test set replaced by one frame's pixel logits [H*W, 19] (float32, rows = pixels, shared by both
    sides as every input here): per pixel a dominant class 2-8 above N(0, 2) logits, as a segmentation head's."""
    rng = np.random.default_rng(seed)
    logits = rng.normal(0.0, 2.0, (FRAME_PIXELS, FRAME_CLASSES)).astype(np.float32)
    labels = rng.integers(0, FRAME_CLASSES, FRAME_PIXELS)
    logits[np.arange(FRAME_PIXELS), labels] += rng.uniform(2.0, 8.0, FRAME_PIXELS).astype(np.float32)
    return Data(data.train, FeatureSet(np.zeros((FRAME_PIXELS, 0), np.float32), logits, labels), data.head,
                data.weights)


INPUTS: dict[str, Callable[[Data], Data]] = {"entropy": segmentation_frame}
"""Cases timed on their own input (at their paper's scale) instead of the shared test rows."""


PARAMS: dict[str, dict[str, Any]] = {
    "vra": {"below": "clip"},  # pytorch-ood's rule (the official zeroes; the same cost) at our quantiles
    "nac": {"variant": "pytorch-ood", "valid_num": None},  # NACUE's bins, every fit row counted
}
"""Our parameters where our defaults are not what pytorch-ood computes (so that the scores are compared)."""


OURS: dict[str, Callable[[Data], np.ndarray]] = {"mmahalanobis": _ours_mmahalanobis}
"""Our side where it is not `build(name).fit(train).score(test)` on the feature sets."""


def ours(name: str, data: Data) -> np.ndarray:
    if name in OURS:
        return OURS[name](data)
    params = {"weights": data.weights.tolist()} if name == "webo" else dict(PARAMS.get(name, {}))
    det = detectors.build(name, **params).fit(data.train, head=data.head)
    return det.score(data.test)


PAUSE_S = 0.3
"""Seconds between timed runs, outside the clock: OpenBLAS's (numpy's) idle threads spin for about 0.1 s after a
product, so a run that starts at once shares its cores with them (on 2 cores a torch eigh right after a numpy product
took 0.6-1.6 s, once 4 s, against 85 ms after a 0.1 s pause)."""


MIN_RUN_S = 0.1
"""Shortest timed run: a detector faster than this (WEBO: 3-4 ms) runs back to back that many times per timed run, as
`timeit` does, so one thread wake-up after the pause does not set its ratio (single calls gave 0.4-3.8x per repeat)."""

MAX_LOOPS = 50
"""At most this many calls per timed run (tiny test inputs would otherwise loop thousands of times)."""

WARM_AGAIN_S = 1.0
"""A side whose first call took less is called once more before the timed runs, and that call sets the loops per run:
a first call pays for imports and first-touch allocations (WEBO's first call took 14 ms, its next 2-3 ms, so the
first's time gave 7 calls per run, each run then led by the slow call after the pause)."""


def loops_per_run(seconds: float) -> int:
    """Calls per timed run so that a run lasts at least `MIN_RUN_S` (at most `MAX_LOOPS`), from the faster side's
    warm-up seconds."""
    return min(MAX_LOOPS, max(1, math.ceil(MIN_RUN_S / max(seconds, 1e-6))))


def compare(names: list[str], data: Data, repeats: int = 3) -> list[dict[str, Any]]:
    """Per detector: best fit + score seconds per call of each side over `repeats` (alternating who runs first), the
    ratio pytorch-ood / ours, the per-repeat ratios and the largest score difference (ours vs -theirs)."""
    pood = pytorch_ood_module()
    rows = []
    shared = data
    for name in names:
        data = INPUTS[name](shared) if name in INPUTS else shared
        call = {"ours": partial(ours, name, data), "pytorch_ood": partial(CASES[name], pood, data)}
        warm = {"ours": 0.0, "pytorch_ood": 0.0}
        for side in warm:  # warm-up: imports, first-call allocations; a second call's time sets the loops per run
            for _ in range(2):
                start = time.perf_counter()
                with torch.no_grad():
                    call[side]()
                warm[side] = time.perf_counter() - start
                if warm[side] >= WARM_AGAIN_S:
                    break
        loops = loops_per_run(min(warm.values()))
        times: dict[str, list[float]] = {"ours": [], "pytorch_ood": []}
        for repeat in range(repeats):
            order = ("ours", "pytorch_ood") if repeat % 2 == 0 else ("pytorch_ood", "ours")
            for side in order:
                time.sleep(PAUSE_S)
                start = time.perf_counter()
                with torch.no_grad():
                    for _ in range(loops):
                        scores = call[side]()
                times[side].append((time.perf_counter() - start) / loops)
                if side == "ours":
                    mine = scores
                else:
                    theirs = -np.asarray(scores, dtype=np.float64)
        pairs = [t / o for t, o in zip(times["pytorch_ood"], times["ours"])]
        scale = max(float(np.abs(theirs).max()), 1e-12)
        medians = {side: float(np.median(runs)) for side, runs in times.items()}
        rows.append({"detector": name, "ours_s": min(times["ours"]), "pytorch_ood_s": min(times["pytorch_ood"]),
                     "ratio": min(times["pytorch_ood"]) / min(times["ours"]), "repeat_ratios": pairs,
                     "ours_median_s": medians["ours"], "pytorch_ood_median_s": medians["pytorch_ood"],
                     "median_ratio": medians["pytorch_ood"] / medians["ours"],
                     "runs": times, "loops_per_run": loops, "max_rel_diff": float(np.abs(mine - theirs).max() / scale),
                     **({"input": {"rows": len(data.test.logits), "classes": data.test.logits.shape[1]}}
                        if name in INPUTS else {})})
    return rows


def make(n: int, dim: int, classes: int, seed: int) -> Data:
    """ReLU'd Gaussian class clusters (float32) with a random head, n train and n test rows, positive WEBO weights."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(0.0, 1.0, (classes, dim)).astype(np.float32)
    head = LinearHead(rng.normal(0.0, 1.0 / np.sqrt(dim), (classes, dim)).astype(np.float32),
                      rng.normal(0.0, 0.1, classes).astype(np.float32))

    def rows(count: int) -> FeatureSet:
        labels = rng.integers(0, classes, count)
        features = np.maximum(rng.standard_normal((count, dim), dtype=np.float32) + centres[labels], 0)
        return FeatureSet(features, head(features).astype(np.float32), labels)

    return Data(rows(n), rows(n), head, rng.uniform(0.5, 1.5, classes))


def markdown(rows: list[dict[str, Any]], sizes: str) -> str:
    lines = [f"pytorch-ood 0.4 beside ours, fit + score, {sizes} (entropy: one segmentation frame's pixel logits, "
             f"{FRAME_PIXELS} x {FRAME_CLASSES}), best of each side (ratio = theirs / ours; the median ratio is of "
             "each side's median; the range is the per-repeat ratios):", "",
             "| detector | ours s | pytorch-ood s | ratio | median ratio | per-repeat ratios | max rel. score diff |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        median = f"{r['median_ratio']:.2f}x" if "median_ratio" in r else "—"
        lines.append(f"| {r['detector']} | {r['ours_s']:.4f} | {r['pytorch_ood_s']:.4f} | **{r['ratio']:.2f}x** | "
                     f"{median} | {min(r['repeat_ratios']):.2f} ... {max(r['repeat_ratios']):.2f} | "
                     f"{r['max_rel_diff']:.1e} |")
    return "\n".join(lines)
