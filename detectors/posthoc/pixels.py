"""Shared by the post-hoc detectors that run the classifier on pixels (RankFeat, MDSEns, RP-ODIN): batches of
normalised pixel values from an ImageSet or a tensor, and eval mode restored module by module afterwards."""
from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Any, Iterator

import numpy as np
import torch

from detectors.base import ImageSet, as_numpy


def pixel_batches(classifier: Any, batch: Any, batch_size: int, who: str) -> tuple[Iterator[torch.Tensor], int]:
    """Normalised pixel-value batches [b,3,H,W] of an ImageSet (the classifier's preprocessing) or a float tensor of
    preprocessed images, on the classifier's device and dtype; and their number."""
    param = next(classifier.parameters())

    def moved(chunks: Any) -> Iterator[torch.Tensor]:
        return (x.to(device=param.device, dtype=param.dtype) for x in chunks)

    if isinstance(batch, ImageSet):
        chunks = (classifier.preprocess(images) for _, images in batch.batches(batch_size))
        return moved(chunks), math.ceil(len(batch) / batch_size)
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
