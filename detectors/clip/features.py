"""CLIP image embeddings of an `ImageSet`, computed once per (model, image set) and reused by every CLIP detector.

Global embeddings [N,P] (float32) and GL-MCM local patch embeddings [N,L,P] (float16 to halve memory; computed only
for detectors that read them, `local=True`) are kept on the ImageSet object in memory and, when the set has a
`cache_key` (manifest-backed sets do) and a cache folder is given (or `OODFORGE_CACHE` / ~/.cache/oodforge), in one
safetensors file written atomically. The file is keyed like the classifier's feature caches (`pipelines.fingerprint`):
the weights actually loaded, and for manifest-backed sets the resolved folder, the rows and every image file's identity,
so images replaced in place or two folders of the same name never share a cache.
"""
from __future__ import annotations

import hashlib
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from detectors.base import ImageSet
from detectors.clip.backbone import ClipBackbone
from pipelines.fingerprint import images_fingerprint, weights_fingerprint
from pipelines.io import atomic_path, safe_name
from pipelines.progress import progress as progress_bar

_MEMO_ATTR = "_clip_feature_memo"
_ROW_MEMO_ATTR = "_clip_feature_row_memo"
_WEIGHTS_ATTR = "_clip_weights_key"
_IMAGES_ATTR = "_clip_images_key"


@dataclass
class ClipImageFeatures:
    """Unnormalised projected embeddings of N images: `global_ [N,P]`, `local [N,L,P]` (None when not computed)."""

    global_: torch.Tensor
    local: torch.Tensor | None

    def __len__(self) -> int:
        return len(self.global_)

    def subset(self, index: Sequence[int]) -> ClipImageFeatures:
        """The rows at `index`."""
        index = torch.as_tensor(list(index), dtype=torch.long)
        return ClipImageFeatures(self.global_[index], None if self.local is None else self.local[index])


def default_cache_dir() -> Path:
    """`$OODFORGE_CACHE/clip`, else ~/.cache/oodforge/clip."""
    root = os.environ.get("OODFORGE_CACHE") or Path.home() / ".cache" / "oodforge"
    return Path(root) / "clip"


def weights_key(backbone: ClipBackbone) -> str:
    """The fingerprint of the CLIP weights actually loaded (computed once per backbone object)."""
    if _WEIGHTS_ATTR not in backbone.__dict__:
        backbone.__dict__[_WEIGHTS_ATTR] = weights_fingerprint(backbone.model)
    return backbone.__dict__[_WEIGHTS_ATTR]


def images_key(images: ImageSet) -> str:
    """A manifest-backed set's content key (resolved folder, rows, image file identities), else its `cache_key`."""
    if images.manifest is None:
        return str(images.cache_key)
    if _IMAGES_ATTR not in images.__dict__:
        images.__dict__[_IMAGES_ATTR] = images_fingerprint(images.manifest)
    return images.__dict__[_IMAGES_ATTR]


def cache_file(backbone: ClipBackbone, images: ImageSet, cache_dir: str | os.PathLike) -> Path:
    """The safetensors file of one (model weights, image set content) pair."""
    digest = hashlib.sha256(f"{weights_key(backbone)}|{images_key(images)}".encode()).hexdigest()[:16]
    slug = safe_name(Path(backbone.model_id).name)[-40:]
    return Path(cache_dir) / f"{slug}-{digest}.safetensors"


@torch.inference_mode()
def compute_image_features(backbone: ClipBackbone, images: ImageSet, batch_size: int = 64, progress: bool = True,
                           local: bool = True) -> ClipImageFeatures:
    """Run the image tower once over `images` in batches (bf16 autocast on GPU, fp32 on CPU); patch embeddings only
    with `local`."""
    globals_, locals_ = [], []
    batches = images.batches(batch_size)
    total = -(-len(images) // batch_size)
    for _, pils in progress_bar(batches, "CLIP image features", total=total, unit="batch", disable=not progress,
                                leave=False):
        with backbone.autocast():
            g, l = backbone.image_embeddings(backbone.preprocess(pils), local=local)
        globals_.append(g.float().cpu())
        if local:
            locals_.append(l.to(torch.float16).cpu())
    if not globals_:  # an empty set: [0, P] embeddings, so that every score is an empty array
        dim = backbone.model.config.projection_dim
        return ClipImageFeatures(torch.zeros(0, dim), torch.zeros(0, 0, dim, dtype=torch.float16) if local else None)
    return ClipImageFeatures(torch.cat(globals_), torch.cat(locals_) if local else None)


def image_features(backbone: ClipBackbone, images: ImageSet | ClipImageFeatures,
                   cache_dir: str | os.PathLike | None = None,
                   batch_size: int = 64, progress: bool = True, rows: Sequence[int] | None = None,
                   local: bool = True) -> ClipImageFeatures:
    """Cached CLIP features of `images`: memory first, then the safetensors cache file, else computed (and saved).

    With `rows`, the features of those rows only: sliced from the whole set's features when they are at hand,
    otherwise the rows not yet seen on this ImageSet run through the image tower (one pass over all of them, cached
    as their own subset) and are kept per row, so that overlapping subsets (few-shot sweeps) never run a row twice.
    `local=False` skips the patch embeddings (a cache with them serves both; one without is recomputed when they are
    needed).
    """
    if isinstance(images, ClipImageFeatures):
        return images if rows is None else images.subset(rows)
    memo: dict[str, ClipImageFeatures] = images.__dict__.setdefault(_MEMO_ATTR, {})
    usable = lambda feats: feats is not None and (feats.local is not None or not local)  # noqa: E731
    path = None
    if images.cache_key is not None:
        path = cache_file(backbone, images, cache_dir if cache_dir is not None else default_cache_dir())
    if not usable(memo.get(backbone.model_id)) and path is not None and path.is_file():
        feats = load_features(path)
        if len(feats) != len(images):
            raise ValueError(f"CLIP feature cache {path} holds {len(feats)} images, the image set {len(images)}: "
                             "delete it")
        if usable(feats):
            memo[backbone.model_id] = feats
    if usable(memo.get(backbone.model_id)):
        return memo[backbone.model_id] if rows is None else memo[backbone.model_id].subset(rows)
    if rows is not None:
        return _feature_rows(backbone, images, [int(r) for r in rows], cache_dir, batch_size, progress)
    feats = compute_image_features(backbone, images, batch_size, progress, local)
    if path is not None:
        save_features(feats, path, {"model_id": backbone.model_id, "cache_key": str(images.cache_key)})
    memo[backbone.model_id] = feats
    return feats


def _feature_rows(backbone: ClipBackbone, images: ImageSet, rows: list[int], cache_dir: str | os.PathLike | None,
                  batch_size: int, progress: bool) -> ClipImageFeatures:
    """Features of `rows`, computing only the rows not in this ImageSet's per-row memo."""
    known: dict[int, tuple[torch.Tensor, torch.Tensor]] = (images.__dict__.setdefault(_ROW_MEMO_ATTR, {})
                                                           .setdefault(backbone.model_id, {}))
    missing = sorted(set(rows) - set(known))
    if missing:
        feats = image_features(backbone, subset_imageset(images, missing), cache_dir, batch_size, progress)
        known.update({r: (feats.global_[i], feats.local[i]) for i, r in enumerate(missing)})
    if not rows:
        raise ValueError("image_features: `rows` is empty")
    return ClipImageFeatures(torch.stack([known[r][0] for r in rows]), torch.stack([known[r][1] for r in rows]))


def subset_imageset(images: ImageSet, index: Sequence[int]) -> ImageSet:
    """The images at `index` (in-memory or manifest-backed), with their labels."""
    index = [int(i) for i in index]
    labels = None if images.labels is None else np.asarray(images.labels)[index]
    if images.images is not None:
        return ImageSet(images=[images.images[i] for i in index], labels=labels)
    from pipelines.data import Manifest

    return ImageSet(manifest=Manifest(images.manifest.root, [images.manifest.rows[i] for i in index]), labels=labels)


def save_features(feats: ClipImageFeatures, path: str | os.PathLike, metadata: dict[str, str] | None = None) -> Path:
    """Write `global`/`local` tensors (`local` when computed) to a safetensors file atomically."""
    from safetensors.torch import save_file

    path = Path(path)
    tensors = {"global": feats.global_.contiguous()}
    if feats.local is not None:
        tensors["local"] = feats.local.contiguous()
    with atomic_path(path) as tmp:
        save_file(tensors, str(tmp), metadata=metadata)
    return path


def load_features(path: str | os.PathLike) -> ClipImageFeatures:
    """Read a file written by `save_features`."""
    from safetensors.torch import load_file

    tensors = load_file(str(path))
    return ClipImageFeatures(tensors["global"], tensors.get("local"))
