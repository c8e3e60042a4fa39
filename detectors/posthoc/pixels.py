"""Shared by the post-hoc detectors that run the classifier on pixels (ODIN, RP-ODIN, RankFeat, MDSEns): batches of
normalised pixel values from an ImageSet or a tensor, and eval mode restored module by module afterwards.

Within `pixel_memo(megabytes)` the preprocessed batches of manifest images are kept in memory (least recently used
first out), keyed by the classifier's preprocessing and each image file's identity (`pipelines.fingerprint`): an
image-level sweep scores the same validation images at every grid point, and decoding and resizing them once is
enough. What a batch holds is the same tensor values either way, so scores are bitwise equal with and without it.
"""
from __future__ import annotations

import contextvars
import json
import math
from collections import OrderedDict
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from detectors.base import ImageSet, as_numpy

_MEMO: contextvars.ContextVar["PixelMemo | None"] = contextvars.ContextVar("pixel_memo", default=None)


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
    """The classifier's preprocessing of `batch`, `batch_size` images at a time (kept ones from `pixel_memo`)."""
    memo = _MEMO.get()
    if memo is None or batch.manifest is None:
        yield from (classifier.preprocess(images) for _, images in batch.batches(batch_size))
        return
    from pipelines.fingerprint import file_identity, preprocessing_fingerprint

    setting = preprocessing_fingerprint(classifier)
    for start in range(0, len(batch), batch_size):
        stop = min(start + batch_size, len(batch))
        paths = [batch.manifest.path(row) for row in batch.manifest.rows[start:stop]]
        key = (setting, json.dumps([[str(path), file_identity(path)] for path in paths]))
        x = memo.get(key)
        if x is None:
            x = classifier.preprocess([batch.load(i) for i in range(start, stop)])
            memo.put(key, x)
        yield x


def pixel_batches(classifier: Any, batch: Any, batch_size: int, who: str) -> tuple[Iterator[torch.Tensor], int]:
    """Normalised pixel-value batches [b,3,H,W] of an ImageSet (the classifier's preprocessing) or a float tensor of
    preprocessed images, on the classifier's device and dtype; and their number."""
    param = next(classifier.parameters())

    def moved(chunks: Any) -> Iterator[torch.Tensor]:
        return (x.to(device=param.device, dtype=param.dtype) for x in chunks)

    if isinstance(batch, ImageSet):
        return moved(preprocessed(classifier, batch, batch_size)), math.ceil(len(batch) / batch_size)
    if isinstance(batch, torch.Tensor) and batch.ndim == 4 and batch.is_floating_point():
        return moved(batch.split(batch_size)), math.ceil(len(batch) / batch_size)
    raise TypeError(f"{who}: takes an ImageSet or a float tensor [B,3,H,W] of preprocessed images, got {type(batch).__name__}")


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
