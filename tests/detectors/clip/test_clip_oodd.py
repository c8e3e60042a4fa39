"""OODD against (1) the official stream re-expressed on plain arrays (golden/make_oodd_golden.py, numbers in
golden/oodd.json, zxk1212/OODD commit edbb1a3; the same function also runs live on the tiny CLIP's features) and (2) a
float64 numpy stream by hand, read side by side with NegLabel/tools/ood_test.py:92-98 (the queue pops the highest
score), :100-129 (k-th largest cosine per image), :279-298 (per batch of 64: push, pop above 2048, score - 5th
largest cosine) and MCM/eval_ood_detection.py:187-205 (the same on MCM, MCM/utils/detection_util.py:311-337). The
stream is the images of one `score` call in their order. Edges: one ID class (every MCM score 1: all tied), no
image, fewer than k features in the queue."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.oodd import oodd_stream

GOLDEN = Path(__file__).with_name("golden")
NOUNS = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar"]
ADJS = ["shiny", "wooden", "tiny", "blue"]
SMALL = dict(queue_size=3, k=2, batch_size=4)


def golden_module():
    spec = importlib.util.spec_from_file_location("make_oodd_golden", GOLDEN / "make_oodd_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unit64(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def hf_text(backbone, texts) -> np.ndarray:
    tok = backbone.processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return unit64(backbone.model.get_text_features(**tok).pooler_output.numpy())


def hf_images(backbone, images) -> np.ndarray:
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output.numpy())


def hand_stream(base, feats, queue_size, k, batch):
    """A list kept sorted by base score; above queue_size the highest is dropped (no ties in these data)."""
    kept: list[tuple[float, int]] = []
    out = []
    for s in range(0, len(base), batch):
        for j in range(s, min(s + batch, len(base))):
            kept = sorted(kept + [(base[j], j)])
            if len(kept) > queue_size:
                kept = kept[:-1]
        dictionary = feats[[j for _, j in kept]]
        for j in range(s, min(s + batch, len(base))):
            sims = np.sort(dictionary @ feats[j])[::-1]
            out.append(base[j] - sims[min(k, len(sims)) - 1])
    return np.array(out)


def stream_images():
    return (colour_images([0], 4, 1) + colour_images([1], 4, 2) + colour_images([2], 3, 3) + colour_images([0, 1], 3, 4)
            + colour_images([1, 2], 3, 5))


@pytest.mark.parametrize("name", ["q10_k3_b8", "q10_k5_b8", "q64_k5_b6", "q7_k1_b5"])
def test_stream_matches_the_official_loop(name):
    gold, x = json.loads((GOLDEN / "oodd.json").read_text()), golden_module().inputs()
    assert gold["commit"].startswith("edbb1a3")
    cfg = gold[name]
    got = oodd_stream(x["base"], torch.from_numpy(x["feats"]), cfg["queue_size"], cfg["k"], cfg["batch_size"])
    np.testing.assert_allclose(got, cfg["scores"], rtol=0, atol=1e-6)


def test_mcm_oodd_equals_mcm_minus_the_dictionary_by_hand(backbone):
    det = detectors.build("mcm_oodd", model=backbone, class_names=CLASSES, **SMALL)
    images = stream_images()
    img, text = hf_images(backbone, images), hf_text(backbone, [f"a photo of a {c}" for c in CLASSES])
    base = softmax(img @ text.T, axis=1).max(1)  # MCM, T = 1
    assert len(np.unique(base)) == len(base)  # no ties: the hand queue needs none
    got = det.score(ImageSet(images=images))
    np.testing.assert_allclose(got, hand_stream(base, img, 3, 2, 4), rtol=1e-5, atol=1e-6)
    official = golden_module().official_stream(base.astype(np.float32), img.astype(np.float32), 3, 2, 4)
    np.testing.assert_allclose(got, official, rtol=0, atol=2e-5)
    assert np.abs(got - base).max() > 1e-3


@pytest.mark.filterwarnings("ignore:neglabel. only")  # a short word list
def test_oodd_on_neglabel_by_hand(backbone):
    det = detectors.build("oodd", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS, mine=False,
                          ngroup=1, temperature=0.05, **SMALL)
    images = stream_images()
    img = hf_images(backbone, images)
    pos = hf_text(backbone, [f"the nice {c}" for c in CLASSES])
    neg = np.concatenate([hf_text(backbone, [f"the nice {w}" for w in NOUNS]),
                          hf_text(backbone, [f"This is a {w} photo" for w in ADJS])])
    base = softmax(np.concatenate([img @ pos.T, img @ neg.T], 1) / 0.05, axis=1)[:, :2].sum(1)
    got = det.score(ImageSet(images=images))
    np.testing.assert_allclose(got, hand_stream(base, img, 3, 2, 4), rtol=1e-5, atol=1e-6)


def test_the_score_depends_only_on_the_order_of_the_call(backbone):
    det = detectors.build("mcm_oodd", model=backbone, class_names=CLASSES, **SMALL)
    images = stream_images()
    first = det.score(ImageSet(images=images))
    np.testing.assert_array_equal(det.score(ImageSet(images=images)), first)  # nothing carried across calls
    reverse = det.score(ImageSet(images=images[::-1]))[::-1]
    assert np.abs(reverse - first).max() > 1e-6
    img = hf_images(backbone, images[::-1])
    base = softmax(img @ hf_text(backbone, [f"a photo of a {c}" for c in CLASSES]).T, axis=1).max(1)
    np.testing.assert_allclose(reverse, hand_stream(base, img, 3, 2, 4)[::-1], rtol=1e-5, atol=1e-6)


def test_defaults_are_the_official_scripts(backbone):
    for name in ("oodd", "mcm_oodd"):
        p = detectors.build(name, model=backbone, class_names=CLASSES).params
        assert (p["queue_size"], p["k"], p["batch_size"]) == (2048, 5, 64)
    assert detectors.build("mcm_oodd", model=backbone, class_names=CLASSES).params["templates"] == ["a photo of a {}"]
    p = detectors.build("oodd", model=backbone, class_names=CLASSES).params
    assert (p["templates"], p["ngroup"], p["temperature"]) == (["the nice {}"], 100, 0.01)


def test_one_id_class_ties_every_base_score_and_the_queue_resolves_them_as_the_official(backbone):
    det = detectors.build("mcm_oodd", model=backbone, class_names=["red"], **SMALL)
    images = stream_images()
    got = det.score(ImageSet(images=images))
    img = hf_images(backbone, images).astype(np.float32)
    official = golden_module().official_stream(np.ones(len(images), np.float32), img, 3, 2, 4)
    np.testing.assert_allclose(got, official, rtol=0, atol=2e-5)


def test_an_empty_set_and_fewer_features_than_k(backbone):
    det = detectors.build("mcm_oodd", model=backbone, class_names=CLASSES)
    assert det.score(ImageSet(images=[])).shape == (0,)
    images = colour_images([0], 1, 1) + colour_images([1], 1, 2)
    img = hf_images(backbone, images)
    base = softmax(img @ hf_text(backbone, [f"a photo of a {c}" for c in CLASSES]).T, axis=1).max(1)
    # two features in the queue, k = 5: the smallest cosine (the official kthvalue needs at least k)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), base - (img @ img.T).min(0), rtol=1e-5, atol=1e-6)
