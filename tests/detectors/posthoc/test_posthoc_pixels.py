"""The pixel memo of image-level sweeps: preprocessed batches kept by preprocessing and file identity, least recently
used out first, never stale; an ODIN sweep through the runner chooses and scores bitwise alike with and without it,
preprocessing the validation images once instead of at every grid point."""
from __future__ import annotations

import os

import numpy as np
import pandas as pd
import pytest
import torch
from PIL import Image

from detectors.base import ImageSet
from detectors.posthoc.pixels import PixelMemo, pixel_memo, preprocessed
from pipelines.data import make_row, write_manifest


class Scaled:
    """A pixel transform with a setting (image -> float tensor / factor), counting the images it makes."""

    def __init__(self, factor: float):
        self.factor, self.calls = factor, 0

    def __call__(self, image, rng=None):
        self.calls += 1
        return torch.from_numpy(np.asarray(image, dtype=np.float32)).permute(2, 0, 1) / self.factor

    def load(self, path, rng=None):
        from pipelines.data import load_image

        return self(load_image(path))

    def identity(self):
        return {"factor": self.factor}


class Scale:
    """A classifier stand-in with a preprocessing setting: its pixels scale the images (counted), no normalisation."""

    def __init__(self, factor: float = 1.0):
        self.image_size = 4
        self.mean, self.std = torch.zeros(3), torch.full((3,), factor)
        self.pixels, self.standardize = Scaled(factor), (lambda x: x)

    @property
    def calls(self) -> int:
        return self.pixels.calls


@pytest.fixture()
def images(tmp_path):
    rng = np.random.default_rng(0)
    for i in range(5):
        Image.fromarray(rng.integers(0, 255, (4, 4, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
    return ImageSet(manifest=write_manifest(tmp_path, [make_row(f"{i}.png") for i in range(5)]))


def test_kept_batches_are_the_same_values_and_each_is_preprocessed_once(images):
    clf = Scale()
    plain = list(preprocessed(clf, images, 2))
    assert clf.calls == 5
    with pixel_memo(1) as memo:
        first, again = list(preprocessed(clf, images, 2)), list(preprocessed(clf, images, 2))
    assert clf.calls == 10 and (memo.hits, memo.misses) == (3, 3)
    for a, b, c in zip(plain, first, again):
        assert torch.equal(a, b) and torch.equal(a, c)
    again[0].add_(1)  # a detector changing its batch in place does not change the kept one
    with pixel_memo(1):
        list(preprocessed(clf, images, 2))
        assert torch.equal(next(iter(preprocessed(clf, images, 2))), plain[0])
    with pixel_memo(0) as none:  # 0: nothing kept
        assert none is None and len(list(preprocessed(clf, images, 2))) == 3


def test_a_changed_file_or_preprocessing_is_never_served_stale(images):
    clf = Scale()
    with pixel_memo(1) as memo:
        before = list(preprocessed(clf, images, 5))[0]
        path = images.manifest.path(images.manifest.rows[0])
        stat = os.stat(path)
        Image.fromarray(np.zeros((4, 4, 3), dtype=np.uint8)).save(path)
        os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1))
        after = list(preprocessed(clf, images, 5))[0]
        assert memo.misses == 2 and torch.equal(after[0], torch.zeros(3, 4, 4)) and torch.equal(after[1:], before[1:])
        other = Scale(2.0)
        assert torch.equal(list(preprocessed(other, images, 5))[0], after / 2) and memo.misses == 3


def test_the_least_recently_used_batch_goes_first_and_an_oversized_one_is_not_kept():
    x = torch.zeros(256)  # 1 KiB
    memo = PixelMemo(2048)
    memo.put("a", x), memo.put("b", x)
    assert memo.get("a") is not None  # a is now the most recent
    memo.put("c", x)
    assert list(memo.entries) == ["a", "c"] and memo.used == 2048
    memo.put("big", torch.zeros(1024))
    assert "big" not in memo.entries and memo.used == 2048


@pytest.mark.slow
def test_an_odin_sweep_chooses_and_scores_alike_with_the_memo_and_preprocesses_once(digits, tmp_path, monkeypatch):
    from detectors.harness.evaluate import run_config
    from pipelines.features import ManifestPixels
    from tests.detectors.harness.runner_helpers import eval_config

    calls = []
    real = ManifestPixels.__getitem__
    monkeypatch.setattr(ManifestPixels, "__getitem__", lambda self, i: calls.append(1) or real(self, i))
    _, ood_dir, _ = digits
    counts, tables, scores = {}, {}, {}
    for memo in (0, 1024):
        calls.clear()
        out = tmp_path / f"memo{memo}"
        config = eval_config(digits, out, detectors=["odin"], ood=[{"manifest": str(ood_dir), "sets": ["digits_6_9"]}],
                             ood_val={"manifest": str(ood_dir), "split": "test", "sets": ["texture"]},
                             sweep_pixel_mb=memo)
        run_config(config)
        counts[memo] = sum(calls)
        tables[memo] = pd.read_csv(out / "selection" / "odin.csv")
        scores[memo] = pd.read_parquet(out / "scores.parquet")
    pd.testing.assert_frame_equal(tables[0], tables[1024])
    assert np.array_equal(scores[0]["score"].to_numpy(), scores[1024]["score"].to_numpy())
    points = len(tables[0])
    val_images = (counts[0] - counts[1024]) / (points - 1)  # what the memo saved: the val images at 7 of 8 points
    assert points == 8 and val_images > 0 and counts[1024] + (points - 1) * val_images == counts[0]
