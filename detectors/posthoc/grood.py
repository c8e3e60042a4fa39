"""GROOD (ElAraby et al., 2025): the gradient of a nearest-prototype loss with respect to an OOD prototype, scored by
its distance to the nearest such gradient of correctly classified ID training samples.

OpenOOD (`openood/postprocessors/grood.py`; `configs/postprocessors/grood.yaml`) averages the penultimate features of
each class over the ID train loader (`update_prototype`, `:918-951`; classes never seen keep a zero prototype) and,
with its default `use_val_ood: True` (`grood.yaml:19`), the OOD prototype over whole OOD-val batches until
`n_noise_samples` (100, `grood.yaml:8`) rows are read (`get_val_ood`, `:191-212`). The nearest-centroid logits are
s_j = -||h - p_j|| over the C class prototypes and the OOD one (`compute_ncc_loss`, `:706-721`); the loss is the
cross-entropy with the classifier's argmax as the target (`:709, :733-737`), whose gradient with respect to the OOD
prototype p_N (`_compute_grad`, `:828-833`) is softmax(s)_N (h - p_N) / ||h - p_N||. The gradients of the training rows
the classifier gets right (`:825`) go into a faiss `IndexIVFFlat` (`index_grads`, `:648-694`): nlist = int(4 sqrt(T))
lists trained on the gradients of the first T = min(600, int(0.8 n_batches)) train batches, those added, the next
batch left out (the loop trains instead of adding at that batch, `:682-687`), the rest added, nprobe 4. The score is
minus the squared L2 distance from the sample's gradient to its nearest indexed one (`postprocess`, `:871-872`).

Here batches are `train_batch_rows` / `ood_batch_rows` consecutive rows (OpenOOD's CIFAR loaders: 128 train rows,
shuffled, `configs/datasets/cifar10/cifar10.yml:20`; 200 OOD-val rows); the gradient is computed in closed form
(float64, then float32 for faiss) where the reference back-propagates each row in float32. `index: "flat"` searches
all the gradients exactly instead, as does "ivf" where the reference cannot train its index (one train batch, or
fewer right rows than lists: it fails there). The APS sweep of `grood.yaml:25-33` changes no score
(`set_hyperparam`, `:953-959`, sets attributes that only `setup` reads, and `setup` does not run again): APS off
here. The options off by default
(uniform-noise images, synthetic mixup OOD through intermediate layers, cosine index, gradient norm, direct distances)
are not ported; `noise: "prototype_mean"` is `use_proto_mean` (`:214-219`).
"""
from __future__ import annotations

import logging
import math
from dataclasses import dataclass
from typing import Literal

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import labels_of, stored_features, stored_logits
from detectors.registry import register_detector
from pipelines.params import Params, param

log = logging.getLogger(__name__)

NPROBE = 4
"""grood.py:694."""
MAX_TRAIN_BATCHES = 600
"""grood.py:659: at most 600 batches train the inverted file."""


def noise_gradients(h: np.ndarray, prototypes: np.ndarray, noise: np.ndarray) -> np.ndarray:
    """float32 [n, D]: d CE(s, y) / d p_N = softmax(s)_N (h - p_N) / ||h - p_N|| with s_j = -||h - p_j|| over the class
    prototypes and the OOD one p_N (any target y < N gives it); 0 where h = p_N (torch's norm gradient there)."""
    h = np.asarray(h, dtype=np.float64)
    away = h - noise
    own = np.sqrt(np.einsum("nd,nd->n", away, away))
    sq = (np.einsum("nd,nd->n", h, h)[:, None] - 2.0 * (h @ prototypes.T)
          + np.einsum("cd,cd->c", prototypes, prototypes)[None, :])
    s = -np.concatenate([np.sqrt(np.maximum(sq, 0.0)), own[:, None]], axis=1)
    s -= s.max(axis=1, keepdims=True)
    np.exp(s, out=s)
    proba = s[:, -1] / s.sum(axis=1)
    unit = away / np.where(own > 0, own, 1.0)[:, None]
    return (proba[:, None] * unit).astype(np.float32)


def first_rows(n_rows: int, wanted: int, batch: int) -> int:
    """Rows the reference reads: whole batches until it has at least `wanted` (all rows when fewer)."""
    return min(n_rows, -(-wanted // batch) * batch)


@register_detector("grood")
class GROOD(Detector):
    """s(h) = -min_i ||g(h) - g_i||^2, g = the gradient of the nearest-prototype cross-entropy w.r.t. the OOD prototype,
    g_i those of the correctly classified ID training rows (a faiss IVF index by default, as OpenOOD)."""

    label = "GROOD"
    reference_code = "OpenOOD openood/postprocessors/grood.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = ("ElAraby et al., GROOD: Gradient-Aware Out-of-Distribution Detection, TMLR 2025 (arXiv 2312.14427)")

    @dataclass(frozen=True)
    class Params(Params):
        n_noise_samples: int = param(100, "OOD-val rows averaged into the OOD prototype, rounded up to whole "
                                     "`ood_batch_rows` batches (grood.yaml:8)", ge=1)
        noise: Literal["ood_val", "prototype_mean"] = param(
            "ood_val", "the OOD prototype: the OOD-val mean (grood.yaml:19 use_val_ood) or the mean of the class "
            "prototypes (use_proto_mean)")
        index: Literal["ivf", "flat"] = param("ivf", "'ivf': OpenOOD's faiss IndexIVFFlat (approximate, nprobe 4); "
                                              "'flat': exact nearest gradient")
        train_batch_rows: int = param(128, "rows per ID-train batch, which sizes the IVF (OpenOOD's CIFAR train "
                                      "loader: 128)", ge=1)
        ood_batch_rows: int = param(200, "rows per OOD-val batch (OpenOOD's val/test loaders: 200)", ge=1)

    fit_inputs = frozenset({"ood_val"})

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        labels, logits = labels_of(id_train, self.name), stored_logits(id_train, self.name)
        if len(h) == 0:
            raise ValueError("grood: the training set has no rows")
        classes = logits.shape[1]
        if labels.min() < 0 or labels.max() >= classes:
            raise ValueError(f"grood: labels must lie in [0, {classes}) (the logits' width)")
        stats = streaming.moments(h, labels, scatter=False)
        self.prototypes = np.zeros((classes, h.shape[1]))  # a class without rows keeps 0, as the reference
        self.prototypes[stats.groups] = stats.means()
        self.noise_prototype = self._noise(ood_val)
        kept, rows = [], []
        for part, block in streaming.chunks(h):
            right = np.argmax(logits[part], axis=1) == labels[part]
            kept.append(noise_gradients(block[right], self.prototypes, self.noise_prototype))
            rows.append(np.arange(part.start, part.stop)[right])
        grads, rows = np.concatenate(kept), np.concatenate(rows)
        self._index = self._build(grads, rows, len(h))

    def _noise(self, ood_val) -> np.ndarray:
        if self.params["noise"] == "prototype_mean":
            return self.prototypes.mean(axis=0)
        if ood_val is None:
            raise ValueError("grood: noise='ood_val' (OpenOOD's default) needs fit(..., ood_val=FeatureSet); "
                             "noise='prototype_mean' needs none")
        ood = stored_features(ood_val, self.name)
        if len(ood) == 0:
            raise ValueError("grood: ood_val has no rows")
        return streaming.column_mean(ood[:first_rows(len(ood), self.params["n_noise_samples"],
                                                     self.params["ood_batch_rows"])])

    def _build(self, grads: np.ndarray, rows: np.ndarray, n_rows: int):
        """The faiss index over the gradients (rows: their training row numbers)."""
        import faiss

        dim = self.prototypes.shape[1]
        batch = self.params["train_batch_rows"]
        train_batches = min(MAX_TRAIN_BATCHES, int(-(-n_rows // batch) * 0.8))
        nlist = int(4 * math.sqrt(train_batches))
        first = rows < train_batches * batch
        if self.params["index"] == "ivf" and (nlist == 0 or first.sum() < nlist):
            log.warning("grood: the IVF's %d lists cannot be trained on the gradients of the first %d train batches "
                           "(%d correctly classified rows; the reference fails here): searching exactly", nlist,
                           train_batches, int(first.sum()))
        if self.params["index"] == "flat" or nlist == 0 or first.sum() < nlist:
            index = faiss.IndexFlatL2(dim)
            index.add(np.ascontiguousarray(grads))
            return index
        skipped = (rows >= train_batches * batch) & (rows < (train_batches + 1) * batch)
        index = faiss.IndexIVFFlat(faiss.IndexFlatL2(dim), dim, nlist, faiss.METRIC_L2)
        index.train(np.ascontiguousarray(grads[first]))
        index.add(np.ascontiguousarray(grads[first]))
        index.add(np.ascontiguousarray(grads[~first & ~skipped]))
        index.nprobe = NPROBE
        return index

    def _score(self, batch) -> np.ndarray:
        def rows(_, block: np.ndarray) -> np.ndarray:
            if len(block) == 0:
                return np.empty(0)
            distances, _ = self._index.search(noise_gradients(block, self.prototypes, self.noise_prototype), 1)
            return -distances[:, 0].astype(np.float64)

        return streaming.map_rows(rows, stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        import faiss

        return {**super().state(), "prototypes": self.prototypes, "noise_prototype": self.noise_prototype,
                "faiss_index": faiss.serialize_index(self._index)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        import faiss

        super().load_state(state)
        self.prototypes, self.noise_prototype = state["prototypes"], state["noise_prototype"]
        self._index = faiss.deserialize_index(np.asarray(state["faiss_index"], dtype=np.uint8))
        if isinstance(self._index, faiss.IndexIVF):
            self._index.nprobe = NPROBE
