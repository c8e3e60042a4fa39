"""Shared by the post-hoc detectors that run the classifier on pixels (ODIN, RP-ODIN, RankFeat, MDSEns, Gram): batches
of normalised pixel values from an ImageSet (made by its pixels or the classifier's evaluation pixels, in loader
workers, normalised on the device) or a tensor, and eval mode restored module by module afterwards.

Within `pixel_memo(megabytes)` the pixel batches of manifest images (uint8 for the transforms of `pipelines.pixels`)
are kept in memory (least recently used first out), keyed by the classifier's preprocessing, the set's own pixels and
each image file's identity (`pipelines.fingerprint`): an image-level sweep scores the same validation images at every
grid point, and decoding and resizing them once is enough. What a batch holds is the same tensor values either way, so
scores are bitwise equal with and without it.
"""
from __future__ import annotations

import contextvars
import json
import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from detectors.base import ImageSet, as_numpy

_MEMO: contextvars.ContextVar[PixelMemo | None] = contextvars.ContextVar("pixel_memo", default=None)


class PixelMemo:
    """Preprocessed batches by key, at most `budget` bytes, the least recently used evicted first."""

    def __init__(self, budget: int) -> None:
        self.budget, self.used, self.hits, self.misses = int(budget), 0, 0, 0
        self.entries: OrderedDict[Any, torch.Tensor] = OrderedDict()

    def get(self, key: Any) -> torch.Tensor | None:
        found = self.entries.get(key)
        if found is None:
            self.misses += 1
            return None
        self.hits += 1
        self.entries.move_to_end(key)
        return found.clone()  # a detector may change its batch in place: the kept one stays as preprocessed

    def put(self, key: Any, x: torch.Tensor) -> None:
        size = x.element_size() * x.nelement()
        if size > self.budget:
            return
        while self.entries and self.used + size > self.budget:
            _, old = self.entries.popitem(last=False)
            self.used -= old.element_size() * old.nelement()
        self.entries[key] = x.detach().clone()
        self.used += size


@contextmanager
def pixel_memo(megabytes: float) -> Iterator[PixelMemo | None]:
    """Keep preprocessed manifest batches in memory inside the block, up to `megabytes` (0: keep none)."""
    memo = PixelMemo(int(megabytes * 2**20)) if megabytes > 0 else None
    token = _MEMO.set(memo)
    try:
        yield memo
    finally:
        _MEMO.reset(token)


def preprocessed(classifier: Any, batch: ImageSet, batch_size: int) -> Iterator[torch.Tensor]:
    """The pixels of `batch` (its own `pixels`, else the classifier's evaluation pixels: `ImageSet.pixel_batches`),
    `batch_size` images at a time, not yet normalised; within `pixel_memo` a manifest's batches are kept (all of them
    read back when every one is kept, else all made again)."""
    memo = _MEMO.get()
    if memo is None or batch.manifest is None:
        yield from (x for _, x in batch.pixel_batches(classifier.pixels, batch_size))
        return
    from pipelines.fingerprint import file_identity, preprocessing_fingerprint

    setting = json.dumps([preprocessing_fingerprint(classifier), batch.pixels_identity()], default=str)
    keys = []
    for start in range(0, len(batch), batch_size):
        paths = [batch.manifest.path(row) for row in batch.manifest.rows[start:start + batch_size]]
        keys.append((setting, batch.offset + start, json.dumps([[str(p), file_identity(p)] for p in paths])))
    kept = [memo.get(key) for key in keys]
    if all(x is not None for x in kept):
        yield from kept
        return
    for key, (_, x) in zip(keys, batch.pixel_batches(classifier.pixels, batch_size)):
        memo.put(key, x)
        yield x


def pixel_batches(classifier: Any, batch: Any, batch_size: int, who: str) -> tuple[Iterator[torch.Tensor], int]:
    """Normalised pixel-value batches [b,3,H,W] of an ImageSet (its pixels, normalised on the classifier's device by
    `classifier.standardize`) or of a float tensor of preprocessed images, on the classifier's device and dtype; and
    their number."""
    param = next(classifier.parameters())

    def moved(chunks: Any) -> Iterator[torch.Tensor]:
        return (classifier.standardize(x.to(device=param.device)).to(dtype=param.dtype) for x in chunks)

    if isinstance(batch, ImageSet):
        return moved(preprocessed(classifier, batch, batch_size)), math.ceil(len(batch) / batch_size)
    if isinstance(batch, torch.Tensor) and batch.ndim == 4 and batch.is_floating_point():
        return moved(batch.split(batch_size)), math.ceil(len(batch) / batch_size)
    raise TypeError(f"{who}: takes an ImageSet or a float tensor [B,3,H,W] of preprocessed images, got "
                    f"{type(batch).__name__}{tuple(batch.shape) if isinstance(batch, torch.Tensor) else ''}")


def labels_of_images(data: Any, who: str) -> np.ndarray:
    """int64 class labels of an ImageSet (or anything with `labels`)."""
    labels = as_numpy(getattr(data, "labels", None))
    if labels is None:
        raise ValueError(f"{who}: fit needs ID training images with class labels (an ImageSet with labels)")
    return labels.astype(np.int64).reshape(-1)


@contextmanager
def eval_mode(model: torch.nn.Module) -> Iterator[torch.nn.Module]:
    """The model in eval mode inside the block; each module's training flag restored after."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield model
    finally:
        for module, training in modes:
            module.training = training
