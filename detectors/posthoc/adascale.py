"""AdaSCALE A and L (Regmi, 2025): SCALE / LTS with a per-sample percentile set by how much the features move under a
small input perturbation.

OpenOOD (`openood/postprocessors/adascale_postprocessor.py`, `openood/networks/adascale_net.py`): the gradient of each
image's largest logit (`:37-44`, `:85-93`); the perturbation adds 0.5 sign(grad) on the int(C H W o) input elements of
*smallest* |grad| (`:105-114`); Q' = sum of relu(h') over the k1 % largest h + lmbda * sum of |h - h'| over the k2 %
largest h (h the features, h' those of the perturbed image; `:69-77`, counts int(D k / 100), `:124-125`); the
percentile p = lo + (1 - ECDF(Q')) (hi - lo), the ECDF that of Q' over `num_samples` rows of the ID *validation* set
(`:31`, `:57-63`, `:126-134`, statsmodels: the fraction <= Q'); then the SCALE ratio r = sum(relu h) / sum of the
D - round(D p / 100) largest relu h (`adascale_net.py:34-48`) scales the features by e^r (A, `:23-24`) or the logits
by r^2 (L, `:20-21`), and the score is the energy (`:99-101`). Defaults and sweep: `configs/postprocessors/
adascale_a.yml` and `adascale_l.yml` (the same: APS, num_samples 5000, percentile [75, 85], k1 5, k2 1, lmbda 10,
o 0.05; 36 percentile pairs).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar, Literal

import numpy as np
import torch

from detectors.base import Detector
from detectors.posthoc.common import logsumexp
from detectors.posthoc.pixels import eval_mode, pixel_batches
from detectors.registry import register_detector
from pipelines.params import ParamError, Params, param
from pipelines.runtime import resolve_device

PERCENTILE_PAIRS = [[lo, hi] for lo in (60, 65, 70, 75, 80, 85, 90, 95) for hi in (65, 70, 75, 80, 85, 90, 95, 99)
                    if hi > lo]
"""adascale_a.yml / adascale_l.yml `percentile_list`: every pair lo < hi of 60 ... 95 and 65 ... 99 (36)."""


def max_logit_gradient(classifier: Any, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(features h [B,D], grad_x of the sum of each image's largest logit), float32."""
    x = x.detach().float().requires_grad_(True)
    with torch.enable_grad():
        logits, features = classifier(x)
        top = logits.gather(1, logits.detach().argmax(dim=1, keepdim=True)).sum()
        (grad,) = torch.autograd.grad(top, x)
    return features.detach().float(), grad


def perturbed(x: torch.Tensor, grad: torch.Tensor, o: float) -> torch.Tensor:
    """x + 0.5 sign(grad) on each image's int(C H W o) elements of smallest |grad| (torch.topk, as the reference)."""
    flat = grad.abs().flatten(1)
    mask = torch.zeros_like(flat)
    count = int(flat.shape[1] * o)
    if count:
        mask.scatter_(1, torch.topk(flat, count, dim=1, largest=False)[1], 1.0)
    return x.detach() + grad.sign() * mask.reshape(grad.shape) * 0.5


def shift_statistic(h: torch.Tensor, h_moved: torch.Tensor, k1: int, k2: int, lmbda: float) -> np.ndarray:
    """Q' = sum of relu(h') at the k1 largest h + lmbda * sum of |h - h'| at the k2 largest h: the reference's float32
    torch operations (`:69-77`, `:126-133`), so that an image scored again meets its own fit value exactly."""
    top1 = torch.topk(h, k1, dim=1)[1]
    top2 = torch.topk(h, k2, dim=1)[1]
    moved = torch.gather(torch.relu(h_moved), 1, top1).sum(dim=1)
    shift = torch.gather((h - h_moved).abs(), 1, top2).sum(dim=1)
    return (moved + lmbda * shift).double().cpu().numpy()


def adaptive_ratio(h: np.ndarray, percentiles: np.ndarray) -> np.ndarray:
    """sum(relu h) / sum of the D - round(D p / 100) largest relu h per row, p its own percentile, float64 (at least
    one kept; 1 where both sums are 0, as `scale_ratio`)."""
    r = np.sort(np.maximum(np.asarray(h, dtype=np.float64), 0.0), axis=1)[:, ::-1]
    d = r.shape[1]
    kept = np.maximum(1, d - np.round(d * np.asarray(percentiles) / 100.0).astype(int))
    top = np.cumsum(r, axis=1)[np.arange(len(r)), kept - 1]
    total = r.sum(axis=1)
    empty = (top == 0) & (total == 0)
    return np.where(empty, 1.0, total / np.where(empty, 1.0, top))


class AdaScale(Detector):
    """The shared machinery of AdaScale A and L (not registered: the two subclasses are)."""

    family = "posthoc"
    inputs = frozenset({"images"})
    reference_code = "OpenOOD openood/postprocessors/adascale_postprocessor.py"
    paper = "Regmi, AdaSCALE: Adaptive Scaling for OOD Detection, arXiv 2503.08023, 2025"
    logit_scaling: ClassVar[bool] = False

    @dataclass(frozen=True)
    class Params(Params):
        percentile: list[float] = param([75, 85], "[lo, hi]: the per-sample percentile's range (adascale_*.yml:6)")
        k1: float = param(5, "percent of the largest features whose perturbed activations Q' sums (yml:7)", gt=0,
                          le=100)
        k2: float = param(1, "percent of the largest features whose shifts Q' sums (yml:8)", gt=0, le=100)
        lmbda: float = param(10, "weight of the shift term of Q' (yml:9)", ge=0)
        o: float = param(0.05, "fraction of input elements perturbed, those of smallest |gradient| (yml:10)", ge=0,
                         le=1)
        num_samples: int = param(5000, "fit rows whose Q' make the ECDF (yml:5; all where fewer)", ge=1)
        seed: int = param(0, "seed of the fit rows' draw (the reference: torch.randperm, unseeded)")
        fit_split: Literal["id_val", "id_train"] = param("id_val", "the ID split the ECDF is fitted on (OpenOOD: its "
                                                         "'val' loader, adascale_postprocessor.py:31)")

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            pair = list(self.percentile)
            if len(pair) != 2 or not 0 < pair[0] <= pair[1] < 100:
                raise ParamError("percentile", f"must be [lo, hi] with 0 < lo <= hi < 100, got {pair}")

    search_space = {"percentile": PERCENTILE_PAIRS, "k1": [5], "k2": [1], "lmbda": [10], "o": [0.05]}
    fit_inputs = frozenset({"id_val"})
    needs = frozenset({"classifier", "device"})

    def __init__(self, classifier: Any = None, batch_size: int = 32, device: str | None = None, **params: Any) -> None:
        """`classifier`: an ImageClassifier (forward -> (logits, features), its linear `head`); fp32 throughout."""
        super().__init__(**params)
        self.classifier, self.batch_size, self.device = classifier, int(batch_size), device

    def _model(self) -> Any:
        if self.classifier is None:
            raise ValueError(f"{self.name} needs the classifier: build('{self.name}', classifier=ImageClassifier...)")
        if self.device is not None:
            self.classifier.to(resolve_device(self.device))
        return self.classifier

    def _passes(self, images: Any) -> tuple[np.ndarray, np.ndarray]:
        """(features h [N,D] float32, Q' [N] float64) of every image."""
        model = self._model()
        feats, stats = [], []
        with eval_mode(model):
            chunks, _ = pixel_batches(model, images, self.batch_size, self.name)
            for x in chunks:
                h, grad = max_logit_gradient(model, x)
                with torch.no_grad():
                    h_moved = model(perturbed(x, grad, self.params["o"]))[1].float()
                k1, k2 = int(h.shape[1] * self.params["k1"] / 100), int(h.shape[1] * self.params["k2"] / 100)
                feats.append(h.cpu().numpy())
                stats.append(shift_statistic(h, h_moved, k1, k2, self.params["lmbda"]))
        if not feats:
            return np.zeros((0, 0), np.float32), np.zeros(0)
        return np.concatenate(feats), np.concatenate(stats)

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        if self.params["fit_split"] == "id_val" and id_val is None:
            raise ValueError(f"{self.name}: fit_split='id_val' (OpenOOD's) needs fit(..., id_val=images); "
                             "fit_split='id_train' fits on the training images")
        _, stats = self._passes(id_val if self.params["fit_split"] == "id_val" else id_train)
        if len(stats) == 0:
            raise ValueError(f"{self.name}: the fit split has no images")
        if self.params["num_samples"] < len(stats):
            order = np.random.default_rng(self.params["seed"]).permutation(len(stats))
            stats = stats[order[:self.params["num_samples"]]]
        self.fit_stats = np.sort(stats)

    def percentiles(self, stats: np.ndarray) -> np.ndarray:
        """lo + (1 - ECDF(Q')) (hi - lo), ECDF(q) the fraction of fit Q' <= q."""
        lo, hi = self.params["percentile"]
        ecdf = np.searchsorted(self.fit_stats, stats, side="right") / len(self.fit_stats)
        return lo + (1.0 - ecdf) * (hi - lo)

    def _score(self, batch: Any) -> np.ndarray:
        h, stats = self._passes(batch)
        if len(h) == 0:
            return np.zeros(0)
        ratio = adaptive_ratio(h, self.percentiles(stats))
        head = self.classifier.head
        weight = head.weight.detach().double().cpu().numpy()
        bias = head.bias.detach().double().cpu().numpy()
        h = h.astype(np.float64)
        if self.logit_scaling:
            logits = (h @ weight.T + bias) * ratio[:, None] ** 2
        else:
            logits = (h * np.exp(ratio)[:, None]) @ weight.T + bias
        return logsumexp(logits)

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "fit_stats": self.fit_stats}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.fit_stats = state["fit_stats"]


@register_detector("adascale_a")
class AdaScaleA(AdaScale):
    """s(x) = logsumexp(W (e^r h) + b), r the SCALE ratio at the sample's own percentile (AdaScaleANet)."""

    label = "AdaSCALE-A"


@register_detector("adascale_l")
class AdaScaleL(AdaScale):
    """s(x) = logsumexp(r^2 (W h + b)), r the SCALE ratio of relu(h) at the sample's own percentile (AdaScaleLNet)."""

    label = "AdaSCALE-L"
    logit_scaling = True
