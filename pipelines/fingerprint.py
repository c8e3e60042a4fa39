"""Content fingerprints for cache keys: model weights, preprocessing, image files.

A cache key must change whenever anything that decides the cache's content changes: the weights actually
loaded (hashed tensor by tensor, so a retrained model saved into the same folder gets a new key), the preprocessing,
the precision, the manifest rows and the image files behind them.
"""
from __future__ import annotations

import contextlib
import contextvars
import hashlib
import json
import os
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from pipelines.data import Manifest
from pipelines.store import MemberPath, is_shard_row, shard_identities

_CHUNK = 1 << 24
IDENTITY_MODES = ("stat", "content")
"""How an image file is identified in cache keys: `stat` (size + mtime_ns, cheap) or `content` (sha256 of the bytes)."""
_IDENTITY = contextvars.ContextVar("image_identity", default="stat")


@contextlib.contextmanager
def image_identity(mode: str) -> Iterator[None]:
    """Within the block, every fingerprint that is not given a mode identifies images by `mode` (a run's
    `cache_hash`, so that it reaches every cache: run features, trained features, CLIP features, fine-tunes)."""
    if mode not in IDENTITY_MODES:
        raise ValueError(f"image identity mode must be one of {IDENTITY_MODES}, got {mode!r}")
    token = _IDENTITY.set(mode)
    try:
        yield
    finally:
        _IDENTITY.reset(token)


def _digest(parts: Iterable[Any]) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else json.dumps(part, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


def weights_fingerprint(module: torch.nn.Module) -> str:
    """sha256 over every parameter and buffer of `module` (name, dtype, shape and bytes), in state-dict order."""
    h = hashlib.sha256()
    for name, tensor in module.state_dict().items():
        t = tensor.detach()
        if t.device.type == "meta":
            raise ValueError(f"cannot fingerprint {name}: it has no data (meta device)")
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}\0".encode())
        flat = t.contiguous().cpu().reshape(-1)
        if flat.dtype in (torch.bfloat16,):
            flat = flat.view(torch.int16)
        h.update(flat.numpy().tobytes())
    return h.hexdigest()


def preprocessing_fingerprint(classifier: Any) -> str:
    """The image processor's configuration (or the plain resize/normalise settings of a wrapped module) and the
    evaluation pixels the classifier makes (`classifier.pixels`, `pipelines.pixels`)."""
    processor = getattr(classifier, "processor", None)
    if processor is not None and hasattr(processor, "to_dict"):
        settings: Any = processor.to_dict()
    else:
        settings = {"image_size": getattr(classifier, "image_size", None),
                    "mean": getattr(classifier, "mean", torch.zeros(0)).flatten().tolist(),
                    "std": getattr(classifier, "std", torch.zeros(0)).flatten().tolist()}
    pixels = getattr(classifier, "pixels", None)
    return _digest([settings, pixels.identity() if hasattr(pixels, "identity") else None])


def file_identity(path: os.PathLike | str, mode: str | None = None) -> Any:
    """What identifies an image file's bytes: (size, mtime_ns) with `stat`, the sha256 with `content` (None: the
    `image_identity` in force, `stat` by default); None if absent or not a regular file (a FIFO, socket or device is
    never opened: reading a FIFO would block forever)."""
    import stat

    from pipelines.io import open_regular

    mode = mode or _IDENTITY.get()
    if isinstance(path, MemberPath):  # a shard member (pipelines.store)
        return path.identity(mode)
    try:
        if mode == "content":
            h = hashlib.sha256()
            with open_regular(path) as fh:
                while block := fh.read(_CHUNK):
                    h.update(block)
            return h.hexdigest()
        st = os.stat(path)
        return [st.st_size, st.st_mtime_ns] if stat.S_ISREG(st.st_mode) else None
    except OSError:
        return None


def images_fingerprint(manifest: Manifest, mode: str | None = None) -> str:
    """The rows and the identity of the images behind them, by store.

    Folder store: the resolved root and each image file's identity (`file_identity`), in row order. Shard store
    (rows with `shard_file`, `pipelines.store`): the rows (which name shard and member) and each shard's recorded
    sha256, once its file is checked against the store's record (`stat`: size and mtime; `content`: re-hashed); a
    shard that changed is a `ShardError` naming it. The shard key does not depend on where the store lies, and rows
    of both stores in one manifest get both parts."""
    mode = mode or _IDENTITY.get()
    if mode not in IDENTITY_MODES:
        raise ValueError(f"image identity mode must be 'stat' or 'content', got {mode!r}")
    shards = {r["shard_file"] for r in manifest.rows if is_shard_row(r)}
    if not shards:
        return _digest([str(manifest.root.resolve()), manifest.fingerprint(),
                        *(file_identity(manifest.path(r), mode) for r in manifest.rows)])
    files = [file_identity(manifest.path(r), mode) for r in manifest.rows if not is_shard_row(r)]
    folder = [str(manifest.root.resolve()), *files] if files else []
    return _digest(["shards-v1", manifest.fingerprint(), shard_identities(manifest.root, shards, mode), *folder])


def source_identity(name_or_path: str | os.PathLike | None) -> Any:
    """A cheap identity of a model source without loading it: every file of a local folder (relative path, size,
    mtime), or the hub id itself (a hub snapshot changes its folder, which `weights_fingerprint` then sees)."""
    if name_or_path is None:
        return None
    root = os.fspath(name_or_path)
    if not os.path.isdir(root):
        return root
    found = []
    for folder, _, files in sorted(os.walk(root)):
        for name in sorted(files):
            path = os.path.join(folder, name)
            found.append([os.path.relpath(path, root), file_identity(path, "stat")])
    return found


def combine(*parts: Any) -> str:
    """One short key from several fingerprints and settings."""
    return _digest(parts)[:24]
