"""DIFFGUARD keeps finished batches (Detector.keeps_batches, pipelines.batches): a run killed within a set resumes
there, and its scores are bitwise equal to an uninterrupted run's."""
from __future__ import annotations

import numpy as np
import pytest

import detectors
from detectors import ImageSet
from pipelines.batches import KEPT_FOLDER
from pipelines.data import make_row, read_manifest, write_manifest

FAST = dict(steps=20, max_inversion_steps=18, n_crops=2, early_stop_similarity=None, distance="ssim",
            early_stop_psnr=15.0, batch_size=2)


@pytest.fixture
def images(tmp_path, synthetic):
    folder = tmp_path / "ood"
    folder.mkdir()
    rows = []
    for i, image in enumerate(synthetic(5, seed=3)):
        image.save(folder / f"img_{i}.png")
        rows.append(make_row(f"img_{i}.png", split="test", role="ood", ood_set="ramp", group="far", label=-1))
    write_manifest(folder, rows)
    return ImageSet(manifest=read_manifest(folder))


class Killed(BaseException):
    """Stands in for a kill: nothing catches it."""


def build(tiny_classifier, pixel_unet_folder, **runtime):
    return detectors.build("diffguard", classifier=tiny_classifier, unet_id=str(pixel_unet_folder), **FAST, **runtime)


@pytest.mark.slow
def test_a_killed_run_resumes_within_the_set_bitwise_equal(tmp_path, images, tiny_classifier, pixel_unet_folder):
    reference = build(tiny_classifier, pixel_unet_folder).score(images)  # no work_dir: one pass, nothing kept
    work = tmp_path / "work"
    killed = build(tiny_classifier, pixel_unet_folder, work_dir=str(work))
    calls = []
    score = killed._score

    def dies_on_the_third_batch(batch):
        calls.append(len(batch))
        if len(calls) == 3:
            raise Killed
        return score(batch)

    killed._score = dies_on_the_third_batch
    with pytest.raises(Killed):
        killed.score(images)
    kept = sorted(p.name for p in (work / KEPT_FOLDER).rglob("*.npy"))
    assert calls == [2, 2, 1] and len(kept) == 2 and not list(work.rglob("*.tmp*"))

    resumed = build(tiny_classifier, pixel_unet_folder, work_dir=str(work))
    again = []
    score2 = resumed._score
    resumed._score = lambda batch: again.append(len(batch)) or score2(batch)
    scores = resumed.score(images)
    assert again == [1]  # only the batch the kill cut
    assert scores.dtype == np.float64 and np.array_equal(scores, reference)
    uninterrupted = build(tiny_classifier, pixel_unet_folder, work_dir=str(tmp_path / "other")).score(images)
    assert np.array_equal(uninterrupted, reference)


@pytest.mark.slow
def test_changed_parameters_or_images_never_read_kept_batches(tmp_path, images, tiny_classifier, pixel_unet_folder):
    work = tmp_path / "work"
    build(tiny_classifier, pixel_unet_folder, work_dir=str(work)).score(images)
    other = build(tiny_classifier, pixel_unet_folder, work_dir=str(work), guidance_scale=1.0)
    calls = []
    score = other._score
    other._score = lambda batch: calls.append(len(batch)) or score(batch)
    other.score(images)
    assert calls == [2, 2, 1]  # another parameter: every batch computed again
    assert len(list((work / KEPT_FOLDER).iterdir())) == 2
    in_memory = build(tiny_classifier, pixel_unet_folder, work_dir=str(tmp_path / "mem"))
    in_memory.score(ImageSet(images=[images.load(i) for i in range(3)]))
    assert not (tmp_path / "mem").exists()  # images without a manifest have no identity to key a file by


def test_every_image_scoring_detector_keeps_batches_and_declares_work_dir():
    from detectors.registry import detector_class

    keeping = {name for family in ("posthoc", "generative") for name in detectors.available(family)
               if detector_class(name).keeps_batches}
    assert keeping == {"odin", "iodin", "rp_odin", "mdsens", "gram", "rankfeat", "ensemble", "diffguard"}
    for name in keeping:
        assert "work_dir" in detector_class(name).needs and "images" in detector_class(name).inputs
