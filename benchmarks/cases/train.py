"""Measurements behind `benchmarks/train.py` and the training case of `benchmarks/gpu.py`: images per second of
classifier training (`finetune` with the recipe transforms) and of feature extraction (`extract_features`), each
against a minimal hand-written PyTorch loop on the same model and data in the same process, the data pipeline's
capacity and the share of time spent decoding images, and peak RSS.

`decode_share` = the seconds one process needs to decode and crop the epoch's images / the whole training seconds (with
DataLoader workers that work runs beside the model); `loader_capacity_ratio` = training seconds / the loader's own
seconds at the same worker count (> 1: the loader outpaces training, so data is not the bottleneck)."""
from __future__ import annotations

import copy
import math
import resource
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image
from torch.utils.data import DataLoader, Dataset

from pipelines.classifier import ImageClassifier
from pipelines.data import Manifest, load_image, make_row, write_manifest
from pipelines.training.transforms import Normalize, reference_train


def synthetic_manifest(folder: Path, n: int, side: int, classes: int = 4, seed: int = 0) -> Manifest:
    """n smooth random JPEG images (side x side) with labels 0..classes-1 as a train manifest."""
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True, exist_ok=True)
    rows = []
    for i in range(n):
        base = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
        image = Image.fromarray(base).resize((side, side), Image.BICUBIC)
        image.save(folder / f"{i}.jpg", quality=90)
        rows.append(make_row(f"{i}.jpg", split="train", label=i % classes))
    return write_manifest(folder, rows)


class _PlainRows(Dataset):
    """The hand-written baseline's dataset: decode, random resized crop + flip, uint8 tensor."""

    def __init__(self, manifest: Manifest, size: int, seed: int):
        self.manifest, self.crop, self.seed = manifest, reference_train("imagenet", size, size), seed

    def __len__(self) -> int:
        return len(self.manifest)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        row = self.manifest.rows[i]
        return self.crop(load_image(self.manifest.path(row)), np.random.default_rng([self.seed, i])), row["label"]


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def baseline_training(classifier: ImageClassifier, manifest: Manifest, *, epochs: int, batch_size: int,
                      num_workers: int, device: torch.device, dtype: torch.dtype, channels_last: bool) -> float:
    """Seconds of a minimal PyTorch training loop (AdamW, cosine, autocast) with the same transforms."""
    model = classifier.to(device).train()
    if channels_last:
        model.to(memory_format=torch.channels_last)
    loader = DataLoader(_PlainRows(manifest, classifier.image_size[0], 0), batch_size=batch_size, shuffle=True,
                        num_workers=num_workers, drop_last=True, pin_memory=device.type == "cuda")
    normalize = Normalize(classifier.mean.flatten().tolist(), classifier.std.flatten().tolist(), channels_last)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=1e-5)
    total = epochs * len(loader)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 0.5 * (1 + math.cos(math.pi * s / total)))
    start = time.perf_counter()
    for _ in range(epochs):
        for x, y in loader:
            x, y = normalize(x.to(device, non_blocking=True)), y.to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                loss = F.cross_entropy(model(x)[0].float(), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            schedule.step()
    _sync(device)
    return time.perf_counter() - start


def ours_training(classifier: ImageClassifier, manifest: Manifest, *, epochs: int, batch_size: int, num_workers: int,
                  precision: str, channels_last: bool, device: torch.device) -> float:
    """Seconds of `finetune` with the recipe transforms (no validation, no checkpoint)."""
    from pipelines.training.classify import transforms_for
    from pipelines.training.loop import finetune

    start = time.perf_counter()
    finetune(classifier, manifest, epochs=epochs, batch_size=batch_size, lr=1e-3, warmup_epochs=0, precision=precision,
             num_workers=num_workers, transforms=transforms_for(classifier), channels_last=channels_last)
    _sync(device)
    return time.perf_counter() - start


def loader_seconds(classifier: ImageClassifier, manifest: Manifest, *, epochs: int, batch_size: int,
                   num_workers: int) -> float:
    """Seconds to produce the training batches alone (decode + crop + collate), no model."""
    loader = DataLoader(_PlainRows(manifest, classifier.image_size[0], 0), batch_size=batch_size, shuffle=True,
                        num_workers=num_workers, drop_last=True)
    start = time.perf_counter()
    for _ in range(epochs):
        for _batch in loader:
            pass
    return time.perf_counter() - start


def baseline_features(classifier: ImageClassifier, manifest: Manifest, *, batch_size: int, device: torch.device,
                      dtype: torch.dtype) -> float:
    """Seconds of a minimal feature-extraction loop: decode, the classifier's processor, forward, keep features."""
    model = classifier.to(device).eval()
    paths = manifest.paths()
    start = time.perf_counter()
    kept = []
    with torch.inference_mode():
        for first in range(0, len(paths), batch_size):
            images = [load_image(p) for p in paths[first: first + batch_size]]
            x = model.preprocess(images).to(device)
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                kept.append(model(x)[1].float().cpu())
    _sync(device)
    return time.perf_counter() - start


def peak_rss_mib() -> dict[str, float]:
    """Peak resident memory of this process and of its finished children (DataLoader workers), MiB."""
    return {"self": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
            "children": resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024}


def measure(classifier: ImageClassifier, manifest: Manifest, *, epochs: int, batch_size: int, num_workers: int,
            precision: str, channels_last: bool, device: torch.device, repeats: int = 2) -> dict[str, Any]:
    """Every number of the training benchmark for one (model, data, settings). Each pair of loops runs `repeats`
    times, interleaved (baseline, ours, baseline, ours, ...), on fresh model copies; the best time of each counts."""
    from pipelines.runtime import resolve_dtype

    dtype = resolve_dtype(precision, device)
    n = epochs * (len(manifest) // batch_size) * batch_size
    common = dict(epochs=epochs, batch_size=batch_size, num_workers=num_workers, device=device,
                  channels_last=channels_last)
    base, ours, plain, feats = [], [], [], []
    for _ in range(repeats):
        base.append(baseline_training(copy.deepcopy(classifier), manifest, dtype=dtype, **common))
        ours.append(ours_training(copy.deepcopy(classifier), manifest, precision=precision, **common))
        plain.append(baseline_features(copy.deepcopy(classifier), manifest, batch_size=batch_size, device=device,
                                       dtype=dtype))
        feats.append(ours_features(copy.deepcopy(classifier), manifest, batch_size=batch_size, device=device,
                                   precision=precision, num_workers=num_workers))
    loader = loader_seconds(classifier, manifest, epochs=epochs, batch_size=batch_size, num_workers=num_workers)
    decode = loader_seconds(classifier, manifest, epochs=1, batch_size=batch_size, num_workers=0) * epochs
    return {"train_images": n, "train_images_per_s": n / min(ours), "baseline_train_images_per_s": n / min(base),
            "train_ratio": min(base) / min(ours), "loader_images_per_s": n / loader,
            "loader_capacity_ratio": min(ours) / loader, "decode_share": decode / min(ours),
            "feature_images_per_s": len(manifest) / min(feats),
            "baseline_feature_images_per_s": len(manifest) / min(plain),
            "feature_ratio": min(plain) / min(feats), "repeats": repeats, "peak_rss_mib": peak_rss_mib()}


def ours_features(classifier: ImageClassifier, manifest: Manifest, *, batch_size: int, device: torch.device,
                  precision: str, num_workers: int) -> float:
    """Seconds of `extract_features` over the manifest (no cache file)."""
    from pipelines.features import extract_features

    start = time.perf_counter()
    extract_features(classifier, manifest, batch_size=batch_size, device=str(device), precision=precision,
                     num_workers=num_workers)
    _sync(device)
    return time.perf_counter() - start
