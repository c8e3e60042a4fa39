"""CSP against (1) the official code's conjugation, selection and score re-expressed on plain tensors
(golden/make_csp_golden.py, numbers in golden/csp.json, repo commit 3a7bdab) and (2) a float64 numpy computation by
hand on the tiny CLIP's embeddings of the official recipe, read side by side with MengyuanChen21/NeurIPS2024-CSP:
mmcls/models/classifiers/multi_modal.py:58-70 (ID ensemble: mean of raw embeddings, renormalised), :87-113
(nouns over 8 templates, each adjective conjugated by one random.choice of a superclass word, then 4 templates),
:137-141 (raw means renormalised), :160-181 (0.95 quantile, cosine > 0.95 ranked last, 15% per part) and
mmcls/models/ood/clip_ood.py:25-49 (groups, softmax ID mass at t = 1 on 100 cos). Edges: one ID class, no image,
tied keys."""
from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import numpy as np
import pytest
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.csp import (
    CONJUGATE_TEMPLATES,
    CSP_EXCLUDED,
    NOUN_TEMPLATES,
    SUPERCLASS_TEMPLATES,
    conjugate,
    mine_csp,
)
from detectors.clip.scores import neglabel

GOLDEN = Path(__file__).with_name("golden")
NOUNS = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar", "kite", "lamp"]
ADJS = ["shiny", "wooden", "tiny", "ancient", "blue", "soft", "loud", "sunny"]


def golden_inputs() -> dict[str, torch.Tensor]:
    spec = importlib.util.spec_from_file_location("make_csp_golden", GOLDEN / "make_csp_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.inputs()


def unit64(a) -> np.ndarray:
    a = np.asarray(a, dtype=np.float64)
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def raw_text(backbone, texts) -> np.ndarray:
    tok = backbone.processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return backbone.model.get_text_features(**tok).pooler_output.double().numpy()


def ensemble(backbone, words, templates) -> np.ndarray:
    raw = raw_text(backbone, [t.format(w) for w in words for t in templates])
    return unit64(raw.reshape(len(words), len(templates), -1).mean(1))


def hand_keep(cand: np.ndarray, pos: np.ndarray, fraction: float) -> np.ndarray:
    sim = cand @ pos.T
    key = np.quantile(sim, 0.95, axis=1)
    key[sim.max(1) > 0.95] = 1.0
    return np.argsort(key, kind="stable")[: int(len(cand) * fraction)]


def image_features(backbone, images) -> np.ndarray:
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output.numpy())


def test_conjugation_selection_and_score_match_the_official_code():
    gold = json.loads((GOLDEN / "csp.json").read_text())
    assert gold["commit"].startswith("3a7bdab")
    words = ["wooden", "shiny", "ancient", "blue"]
    assert [t.format(c) for c in conjugate(words) for t in CONJUGATE_TEMPLATES] == gold["conjugated_prompts"]
    x = golden_inputs()
    for fraction in (0.15, 0.3):
        assert mine_csp(x["nouns"], x["pos"], fraction, chunk=7).tolist() == gold[f"kept_nouns_{fraction}"]
        assert mine_csp(x["adjs"], x["pos"], fraction).tolist() == gold[f"kept_adjs_{fraction}"]
    neg = torch.cat([x["nouns"][gold["kept_nouns_0.3"]], x["adjs"][gold["kept_adjs_0.3"]]])
    for ngroup in (1, 4, 18):
        got = neglabel(x["images"], x["pos"], neg, temperature=0.01, ngroup=ngroup, seed=0, batch_size=3)
        np.testing.assert_allclose(got, gold[f"score_ngroup{ngroup}"], rtol=2e-5, atol=1e-7)


@pytest.mark.parametrize("ngroup", [1, 2])
def test_csp_equals_the_official_recipe_by_hand(backbone, ngroup):
    det = detectors.build("csp", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS,
                          neg_fraction=0.5, ngroup=ngroup)
    pos = ensemble(backbone, CLASSES, NOUN_TEMPLATES)
    noun_t = ensemble(backbone, NOUNS, NOUN_TEMPLATES)
    random.seed(0)  # the official global Python random, one choice per adjective
    conj = [random.choice(SUPERCLASS_TEMPLATES).format(a) for a in ADJS]
    conj_t = ensemble(backbone, conj, CONJUGATE_TEMPLATES)
    keep_n, keep_c = hand_keep(noun_t, pos, 0.5), hand_keep(conj_t, pos, 0.5)
    assert det.negative_words == [NOUNS[i] for i in keep_n] + [conj[i] for i in keep_c]
    np.testing.assert_allclose(det.class_text().double().numpy(), pos, atol=2e-6)
    images = colour_images([0], 3, 7) + colour_images([1], 2, 8)
    img = image_features(backbone, images)
    neg = np.concatenate([noun_t[keep_n], conj_t[keep_c]])  # 6 + 4 = 10 negatives
    if ngroup == 1:
        groups = [neg]
    else:
        perm = torch.randperm(10, generator=torch.Generator().manual_seed(0)).numpy()
        groups = list(neg[perm].reshape(2, 5, -1))
    expected = np.mean([softmax(100.0 * np.concatenate([img @ pos.T, img @ g.T], 1), axis=1)[:, :2].sum(1)
                        for g in groups], axis=0)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), expected, rtol=2e-4, atol=1e-6)


def test_defaults_are_the_official_config(backbone):
    det = detectors.build("csp", model=backbone, class_names=CLASSES)
    p = det.params
    assert p["templates"] == list(NOUN_TEMPLATES) and len(SUPERCLASS_TEMPLATES) == 14
    assert set(CSP_EXCLUDED) == {"noun.animal", "noun.food", "noun.person", "noun.quantity", "noun.group", "adj.pert"}
    assert (p["neg_fraction"], p["percentile"], p["max_sim"], p["temperature"], p["ngroup"], p["seed"],
            p["conjugate_seed"]) == (0.15, 0.95, 0.95, 0.01, 100, 0, 0)


def test_one_id_class_and_an_empty_set(backbone):
    det = detectors.build("csp", model=backbone, class_names=["red"], words=NOUNS, adjectives=ADJS, ngroup=3,
                          neg_fraction=0.5)
    images = colour_images([0], 2, 3)
    got = det.score(ImageSet(images=images))
    pos, neg = ensemble(backbone, ["red"], NOUN_TEMPLATES), det.negative_text().double().numpy()
    img = image_features(backbone, images)
    keep = 9  # 10 negatives, the last one dropped, 3 groups of 3
    perm = torch.randperm(keep, generator=torch.Generator().manual_seed(0)).numpy()
    expected = np.mean([softmax(100.0 * np.concatenate([img @ pos.T, img @ g.T], 1), axis=1)[:, 0]
                        for g in neg[:keep][perm].reshape(3, 3, -1)], axis=0)
    np.testing.assert_allclose(got, expected, rtol=2e-4, atol=1e-6)
    assert det.score(ImageSet(images=[])).shape == (0,)


def test_tied_keys_keep_the_candidates_order():
    pos = torch.eye(3, 4)
    cand = torch.tensor([[0.0, 0, 0, 1], [0, 0, 0, 1], [1, 0, 0, 0], [0, 0, 0, 1], [0.999, 0.04, 0, 0]])
    cand = cand / cand.norm(dim=1, keepdim=True)
    # candidates 0, 1, 3 tie (cosines all 0); 2 and 4 are within 0.95 of class 0: key 1.0, last, in their order
    assert mine_csp(cand, pos, fraction=1.0).tolist() == [0, 1, 3, 2, 4]
    assert mine_csp(cand[:0], pos).tolist() == []
