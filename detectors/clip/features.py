"""CLIP image embeddings of an `ImageSet`, computed once per (model, image set) and reused by every CLIP detector.

Global embeddings [N,P] (float32) and GL-MCM local patch embeddings [N,L,P] (float16 to halve memory) are kept on the
ImageSet object in memory and, when the set has a `cache_key` (manifest-backed sets do) and a cache folder is given
(or `OODFORGE_CACHE` / ~/.cache/oodforge), in one safetensors file written atomically.
"""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path
import torch
from tqdm.auto import tqdm

from detectors.base import ImageSet
from detectors.clip.backbone import ClipBackbone
from pipelines.io import atomic_path

_MEMO_ATTR = "_clip_feature_memo"


@dataclass
class ClipImageFeatures:
    """Unnormalised projected embeddings of N images: `global_ [N,P]`, `local [N,L,P]`."""

    global_: torch.Tensor
    local: torch.Tensor

    def __len__(self) -> int:
        return len(self.global_)


def default_cache_dir() -> Path:
    """`$OODFORGE_CACHE/clip`, else ~/.cache/oodforge/clip."""
    root = os.environ.get("OODFORGE_CACHE") or Path.home() / ".cache" / "oodforge"
    return Path(root) / "clip"


def cache_file(backbone: ClipBackbone, images: ImageSet, cache_dir: str | os.PathLike) -> Path:
    """The safetensors file of one (model, image set) pair."""
    digest = hashlib.sha256(f"{backbone.model_id}|{images.cache_key}".encode()).hexdigest()[:16]
    slug = "".join(c if c.isalnum() else "-" for c in Path(backbone.model_id).name)[-40:]
    return Path(cache_dir) / f"{slug}-{digest}.safetensors"


@torch.inference_mode()
def compute_image_features(backbone: ClipBackbone, images: ImageSet, batch_size: int = 64, progress: bool = True) -> ClipImageFeatures:
    """Run the image tower once over `images` in batches (bf16 autocast on GPU, fp32 on CPU)."""
    globals_, locals_ = [], []
    batches = images.batches(batch_size)
    total = -(-len(images) // batch_size)
    for _, pils in tqdm(batches, total=total, desc="CLIP image features", disable=not progress, leave=False):
        with backbone.autocast():
            g, l = backbone.image_embeddings(backbone.preprocess(pils))
        globals_.append(g.float().cpu())
        locals_.append(l.to(torch.float16).cpu())
    return ClipImageFeatures(torch.cat(globals_), torch.cat(locals_))


def image_features(backbone: ClipBackbone, images: ImageSet | ClipImageFeatures, cache_dir: str | os.PathLike | None = None,
                   batch_size: int = 64, progress: bool = True) -> ClipImageFeatures:
    """Cached CLIP features of `images`: memory first, then the safetensors cache file, else computed (and saved)."""
    if isinstance(images, ClipImageFeatures):
        return images
    memo: dict[str, ClipImageFeatures] = images.__dict__.setdefault(_MEMO_ATTR, {})
    if backbone.model_id in memo:
        return memo[backbone.model_id]
    path = None
    if images.cache_key is not None:
        path = cache_file(backbone, images, cache_dir if cache_dir is not None else default_cache_dir())
    if path is not None and path.is_file():
        feats = load_features(path)
        if len(feats) != len(images):
            raise ValueError(f"CLIP feature cache {path} holds {len(feats)} images, the image set {len(images)}: delete it")
    else:
        feats = compute_image_features(backbone, images, batch_size, progress)
        if path is not None:
            save_features(feats, path, {"model_id": backbone.model_id, "cache_key": str(images.cache_key)})
    memo[backbone.model_id] = feats
    return feats


def save_features(feats: ClipImageFeatures, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write `global`/`local` tensors to a safetensors file atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    with atomic_path(path) as tmp:
        save_file({"global": feats.global_.contiguous(), "local": feats.local.contiguous()}, str(tmp), metadata=metadata)
    return path


def load_features(path: str | os.PathLike) -> ClipImageFeatures:
    """Read a file written by `save_features`."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    return ClipImageFeatures(tensors["global"], tensors["local"])
