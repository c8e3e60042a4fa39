"""GRAM: deviations of Gram-matrix statistics of intermediate feature maps (Sastry & Oore, ICML 2020).

As OpenOOD v1.5 implements it (Jingkang50/OpenOOD, openood/postprocessors/gram_postprocessor.py): for every layer l
and power p the per-image vector G_p = sign(r) |r|^(1/p), r = row sums of the Gram matrix of the feature map raised to
the p-th power (channels x positions); per class, the min and max of each entry over ID training images (true labels);
a sample's deviation from class c is sum_entries relu(min - x) / |min + 1e-6| + relu(x - max) / |max + 1e-6|. Layer
deviations (summed over powers) are divided by their mean on held-out ID images (OpenOOD: a random 10% of each class of
the training set, excluded from the min/max) and summed over layers, for the predicted class; the score is
-deviation / max softmax (higher = more ID).

Per-image Gram vectors (and logits) are computed in one batched pass over an image set and cached in safetensors,
keyed by the model, its weights, the image set and the layer / power choice, so fit and scoring reuse them.
"""
from __future__ import annotations

import hashlib
import math
import os
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import numpy as np
import torch

from detectors.base import Detector, ImageSet, as_numpy
from detectors.posthoc.common import softmax
from detectors.posthoc.pixels import pixel_batches
from detectors.registry import register_detector
from pipelines.io import atomic_path, safe_name
from pipelines.params import Params, param
from pipelines.progress import progress

EPS = 1e-6  # OpenOOD's 10**-6 in the deviation's denominators
ROW_BLOCK = 1024
_MEMO_ATTR = "_gram_feature_memo"


def gram_vector(feature_map: torch.Tensor, power: int) -> torch.Tensor:
    """[B, C] float64: sign(r) |r|^(1/p), r = row sums of (F^p)(F^p)^T, F^p the map [B, C, positions] to the p-th power.

    Row sums are computed as F^p (F^p summed over channels) without forming the C x C matrix (same value, C times less
    work). A 4-D map [B, C, H, W] has C channels; a sequence [B, T, D] (transformer hidden state) has D channels and T
    positions.
    """
    x = feature_map.detach().to(torch.float64)
    if x.ndim == 3:
        x = x.transpose(1, 2)
    x = x.reshape(x.shape[0], x.shape[1], -1) ** power
    rows = torch.einsum("bcn,bn->bc", x, x.sum(dim=1))
    return rows.sign() * rows.abs() ** (1.0 / power)


def gram_deviation(mins: np.ndarray, maxs: np.ndarray, x: np.ndarray) -> np.ndarray:
    """Entry-wise deviations [N, F] of x from [min, max] (OpenOOD's `delta` before its sum over entries)."""
    return (np.maximum(mins - x, 0.0) / np.abs(mins + EPS)) + (np.maximum(x - maxs, 0.0) / np.abs(maxs + EPS))


def model_digest(classifier: Any) -> str:
    """Identifies a classifier's weights cheaply: model id, parameter shapes and float64 sums."""
    h = hashlib.sha256(str(getattr(classifier, "model_id", type(classifier).__name__)).encode())
    with torch.no_grad():
        for name, tensor in classifier.state_dict().items():
            if torch.is_tensor(tensor):
                h.update(f"{name}{tuple(tensor.shape)}"
                         f"{float(tensor.double().sum()) if tensor.numel() else 0.0:.10e}".encode())
    return h.hexdigest()[:16]


class GramFeatures:
    """Gram vectors `gram [N, F]` (float32; columns grouped by layer, then power, then channel), `layer [F]` (layer of
    each column) and `logits [N, K]` of one image set."""

    def __init__(self, gram: np.ndarray, layer: np.ndarray, logits: np.ndarray):
        self.gram, self.layer, self.logits = gram, layer.astype(np.int64), logits

    def __len__(self) -> int:
        return len(self.gram)

    def save(self, path: str | os.PathLike, metadata: dict[str, str]) -> Path:
        from safetensors.numpy import save_file

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        with atomic_path(path) as tmp:
            save_file({"gram": np.ascontiguousarray(self.gram), "layer": self.layer,
                       "logits": np.ascontiguousarray(self.logits)},
                      str(tmp), metadata=metadata)
        return path

    @classmethod
    def load(cls, path: str | os.PathLike) -> GramFeatures:
        from safetensors.numpy import load_file

        arrays = load_file(str(path))
        return cls(arrays["gram"], arrays["layer"], arrays["logits"])


@torch.no_grad()
def compute_gram_features(classifier: Any, batches: Any, powers: list[int], layers: str,
                          total: int | None = None) -> GramFeatures:
    """One pass of `classifier` over `batches` of normalised pixel values -> GramFeatures."""
    param = next(classifier.parameters())
    modes = [(module, module.training) for module in classifier.modules()]
    classifier.eval()
    grams, logits, layer_of = [], [], None
    try:
        for x in progress(batches, total=total, desc="gram features", leave=False, disable=not total or total < 2):
            z, per_layer = classifier.hidden_maps(x.to(device=param.device, dtype=param.dtype), layers,
                                                  reduce=lambda m: [gram_vector(m, p).cpu() for p in powers])
            blocks = [v for layer in per_layer for v in layer]
            grams.append(torch.cat(blocks, dim=1).to(torch.float32).numpy())
            logits.append(as_numpy(z, np.float32))
            if layer_of is None:
                layer_of = np.concatenate([np.full(v.shape[1], i) for i, layer in enumerate(per_layer) for v in layer])
    finally:
        for module, training in modes:
            module.training = training
    if not grams:
        raise ValueError("gram: the image set is empty")
    return GramFeatures(np.concatenate(grams), layer_of, np.concatenate(logits))


@register_detector("gram")
class Gram(Detector):
    """GRAM on a classifier's intermediate feature maps (needs the classifier and images).

    `powers` 1..5 (OpenOOD v1.5). `layers`: "hidden_states" (default: the transformers model's hidden states) or
    "relu_conv" (OpenOOD's hooks: every nn.ReLU and nn.Conv2d output). `normalize`: "train_holdout" (OpenOOD: a seeded
    random `holdout` fraction of each class's training images sets the layer normalisers and is left out of the
    min/max) or "id_val" (min/max on all training images, normalisers on `id_val`).
    """

    label = "Gram"
    reference_code = "OpenOOD openood/postprocessors/gram_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"images"})
    keeps_batches = True  # a killed rerun resumes within a set (Detector.score)
    paper = "Sastry & Oore, Detecting Out-of-Distribution Examples with Gram Matrices, ICML 2020"

    @dataclass(frozen=True)
    class Params(Params):
        powers: list[int] = param([1, 2, 3, 4, 5], "powers p of the p-th order Gram matrices")
        layers: Literal["hidden_states", "relu_conv"] = param("hidden_states", "which feature maps are read")
        normalize: Literal["train_holdout", "id_val"] = param("train_holdout", "where the layer normalisers come from")
        holdout: float = param(0.1, "fraction of each class's training images held out for the normalisers", gt=0, lt=1)
        seed: int = param(0, "seed of the holdout draw")

        def check(self, dims: dict[str, int] | None = None) -> None:
            super().check(dims)
            if not self.powers or min(self.powers) < 1:
                raise ValueError(f"powers must be a non-empty list of integers >= 1, got {self.powers!r}")

    fit_inputs = frozenset({"id_val"})
    needs = frozenset({"classifier", "cache_dir"})

    def __init__(self, classifier: Any = None, cache_dir: str | os.PathLike | None = None, batch_size: int = 32,
                 **params: Any) -> None:
        """`classifier`: an ImageClassifier (`hidden_maps`, `preprocess`); `cache_dir`: where Gram features are cached
        (None: in memory only). Both are kept out of params."""
        super().__init__(**params)
        self.classifier, self.cache_dir, self.batch_size = classifier, cache_dir, int(batch_size)
        self.mins: np.ndarray | None = None  # [K, F]
        self.maxs: np.ndarray | None = None
        self.layer: np.ndarray | None = None  # [F]
        self.normalizers: np.ndarray | None = None  # [L]

    # -- features -------------------------------------------------------------------------------------------
    def _cache_file(self, images: ImageSet) -> Path | None:
        if self.cache_dir is None or images.cache_key is None:
            return None
        from pipelines.fingerprint import preprocessing_fingerprint

        key = (f"{model_digest(self.classifier)}|{preprocessing_fingerprint(self.classifier)}|{images.cache_key}|"
               f"{self.params['layers']}|{list(self.params['powers'])}")
        slug = safe_name(Path(str(self.classifier.model_id)).name)[-40:]
        return Path(self.cache_dir) / f"gram-{slug}-{hashlib.sha256(key.encode()).hexdigest()[:16]}.safetensors"

    def features(self, batch: Any) -> GramFeatures:
        """Gram features of an ImageSet (memory, then the cache file, else one batched pass) or of a float tensor
        [B,3,H,W] of preprocessed images (not cached)."""
        if isinstance(batch, GramFeatures):
            return batch
        if self.classifier is None:
            raise ValueError("gram needs the classifier: build('gram', classifier=ImageClassifier...)")
        powers, layers = [int(p) for p in self.params["powers"]], self.params["layers"]
        if isinstance(batch, torch.Tensor) and batch.ndim == 4 and batch.is_floating_point():
            return compute_gram_features(self.classifier, batch.split(self.batch_size), powers, layers,
                                         math.ceil(len(batch) / self.batch_size))
        if not isinstance(batch, ImageSet):
            raise TypeError(f"gram: takes an ImageSet or a float tensor [B,3,H,W] of preprocessed images, got "
                            f"{type(batch).__name__}")
        memo_key = (id(self.classifier), layers, tuple(powers))
        memo = batch.__dict__.setdefault(_MEMO_ATTR, {})
        if memo_key in memo:
            return memo[memo_key]
        path = self._cache_file(batch)
        if path is not None and path.is_file():
            feats = GramFeatures.load(path)
            if len(feats) != len(batch):
                raise ValueError(f"gram feature cache {path} holds {len(feats)} images, the image set {len(batch)}: "
                                 "delete it")
        else:
            chunks, total = pixel_batches(self.classifier, batch, self.batch_size, self.name)
            feats = compute_gram_features(self.classifier, chunks, powers, layers, total)
            if path is not None:
                feats.save(path, {"model": str(self.classifier.model_id), "images": str(batch.cache_key),
                                  "layers": layers, "powers": str(powers)})
        memo[memo_key] = feats
        return feats

    # -- fit / score ----------------------------------------------------------------------------------------
    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        labels = as_numpy(getattr(id_train, "labels", None))
        if labels is None:
            raise ValueError("gram: fit needs ID training images with class labels (an ImageSet with labels)")
        train = self.features(id_train)
        labels = labels.astype(np.int64).reshape(-1)
        num_classes = train.logits.shape[1]
        if self.params["normalize"] == "train_holdout":
            fit_rows, held = holdout_split(labels, float(self.params["holdout"]), int(self.params["seed"]))
            norm_gram, norm_labels = train.gram[held], labels[held]
        else:
            if id_val is None or as_numpy(getattr(id_val, "labels", None)) is None:
                raise ValueError("gram: normalize='id_val' needs id_val images with class labels")
            fit_rows = np.arange(len(labels))
            norm_gram, norm_labels = self.features(id_val).gram, as_numpy(id_val.labels).astype(np.int64).reshape(-1)
        mins = np.zeros((num_classes, train.gram.shape[1]))
        maxs = np.zeros_like(mins)
        for c in range(num_classes):
            rows = fit_rows[labels[fit_rows] == c]
            if not len(rows):
                raise ValueError(f"gram: class {c} has no training image for its min/max; every class needs one")
            mins[c], maxs[c] = train.gram[rows].min(axis=0), train.gram[rows].max(axis=0)
        if not len(norm_labels):
            raise ValueError("gram: no image to normalise the layer deviations on (holdout empty: raise `holdout` or "
                             "use more training images per class)")
        per_layer = class_deviations(mins, maxs, norm_gram, norm_labels,
                                     np.eye(int(train.layer.max()) + 1)[train.layer])
        normalizers = per_layer.mean(axis=0)
        if np.any(normalizers <= 0):
            warnings.warn(f"gram: layers {np.flatnonzero(normalizers <= 0).tolist()} show no deviation on the "
                          "normalisation images; their deviations are left unnormalised", stacklevel=3)
            normalizers = np.where(normalizers > 0, normalizers, 1.0)
        self.mins, self.maxs, self.layer, self.normalizers = mins, maxs, train.layer, normalizers

    def _score(self, batch: Any) -> np.ndarray:
        if self.mins is None:
            raise RuntimeError("gram: call fit(id_train) before score()")
        feats = self.features(batch)
        weights = (1.0 / self.normalizers[self.layer])[:, None]
        logits = feats.logits.astype(np.float64)
        deviation = class_deviations(self.mins, self.maxs, feats.gram, logits.argmax(axis=1), weights)[:, 0]
        return -deviation / softmax(logits, axis=1).max(axis=1)

    def state(self) -> dict[str, np.ndarray]:
        out = super().state()
        if self.mins is not None:
            out.update({"mins": self.mins, "maxs": self.maxs, "layer": self.layer, "normalizers": self.normalizers})
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        if "mins" in state:
            self.mins, self.maxs, self.layer, self.normalizers = (state["mins"], state["maxs"], state["layer"],
                                                                  state["normalizers"])


def holdout_split(labels: np.ndarray, fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """(fit rows, held-out rows): int(fraction * n_c) random rows of each class c held out (OpenOOD's 10% split)."""
    rng = np.random.default_rng(seed)
    held = []
    for c in np.unique(labels):
        rows = np.flatnonzero(labels == c)
        held.append(rng.choice(rows, size=int(fraction * len(rows)), replace=False))
    held_rows = np.sort(np.concatenate(held)) if held else np.zeros(0, np.int64)
    return np.setdiff1d(np.arange(len(labels)), held_rows), held_rows


def class_deviations(mins: np.ndarray, maxs: np.ndarray, gram: np.ndarray, classes: np.ndarray,
                     weights: np.ndarray) -> np.ndarray:
    """[N, W] = (entry-wise deviation of each row from the bounds of its class) @ weights [F, W], in float64.

    Rows are taken in blocks and, within a block, class by class, so no [N, F] copy of the bounds is made.
    """
    out = np.zeros((len(gram), weights.shape[1]))
    for start in range(0, len(gram), ROW_BLOCK):
        block = np.asarray(gram[start:start + ROW_BLOCK], dtype=np.float64)
        labels = classes[start:start + ROW_BLOCK]
        for c in np.unique(labels):
            rows = np.flatnonzero(labels == c)
            out[start + rows] = gram_deviation(mins[c], maxs[c], block[rows]) @ weights
    return out
