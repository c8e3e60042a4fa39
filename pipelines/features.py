"""One pass of a classifier over a manifest split -> a `FeatureCache` (safetensors), reused by every detector.

Cache file tensors: `features [N,D]`, `logits [N,C]`, `labels [N]`, `index [N]` (row in the manifest selection),
`head.weight [C,D]`, `head.bias [C]`; metadata: model id, manifest fingerprint, dtype, failures (JSON).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset

from pipelines.arrays import FeatureSet, LinearHead
from pipelines.classifier import ImageClassifier
from pipelines.collectives import all_gather, host, main_decides, share
from pipelines.data import ImageLoadError, Manifest
from pipelines.errors import UserInputError
from pipelines.io import atomic_path, safe_name
from pipelines.progress import progress
from pipelines.runtime import partial_state, resolve_device, resolve_dtype

log = logging.getLogger(__name__)


@dataclass
class FeatureCache:
    """Classifier outputs for the rows of one manifest selection, plus the head that produced the logits."""

    features: np.ndarray
    logits: np.ndarray
    labels: np.ndarray
    index: np.ndarray
    head_weight: np.ndarray
    head_bias: np.ndarray
    metadata: dict[str, Any] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.index)

    def to_featureset(self) -> FeatureSet:
        """The arrays as a `FeatureSet`."""
        return FeatureSet(self.features, self.logits, self.labels)

    def head(self) -> LinearHead:
        """The classifier head as a `LinearHead`."""
        return LinearHead(self.head_weight, self.head_bias)

    @property
    def failures(self) -> list[dict[str, Any]]:
        return self.metadata.get("failures", [])

    def save(self, path: str | os.PathLike) -> Path:
        """Write atomically to a safetensors file."""
        from safetensors.numpy import save_file

        tensors = {"features": self.features, "logits": self.logits, "labels": self.labels, "index": self.index,
                   "head.weight": self.head_weight, "head.bias": self.head_bias}
        meta = {k: v if isinstance(v, str) else json.dumps(v) for k, v in self.metadata.items()}
        with atomic_path(path) as tmp:
            save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(tmp), metadata=meta)
        return Path(path)

    @classmethod
    def load(cls, path: str | os.PathLike, mmap: bool = False) -> FeatureCache:
        """Read a cache written by `save`. With `mmap=True` the arrays are read-only `np.memmap`s of the file
        (nothing is read until used; detectors stream them in chunks), else they are loaded into memory."""
        if mmap:
            arrays, raw = map_safetensors(path)
        else:
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as fh:
                arrays = {k: fh.get_tensor(k) for k in fh.keys()}
                raw = fh.metadata() or {}
        meta: dict[str, Any] = {}
        for k, v in raw.items():
            try:
                meta[k] = json.loads(v)
            except json.JSONDecodeError:
                meta[k] = v
        missing = [k for k in ("features", "logits", "labels", "index", "head.weight", "head.bias") if k not in arrays]
        if missing:
            raise ValueError(f"{path}: not a feature cache, tensors {missing} missing")
        return cls(arrays["features"], arrays["logits"], arrays["labels"], arrays["index"], arrays["head.weight"],
                   arrays["head.bias"], meta)


SAFETENSORS_DTYPES = {"F64": np.float64, "F32": np.float32, "F16": np.float16, "I64": np.int64, "I32": np.int32,
                      "I16": np.int16, "I8": np.int8, "U8": np.uint8, "BOOL": np.bool_}


def map_safetensors(path: str | os.PathLike) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Read-only np.memmap views of every tensor of a safetensors file, and its metadata.

    The format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape, data_offsets},
    "__metadata__"}, then the raw little-endian tensor bytes, offsets counted from the end of the header.
    """
    path = Path(path)
    with open(path, "rb") as fh:
        prefix = fh.read(8)
        if len(prefix) != 8:
            raise ValueError(f"{path}: not a safetensors file (shorter than its 8-byte header length)")
        length = int.from_bytes(prefix, "little")
        if length > path.stat().st_size - 8:  # a foreign file (a pickle's first bytes): never read gigabytes for it
            raise ValueError(f"{path}: not a safetensors file (its header length {length} exceeds the file)")
        try:
            header = json.loads(fh.read(length))
        except (json.JSONDecodeError, UnicodeDecodeError) as err:
            raise ValueError(f"{path}: not a safetensors file (unreadable header: {err})") from None
    start = 8 + length
    size = path.stat().st_size
    arrays = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        dtype = SAFETENSORS_DTYPES.get(info.get("dtype"))
        if dtype is None:
            raise ValueError(f"{path}: tensor {name!r} has dtype {info.get('dtype')!r}, which numpy cannot memory-map")
        begin, end = info["data_offsets"]
        shape = tuple(info["shape"])
        if end - begin != int(np.prod(shape, dtype=np.int64)) * np.dtype(dtype).itemsize or start + end > size:
            raise ValueError(f"{path}: tensor {name!r} data_offsets {info['data_offsets']} do not match shape {shape}")
        if end == begin:
            arrays[name] = np.zeros(shape, dtype=np.dtype(dtype).newbyteorder("<"))
        else:
            arrays[name] = np.memmap(path, dtype=np.dtype(dtype).newbyteorder("<"), mode="r", offset=start + begin,
                                     shape=shape)
    return arrays, header.get("__metadata__") or {}


def cache_path(cache_dir: str | os.PathLike, name: str, key: str) -> Path:
    """`cache_dir/<name>-<key>.safetensors`; `key` is a content key (`pipelines.fingerprint`) of everything that decides
    the cache's content, so a changed model, preprocessing, precision, row or image file never reuses a stale file."""
    return Path(cache_dir) / f"{safe_name(name)}-{key}.safetensors"


class ManifestPixels(Dataset):
    """Manifest rows by position -> (position, pixels or None, failure reason): `pixels.load(path, rng)` runs where
    the item is made (a loader worker), with `rng` seeded by (seed, offset + position), so a random fit transform draws
    the same pixels whatever the workers (`offset`: where these rows start in a larger set); an unreadable image gives
    its reason instead of a crash."""

    def __init__(self, manifest: Manifest, positions: list[int], pixels: Any, seed: int = 0, offset: int = 0):
        self.manifest, self.positions, self.pixels = manifest, positions, pixels
        self.seed, self.offset = int(seed), int(offset)

    def __len__(self) -> int:
        return len(self.positions)

    def __getitem__(self, i: int) -> tuple[int, torch.Tensor | None, str]:
        pos = self.positions[i]
        try:
            path = self.manifest.path(self.manifest.rows[pos])
            return pos, self.pixels.load(path, np.random.default_rng([self.seed, self.offset + pos])), ""
        except ImageLoadError as err:
            return pos, None, err.reason


def collate_pixels(items: list[tuple[int, torch.Tensor | None, str]]) -> tuple[list[int], torch.Tensor | None,
                                                                               list[tuple[int, str]]]:
    """(positions of the loaded rows, their pixels stacked, (position, reason) of the others); runs in the worker."""
    good = [(pos, x) for pos, x, _ in items if x is not None]
    stacked = torch.stack([x for _, x in good]) if good else None
    return [pos for pos, _ in good], stacked, [(pos, reason) for pos, x, reason in items if x is None]


def pixel_loader(dataset: Dataset, batch_size: int, num_workers: int | None) -> DataLoader:
    """Batches of `collate_pixels` in order; `num_workers` None: `pipelines.pixels.default_workers()`."""
    from pipelines.pixels import default_workers

    workers = default_workers() if num_workers is None else int(num_workers)
    return DataLoader(dataset, batch_size=batch_size, num_workers=workers, collate_fn=collate_pixels,
                      pin_memory=torch.cuda.is_available(), persistent_workers=False,
                      prefetch_factor=4 if workers else None)


def _reusable(cache: str | os.PathLike | None, manifest: Manifest, model_id: str,
              key: str | None) -> FeatureCache | None:
    """The cache file when it holds this content `key` (without a key: the same manifest fingerprint and model id)."""
    if cache is None or not Path(cache).is_file():
        return None
    try:
        found = FeatureCache.load(cache, mmap=True)
    except (OSError, ValueError, KeyError, TypeError) as err:  # a truncated, foreign or planted file: computed again
        log.warning("[oodforge] ignoring the feature cache %s: %s; it will be rewritten", cache,
                    " ".join(str(err).split())[:200])
        return None
    same = (found.metadata.get("key") == key if key is not None else
            found.metadata.get("manifest") == manifest.fingerprint() and found.metadata.get("model") == model_id)
    return found if same else None


def _run_shard(classifier: ImageClassifier, manifest: Manifest, loader: DataLoader,
               device: torch.device, dtype: torch.dtype, bar: Any) -> tuple[list, list, list[int], list[dict]]:
    """Features, logits, row positions and failures of this process's rows (pixels normalised on the device)."""
    feats, logits, index, failures = [], [], [], []
    for positions, pixels, failed in loader:
        failures += [{"index": p, "file": manifest.rows[p]["file_name"], "reason": reason} for p, reason in failed]
        if pixels is not None:
            x = classifier.standardize(pixels.to(device, non_blocking=True))
            with torch.autocast(device.type, dtype=dtype, enabled=dtype != torch.float32):
                z, h = classifier(x)
            feats.append(h.float().cpu().numpy())
            logits.append(z.float().cpu().numpy())
            index += positions
        bar.update(len(positions) + len(failed))
    bar.close()
    return feats, logits, index, failures


def _assemble(parts: list[tuple], classifier: ImageClassifier, manifest: Manifest, key: str | None,
              dtype: torch.dtype) -> FeatureCache:
    """The processes' parts in manifest order as one cache."""
    dim, classes = classifier.head.in_features, classifier.head.out_features
    all_feats = [a for p in parts for a in p[0]]
    all_logits = [a for p in parts for a in p[1]]
    order_index = np.array([i for p in parts for i in p[2]], dtype=np.int64)
    order = np.argsort(order_index, kind="stable")
    labels = manifest.labels()
    return FeatureCache(
        features=(np.concatenate(all_feats) if all_feats else np.zeros((0, dim), np.float32))[order],
        logits=(np.concatenate(all_logits) if all_logits else np.zeros((0, classes), np.float32))[order],
        labels=labels[order_index[order]] if len(order_index) else np.zeros(0, np.int64),
        index=order_index[order],
        head_weight=classifier.head.weight.detach().float().cpu().numpy(),
        head_bias=classifier.head.bias.detach().float().cpu().numpy(),
        metadata={"model": classifier.model_id, "manifest": manifest.fingerprint(), "key": key or "",
                  "dtype": str(dtype).replace("torch.", ""),
                  "failures": sorted((f for p in parts for f in p[3]), key=lambda f: f["index"])},
    )


@torch.inference_mode()
def extract_features(classifier: ImageClassifier, manifest: Manifest, *, batch_size: int = 64,
                     device: str | None = None,
                     precision: str = "auto", num_workers: int | None = None, cache: str | os.PathLike | None = None,
                     desc: str = "features", key: str | None = None, pixels: Any = None, seed: int = 0) -> FeatureCache:
    """Run `classifier` once over every row of `manifest` (already the wanted selection) and return the cache.

    Pixels are `pixels` (default: the classifier's evaluation pixels, `classifier.pixels`; a random transform draws
    per (seed, row)), made in `num_workers` loader workers (None: `pipelines.pixels.default_workers()`) and normalised
    on the device. With `cache`, an existing file is loaded instead when its metadata carries the same content `key`
    (or, without a key, the same model id and manifest fingerprint), and a new result is written there; the key must
    cover the pixels. Rows are split across accelerate processes; unreadable images are recorded in
    `metadata["failures"]` and left out (`index` says which rows are present).
    """
    state = partial_state()
    # the main process decides whether the file is reused (the gather below is a collective: every rank must agree)
    found = _reusable(cache, manifest, classifier.model_id, key) if state.is_main_process else None
    if main_decides(lambda: found is not None, f"the feature cache check of {desc}"):
        found = found or _reusable(cache, manifest, classifier.model_id, key)
        if found is None:
            raise UserInputError(f"{cache}: the main process reuses this feature cache, but the process on {host()} "
                                 "cannot read it: cache_dir must be a folder every process sees")
        return found
    device = resolve_device(device) if device is not None else state.device
    dtype = resolve_dtype(precision, device)
    classifier = classifier.to(device).eval()
    positions = list(share(len(manifest), state.process_index, state.num_processes))
    dataset = ManifestPixels(manifest, positions, classifier.pixels if pixels is None else pixels, seed)
    loader = pixel_loader(dataset, batch_size, num_workers)
    bar = progress(desc=desc, total=len(positions), unit="img", disable=not state.is_main_process)
    parts = [_run_shard(classifier, manifest, loader, device, dtype, bar)]
    if state.num_processes > 1:
        parts = all_gather(parts[0], f"the feature extraction of {desc}")
    result = _assemble(parts, classifier, manifest, key, dtype)
    if cache is not None and state.is_main_process:
        result.save(cache)
    return result
