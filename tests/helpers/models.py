"""Tiny image classifiers for pixel-level detector tests, built through the real loading code."""
from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import torch

from pipelines.classifier import ImageClassifier


def tiny_resnet_classifier(folder: str | Path, classes: int = 3, seed: int = 0, size: int = 16,
                           mean: Sequence[float] = (0.5, 0.5, 0.5),
                           std: Sequence[float] = (0.5, 0.5, 0.5)) -> ImageClassifier:
    """A random-weight tiny ResNet (the digits demo's config) with a `size` x `size` processor, saved to `folder` and
    reloaded with `ImageClassifier.from_pretrained` (the hub path)."""
    from transformers import ResNetForImageClassification, ViTImageProcessor

    from pipelines.toydata import tiny_digit_classifier_config

    torch.manual_seed(seed)
    config, _ = tiny_digit_classifier_config(num_labels=classes)
    processor = ViTImageProcessor(size={"height": size, "width": size}, image_mean=list(mean), image_std=list(std))
    ResNetForImageClassification(config).save_pretrained(folder)
    processor.save_pretrained(folder)
    return ImageClassifier.from_pretrained(folder)


def small_conv_classifier(seed: int = 0, num_classes: int = 4) -> ImageClassifier:
    """The DIFFGUARD benchmarks' small conv net (32 x 32 inputs) wrapped as an ImageClassifier."""
    from benchmarks.cases.diffguard import SmallConvClassifier

    torch.manual_seed(seed)
    return ImageClassifier.from_module(SmallConvClassifier(num_classes).eval(), image_size=32).eval()


def stub_weights(path: str | Path, fill: float = 0.0) -> Path:
    """A valid safetensors weight file that is never loaded (config checks read its header): one 16-float tensor of
    `fill`, so two fills give files of the same size and different bytes."""
    import numpy as np
    from safetensors.numpy import save_file

    save_file({"w": np.full(16, fill, np.float32)}, str(path))
    return Path(path)
