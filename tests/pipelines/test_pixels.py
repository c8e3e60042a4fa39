"""pipelines.pixels: each protocol's evaluation transform and fit pixels, the `pixels:` keys one away, the model
folder's record round trip, cache keys that follow the pixels, seeded fit pixels whatever the workers, the default
workers."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from PIL import Image

from pipelines.classifier import ImageClassifier
from pipelines.data import make_row, write_manifest
from pipelines.decode import Decode
from pipelines.features import extract_features
from pipelines.fingerprint import preprocessing_fingerprint
from pipelines.pixels import (
    PROTOCOL_PIXELS,
    RECORD,
    PixelSettings,
    ProcessorPixels,
    default_workers,
    reference_record,
    run_pixels,
    training_pixels,
)
from pipelines.training import transforms as T


@pytest.fixture(scope="module")
def resnet(tmp_path_factory):
    """The tiny ResNet-50 stand-in (ConvNext-style processor: shortest edge 32, crop_pct 0.875, bicubic)."""
    from pipelines.tiny import RESNET_ID, save_tiny_model

    folder = tmp_path_factory.mktemp("resnet")
    save_tiny_model(folder, RESNET_ID)
    return folder


@pytest.fixture()
def rows(tmp_path):
    rng = np.random.default_rng(0)
    made = []
    for i in range(6):
        Image.fromarray(rng.integers(0, 256, (40 + i, 50 + 3 * i, 3), dtype=np.uint8)).save(tmp_path / f"{i}.png")
        made.append(make_row(f"{i}.png", split="train", label=i % 2))
    return write_manifest(tmp_path, made)


def test_each_protocol_gets_its_references_pixels(resnet):
    clf = ImageClassifier.from_pretrained(resnet)
    assert isinstance(clf.pixels, ProcessorPixels)  # a hub folder's own: its processor
    insects = run_pixels(clf, "open-insects")
    assert repr(insects.eval.ops) == repr([T.Resize(36), T.CenterCrop(32)])  # int(32 / 0.875) = 36
    assert insects.eval.decode == Decode(draft=False, orient=False)  # full decode, the stored pixel order
    assert [type(op).__name__ for op in insects.fit.ops] == ["Resize", "CenterCrop", "HorizontalFlip", "RandomCrop"]
    openood = run_pixels(clf, "openood_v1.5")
    assert repr(openood.eval) == repr(insects.eval) and openood.fit is None
    exact = run_pixels(clf, "exact")
    assert isinstance(exact.eval, ProcessorPixels) and exact.eval.decode.orient and exact.fit is None
    assert {name: vars(p) for name, p in PROTOCOL_PIXELS.items()} == {
        "open-insects": {"eval": "reference", "fit": "train", "orient": False},
        "openood_v1.5": {"eval": "reference", "fit": "eval", "orient": False},
        "exact": {"eval": "processor", "fit": "eval", "orient": True}}


def test_every_choice_is_one_key_away(resnet):
    clf = ImageClassifier.from_pretrained(resnet)
    settings = PixelSettings.from_dict({"eval": "processor", "fit": "eval", "orient": True, "draft": True, "seed": 3})
    chosen = run_pixels(clf, "open-insects", settings)
    assert isinstance(chosen.eval, ProcessorPixels) and chosen.eval.decode == Decode(draft=True, orient=True)
    assert chosen.fit is None and chosen.fit_identity() == {"fit": "eval"}
    reference = run_pixels(clf, "exact", PixelSettings(eval="reference"))
    assert reference_record(reference.eval)["pre_size"] == 36
    seeded = run_pixels(clf, "open-insects", PixelSettings(seed=3))
    assert seeded.fit_identity()["seed"] == 3 != run_pixels(clf, "open-insects").fit_identity()["seed"]


def test_a_trained_folder_records_its_reference_transform(resnet, tmp_path):
    clf = ImageClassifier.from_pretrained(resnet)
    evaluate = T.reference_eval(30, 33)
    training_pixels(clf, (T.reference_train("ami", 30, 33), evaluate), "open-insects")
    clf.save_pretrained(tmp_path / "trained")
    record = json.loads((tmp_path / "trained" / RECORD).read_text())
    assert record == {"transform": "reference", "image_size": 30, "pre_size": 33, "resample": "bilinear",
                      "orient": False}
    again = ImageClassifier.from_pretrained(tmp_path / "trained")
    assert repr(again.pixels) == repr(clf.pixels) and again.record == record
    assert run_pixels(again, "exact").eval.ops[1].size == 30  # exact: the transform it was validated with
    assert repr(run_pixels(again, "openood_v1.5").eval.ops) == repr([T.Resize(33), T.CenterCrop(30)])  # its sizes
    processor_only = ImageClassifier.from_pretrained(resnet)
    processor_only.save_pretrained(tmp_path / "trained")  # a processor-pixel model over it: the record goes
    assert not (tmp_path / "trained" / RECORD).exists()


def test_cache_keys_follow_the_pixels(resnet):
    clf = ImageClassifier.from_pretrained(resnet)
    keys = {preprocessing_fingerprint(clf)}
    for pixels in (run_pixels(clf, "open-insects").eval, run_pixels(clf, "exact", PixelSettings(orient=False)).eval,
                   run_pixels(clf, "open-insects", PixelSettings(draft=True)).eval):
        clf.pixels = pixels
        keys.add(preprocessing_fingerprint(clf))
    assert len(keys) == 4


def test_reference_pixels_reach_the_features_and_fit_pixels_are_seeded_whatever_the_workers(resnet, rows):
    clf = ImageClassifier.from_pretrained(resnet)
    chosen = run_pixels(clf, "open-insects")
    clf.pixels = chosen.eval
    cache = extract_features(clf, rows, batch_size=4, num_workers=0)
    for i, row in enumerate(rows.rows):  # the reference's pixels, normalised with the processor's mean and std
        x = clf.standardize(chosen.eval.load(rows.path(row))[None])
        with torch.no_grad():
            np.testing.assert_allclose(cache.logits[i], clf(x)[0][0].numpy(), rtol=1e-5, atol=1e-5)
    fit = [extract_features(clf, rows, batch_size=4, num_workers=w, pixels=chosen.fit, seed=s).features
           for w, s in ((0, 0), (2, 0), (0, 1))]
    assert np.array_equal(fit[0], fit[1])  # drawn per (seed, row): the same in workers
    assert not np.allclose(fit[0], fit[2]) and not np.allclose(fit[0], cache.features)


def test_default_workers_leave_one_core_beside_a_gpu(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert default_workers() == 0
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr("os.sched_getaffinity", lambda pid: set(range(16)))
    assert default_workers() == 15
