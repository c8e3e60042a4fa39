"""NegRefine against (1) the official score re-expressed on plain tensors with a stand-in text encoder
(golden/make_negrefine_golden.py, numbers in golden/negrefine.json, ah-ansari/NegRefine commit 72e4b82) and (2) a
float64 numpy computation by hand on the tiny CLIP, read side by side with src/clip_ood.py:105-124 (ensembles),
:127-165 (NegLabel grouping), :168-191 (multi-matching: top 5 ID x top 5 negative labels, "<ID> and <negative>",
exp(a) / (exp(a) + exp(b))), :195-208 (NegLabel + 2 x multi-matching) and src/create_negs.py:12-122 (initial labels:
CSP with the largest cosine, ID class names removed). The LLM filter (src/neg_filter.py) is not run: its output
is given as `negative_nouns` / `negative_adjectives`. Edges: one ID class, no image, fewer negatives than k_neg."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import expit, softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.csp import CONJUGATE_TEMPLATES, NOUN_TEMPLATES, SUPERCLASS_TEMPLATES
from detectors.clip.negrefine import multi_matching
from detectors.clip.scores import neglabel

GOLDEN = Path(__file__).with_name("golden")
FILTERED_NOUNS = ["apple", "boat", "cloud", "dog"]
FILTERED_CONJ = ["wooden object", "shiny scene", "blue item"]


def golden_module():
    spec = importlib.util.spec_from_file_location("make_negrefine_golden", GOLDEN / "make_negrefine_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def unit64(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def ensemble(backbone, words, templates) -> np.ndarray:
    tok = backbone.processor.tokenizer([t.format(w) for w in words for t in templates], padding=True,
                                       return_tensors="pt")
    with torch.no_grad():
        raw = backbone.model.get_text_features(**tok).pooler_output.double().numpy()
    return unit64(raw.reshape(len(words), len(templates), -1).mean(1))


def hf_images(backbone, images) -> np.ndarray:
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output.numpy())


@pytest.mark.parametrize("name", ["g4", "g1_k3_k2"])
def test_score_matches_the_official_code(name):
    module = golden_module()
    gold, x = json.loads((GOLDEN / "negrefine.json").read_text()), module.inputs()
    assert gold["commit"].startswith("72e4b82")
    cfg = gold[name]

    def embed(texts):
        raw = module.fake_encode_text([t.format(w) for w in texts for t in NOUN_TEMPLATES])
        return torch.nn.functional.normalize(raw.view(len(texts), len(NOUN_TEMPLATES), -1).mean(1), dim=-1)

    img, pos, neg = x["images"], x["pos"], x["neg"]
    mm = multi_matching(img, 100.0 * img @ pos.T, 100.0 * img @ neg.T, module.POS_LABELS, module.NEG_LABELS, embed,
                        cfg["k_pos"], cfg["k_neg"], 100.0)
    np.testing.assert_allclose(mm, cfg["multi_matching"], rtol=1e-5, atol=1e-6)
    base = neglabel(img, pos, neg, temperature=0.01, ngroup=cfg["ngroup"], seed=0)
    np.testing.assert_allclose(base + 2 * mm, cfg["score"], rtol=1e-5, atol=1e-6)


def hand_score(backbone, images, classes, nouns, conj, k_pos=5, k_neg=5, scale=100.0):
    img = hf_images(backbone, images)
    pos = ensemble(backbone, classes, NOUN_TEMPLATES)
    neg = np.concatenate([ensemble(backbone, nouns, NOUN_TEMPLATES), ensemble(backbone, conj, CONJUGATE_TEMPLATES)])
    labels = nouns + conj
    pl, nl = scale * img @ pos.T, scale * img @ neg.T
    base = softmax(np.concatenate([pl, nl], 1), axis=1)[:, :len(classes)].sum(1)  # ngroup = 1
    kp, kn = min(k_pos, len(classes)), min(k_neg, len(labels))
    mm = []
    for i in range(len(img)):
        top_p, top_n = np.argsort(-pl[i])[:kp], np.argsort(-nl[i])[:kn]
        texts = [f"{classes[p]} and {labels[n]}" for p in top_p for n in top_n]
        a = scale * ensemble(backbone, texts, NOUN_TEMPLATES) @ img[i]
        mm.append(expit(a - np.tile(nl[i, top_n], kp)).max())
    return base + 2 * np.array(mm)


@pytest.mark.parametrize("temperature", [0.01, 0.2])  # 0.2: the tiny CLIP's multi-matching sigmoids unsaturated
def test_negrefine_with_filtered_labels_equals_the_official_recipe_by_hand(backbone, temperature):
    det = detectors.build("negrefine", model=backbone, class_names=CLASSES, negative_nouns=FILTERED_NOUNS,
                          negative_adjectives=FILTERED_CONJ, ngroup=1, temperature=temperature)
    images = colour_images([0], 3, 7) + colour_images([1], 2, 8)
    assert det.negative_words == FILTERED_NOUNS + FILTERED_CONJ
    expected = hand_score(backbone, images, CLASSES, FILTERED_NOUNS, FILTERED_CONJ, scale=1 / temperature)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), expected, rtol=2e-4, atol=1e-5)


def test_without_filtered_labels_the_initial_labels_are_used_with_a_warning(backbone):
    nouns = ["apple", "boat", "cloud", "dog", "egg", "fish", "red", "hat", "ice", "jar"]
    adjs = ["shiny", "wooden", "tiny", "ancient", "blue", "soft"]
    det = detectors.build("negrefine", model=backbone, class_names=CLASSES, words=nouns, adjectives=adjs,
                          neg_fraction=0.5, ngroup=1)
    with pytest.warns(UserWarning, match="no LLM-filtered negative labels"):
        words = det.negative_words
    kept_nouns = [w for w in nouns if w != "red"]  # create_negs.py:64-65: ID class names left out
    pos = ensemble(backbone, CLASSES, NOUN_TEMPLATES)
    random.seed(0)
    conj = [random.choice(SUPERCLASS_TEMPLATES).format(a) for a in adjs]

    def keep(text, n):
        sim = text @ pos.T
        key = sim.max(1)  # percentile 1
        key[key > 0.95] = 1.0
        return np.argsort(key, kind="stable")[: int(n * 0.5)]

    kn = keep(ensemble(backbone, kept_nouns, NOUN_TEMPLATES), len(kept_nouns))
    kc = keep(ensemble(backbone, conj, CONJUGATE_TEMPLATES), len(conj))
    assert words == [kept_nouns[i] for i in kn] + [conj[i] for i in kc]


def test_defaults_are_the_official_code(backbone):
    p = detectors.build("negrefine", model=backbone, class_names=CLASSES).params
    assert (p["percentile"], p["drop_class_names"], p["neg_fraction"], p["k_pos"], p["k_neg"], p["mm_weight"],
            p["ngroup"], p["temperature"], p["templates"]) == (1.0, True, 0.15, 5, 5, 2.0, 100, 0.01,
                                                               list(NOUN_TEMPLATES))


def test_one_id_class_few_negatives_and_an_empty_set(backbone):
    det = detectors.build("negrefine", model=backbone, class_names=["red"], negative_nouns=["apple", "boat"],
                          negative_adjectives=["wooden object"], ngroup=1)
    images = colour_images([0], 2, 3)
    np.testing.assert_allclose(det.score(ImageSet(images=images)),
                               hand_score(backbone, images, ["red"], ["apple", "boat"], ["wooden object"]), rtol=2e-4,
                               atol=1e-5)  # k_pos 5 -> 1, k_neg 5 -> 3
    assert det.score(ImageSet(images=[])).shape == (0,)
