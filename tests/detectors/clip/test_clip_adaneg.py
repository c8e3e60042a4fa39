"""AdaNeg against (1) the official postprocessor re-expressed on plain tensors (golden/make_adaneg_golden.py, numbers in
golden/adaneg.json, YBZh/OpenOOD-VLM commit 804f331) and (2) a float64 numpy stream written by hand from the official
code, read side by side with openood/postprocessors/ttaprompt_postprocessor.py:772-779 (memory: the text embedding,
then `memleng` empty slots), :783-809 (static grouped ID mass), :813-868 (ID then negative storage, replacing the
highest-entropy slot), :871-894 (mean or sample-adaptive proxies), :900-946 (adaptive score, in_score) and, for the
negative labels, openood/networks/clip_fixed_ood_prompt.py:566-584 and :646, :415-416 (prompts). The stream is the
images of one `score` call in their order: the result depends on that order only (and the batch size). Edges: one
ID class, no image, tied entropies."""
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
from detectors.clip.adaneg import Memory, adaneg_stream

GOLDEN = Path(__file__).with_name("golden")
NOUNS = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar", "red"]
ADJS = ["shiny", "wooden", "tiny", "ancient", "blue", "soft", "loud"]


def golden_inputs() -> dict[str, torch.Tensor]:
    spec = importlib.util.spec_from_file_location("make_adaneg_golden", GOLDEN / "make_adaneg_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.inputs()


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


def hand_stream(img, text, n_cls, scale, ngroup, length, thres, gap, lam, beta, samada, rule, batch):
    """The official postprocess over batches, in numpy float64 with a Python list per label. Returns (scores,
    number of replacements)."""
    n_neg = len(text) - n_cls
    ngroup = max(1, min(ngroup, n_neg))
    keep = n_neg - n_neg % ngroup
    perm = torch.randperm(keep, generator=torch.Generator().manual_seed(0)).numpy()
    memory = HandMemory(text, length)

    def mass(logits):
        neg = logits[:, n_cls:][:, :keep][:, perm].reshape(len(logits), ngroup, -1)
        return np.mean([softmax(np.concatenate([logits[:, :n_cls], neg[:, g]], 1), axis=1)[:, :n_cls].sum(1)
                        for g in range(ngroup)], axis=0)

    out = []
    for s in range(0, len(img), batch):
        x = img[s:s + batch]
        logits = scale * x @ text.T
        s0 = mass(logits)
        for i in range(len(x)):
            if s0[i] > thres + gap * (1 - thres):
                memory.store(int(np.argmax(logits[i, :n_cls])), x[i], hand_entropy(logits[i, :n_cls]))
        for i in range(len(x)):
            if s0[i] < thres - gap * thres:
                memory.store(n_cls + int(np.argmax(logits[i, n_cls:])), x[i], hand_entropy(logits[i, n_cls:]))
        s1 = mass(hand_adaptive_logits(x, memory.slots, scale, beta, samada))
        out.append({"combine": s1 + lam * s0, "adaonly": s1, "vanillaonly": s0, "multiply": s1 * s0}[rule])
    return np.concatenate(out), memory.replaced


def hand_entropy(logits) -> float:
    p = softmax(logits)
    return float(-(p * np.log(p + 1e-8)).sum())


def hand_adaptive_logits(x, slots, scale, beta, samada) -> np.ndarray:
    """The logits against the memory's proxies: per image similarity-weighted (samada), else each label's mean."""
    mem = np.stack([np.stack(m) for m in slots])  # [K, L+1, D]
    if samada:
        ada = np.stack([[np.sum(np.exp(-beta * (1 - m @ xi))[:, None] * m, 0) for m in mem] for xi in x])
        return scale * np.einsum("bd,bkd->bk", x, unit64(ada))
    return scale * x @ unit64(mem.mean(1)).T


class HandMemory:
    """Per label: the text embedding then `length` slots (zeros until filled) with their entropies; once a label's
    count reaches `length`, a new entry replaces its highest-entropy slot (the last of ties) when its entropy is below
    some slot's."""

    def __init__(self, text, length):
        self.length = length
        self.slots = [[t] + [np.zeros_like(t)] * length for t in text]
        self.ents = [[0.0] * (length + 1) for _ in text]
        self.count = [1] * len(text)
        self.replaced = 0

    def store(self, k, f, e):
        slots, ents, count, length = self.slots, self.ents, self.count, self.length
        if count[k] == length:
            if any(e < v for v in ents[k]):
                j = max(range(length + 1), key=lambda s: (ents[k][s], s))
                slots[k][j], ents[k][j] = f, e
                self.replaced += 1
        else:
            slots[k][count[k]], ents[k][count[k]] = f, e
            count[k] += 1


@pytest.mark.parametrize("name", ["combine", "samada", "multiply_gap0"])
def test_stream_matches_the_official_postprocessor(name):
    gold = json.loads((GOLDEN / "adaneg.json").read_text())
    assert gold["commit"].startswith("804f331") and gold[name]["replaced"] > 0
    cfg, x = gold[name]["config"], golden_inputs()
    got = adaneg_stream(x["images"], x["text"], gold["n_cls"], gold["scale"], cfg["group_num"], 0, cfg["memleng"],
                        cfg["thres"], cfg["gap"], cfg["lambdaval"], int(cfg["beta"]), cfg["samada"], cfg["in_score"],
                        gold["batch"])
    np.testing.assert_allclose(got, gold[name]["scores"], rtol=1e-5, atol=1e-6)
    hand, _ = hand_stream(unit64(x["images"]), unit64(x["text"]), gold["n_cls"], gold["scale"],
                          cfg["group_num"], cfg["memleng"], cfg["thres"], cfg["gap"], cfg["lambdaval"],
                          int(cfg["beta"]), cfg["samada"], cfg["in_score"], gold["batch"])
    np.testing.assert_allclose(got, hand, rtol=1e-10, atol=1e-12)


def stream_images():
    return (colour_images([0], 4, 1) + colour_images([1], 3, 2) + colour_images([2], 3, 3) + colour_images([0], 2, 4)
            + colour_images([0, 1], 3, 5))


SETTINGS = dict(n_negatives=6, ngroup=2, memory_length=2, thres=0.5, gap=0.0, lam=0.3, batch_size=4)


@pytest.mark.parametrize("sample_adaptive", [False, True])
def test_adaneg_equals_the_official_recipe_by_hand(backbone, sample_adaptive):
    det = detectors.build("adaneg", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS,
                          sample_adaptive=sample_adaptive, **SETTINGS)
    pos = hf_text(backbone, [f"The nice {c}." for c in CLASSES])
    nouns = [w for w in NOUNS if w not in CLASSES]  # "red" is an ID class name: removed
    noun_t, adj_t = hf_text(backbone, [f"The nice {w}." for w in nouns]), hf_text(backbone, [f"This is a {w} photo."
                                                                                            for w in ADJS])
    adj_num = int(6 * len(ADJS) / (len(ADJS) + len(nouns)))  # 6 * 7 / 17 -> 2 adjectives, 4 nouns
    col = int(len(CLASSES) * 0.95)
    keep_a = np.argsort(np.sort(adj_t @ pos.T, axis=1)[:, col], kind="stable")[:adj_num]
    keep_n = np.argsort(np.sort(noun_t @ pos.T, axis=1)[:, col], kind="stable")[:6 - adj_num]
    assert det.negative_words == [ADJS[i] for i in keep_a] + [nouns[i] for i in keep_n]
    images = stream_images()
    img = hf_images(backbone, images)
    text = np.concatenate([pos, adj_t[keep_a], noun_t[keep_n]])
    expected, replaced = hand_stream(img, text, 2, 100.0, 2, 2, 0.5, 0.0, 0.3, 5.0, sample_adaptive, "combine", 4)
    assert replaced > 0  # the stream fills a memory and replaces in it
    got = det.score(ImageSet(images=images))
    np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-6)
    static, _ = hand_stream(img, text, 2, 100.0, 2, 2, 0.5, 0.0, 0.3, 5.0, sample_adaptive, "vanillaonly", 4)
    assert np.abs(got - 1.3 * static).max() > 1e-3  # the memory moved the scores away from the text-only ones


def test_the_score_depends_only_on_the_order_of_the_call(backbone):
    det = detectors.build("adaneg", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS, **SETTINGS)
    images = stream_images()
    first = det.score(ImageSet(images=images))
    np.testing.assert_array_equal(det.score(ImageSet(images=images)), first)  # no memory carried across calls
    reverse = det.score(ImageSet(images=images[::-1]))[::-1]
    assert np.abs(reverse - first).max() > 1e-6  # another order, another stream
    img, text = hf_images(backbone, images[::-1]), det_text(det)
    hand, _ = hand_stream(img, text, 2, 100.0, 2, 2, 0.5, 0.0, 0.3, 5.0, False, "combine", 4)
    np.testing.assert_allclose(reverse, hand[::-1], rtol=1e-4, atol=1e-6)
    one_batch = detectors.build("adaneg", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS,
                                **{**SETTINGS, "batch_size": 64})
    assert np.abs(one_batch.score(ImageSet(images=images)) - first).max() > 1e-6  # the batch is part of the stream


def det_text(det) -> np.ndarray:
    return torch.cat([det.class_text(), det.negative_text()]).double().numpy()


def test_defaults_are_the_official_script(backbone):
    p = detectors.build("adaneg", model=backbone, class_names=CLASSES).params
    assert (p["templates"], p["adj_template"]) == (["The nice {}."], "This is a {} photo.")
    assert (p["n_negatives"], p["percentile"], p["temperature"], p["ngroup"], p["memory_length"], p["thres"],
            p["gap"], p["lam"], p["beta"], p["sample_adaptive"], p["score_rule"], p["batch_size"]) == \
        (10_000, 0.95, 0.01, 5, 10, 0.5, 0.5, 0.1, 5.0, False, "combine", 256)


def test_one_id_class_and_an_empty_set(backbone):
    det = detectors.build("adaneg", model=backbone, class_names=["red"], words=NOUNS, adjectives=ADJS, **SETTINGS)
    images = stream_images()
    got = det.score(ImageSet(images=images))
    text = det_text(det)
    assert len(text) == 7 and "red" not in det.negative_words
    hand, _ = hand_stream(hf_images(backbone, images), text, 1, 100.0, 2, 2, 0.5, 0.0, 0.3, 5.0, False, "combine", 4)
    np.testing.assert_allclose(got, hand, rtol=1e-4, atol=1e-6)
    assert det.score(ImageSet(images=[])).shape == (0,)
    none = detectors.build("adaneg", model=backbone, class_names=CLASSES, words=NOUNS, adjectives=ADJS,
                           **{**SETTINGS, "n_negatives": 0})
    np.testing.assert_allclose(none.score(ImageSet(images=images)), 1.3)  # no negative: ID mass 1 + 0.3 x 1


def test_a_full_memory_replaces_its_last_highest_entropy_slot():
    memory = Memory.empty(torch.eye(2, 3, dtype=torch.float64), length=3)
    for e in (0.7, 0.9):
        memory.insert(0, torch.full((3,), e, dtype=torch.float64), torch.tensor(e, dtype=torch.float64))
    assert memory.filled.tolist() == [3, 1]  # slots 1, 2 taken; the last slot (3) stays empty, as the official
    memory.insert(0, torch.ones(3, dtype=torch.float64), torch.tensor(0.95, dtype=torch.float64))
    assert memory.entropy[0].tolist() == [0.0, 0.7, 0.9, 0.0]  # no stored entropy above 0.95: kept out
    memory.entropy[0, 1] = 0.9  # tie between slots 1 and 2
    memory.insert(0, torch.zeros(3, dtype=torch.float64), torch.tensor(0.1, dtype=torch.float64))
    assert memory.entropy[0].tolist() == [0.0, 0.9, 0.1, 0.0] and memory.feats[0, 2].abs().sum() == 0
