"""CLIP image-feature caches key on content like the classifier's caches; patch embeddings only for patch readers."""
from __future__ import annotations

import os

import numpy as np
from PIL import Image

from detectors import build
from detectors.base import ImageSet
from detectors.clip.features import load_features
from pipelines.data import make_row, read_manifest, write_manifest
from pipelines.tiny import save_tiny_clip


def _folder(folder, seed):
    rng = np.random.default_rng(seed)
    folder.mkdir(parents=True)
    for i in range(4):
        Image.fromarray(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8)).save(folder / f"{i}.png")
    write_manifest(folder, [make_row(f"{i}.png", role="ood", ood_set="s") for i in range(4)])
    return folder


def _scores(clip, folder, cache, name="mcm"):
    det = build(name, model=str(clip), class_names=["a", "b"], cache_dir=str(cache))
    return det.score(ImageSet(manifest=read_manifest(folder)))


def test_same_folder_name_and_images_replaced_in_place(tmp_path):
    clip = save_tiny_clip(tmp_path / "clip")
    cache = tmp_path / "cache"
    first = _folder(tmp_path / "a" / "images", 0)
    other = _folder(tmp_path / "b" / "images", 1)  # same folder name, other images
    s1, s2 = _scores(clip, first, cache), _scores(clip, other, cache)
    assert not np.allclose(s1, s2) and len(list(cache.glob("*.safetensors"))) == 2
    fresh = tmp_path / "fresh"
    np.testing.assert_allclose(_scores(clip, other, fresh), s2, rtol=1e-6)

    st = os.stat(first / "0.png")  # replace an image in place: a new cache, fresh scores
    Image.fromarray(np.full((32, 32, 3), 200, dtype=np.uint8)).save(first / "0.png")
    s3 = _scores(clip, first, cache)
    assert s3[0] != s1[0] and len(list(cache.glob("*.safetensors"))) == 3
    assert os.stat(first / "0.png").st_mtime_ns != st.st_mtime_ns


def test_patch_embeddings_only_for_detectors_that_read_them(tmp_path):
    clip = save_tiny_clip(tmp_path / "clip")
    folder = _folder(tmp_path / "images", 2)
    cache = tmp_path / "cache"
    _scores(clip, folder, cache, "mcm")
    (path,) = cache.glob("*.safetensors")
    assert load_features(path).local is None  # MCM reads global embeddings only
    glmcm = _scores(clip, folder, cache, "glmcm")
    assert load_features(path).local is not None  # GL-MCM needed patches: recomputed with them
    np.testing.assert_allclose(_scores(clip, folder, tmp_path / "other", "glmcm"), glmcm, rtol=1e-6)
