"""LAPT against (1) the official selection, training loss (with its gradient) and score re-expressed on plain tensors
(golden/make_lapt_golden.py, numbers in golden/lapt.json, YBZh/OpenOOD-VLM commit 804f331) and (2) hand computations
on the tiny CLIP read side by side with openood/networks/clip_coop_negprompt.py:516-714 (prompts: "[ctx] class." and
"[ood_ctx] label.") and openood/trainers/oodmixup_trainer.py:605-955 (one SGD nesterov step on the cross-modal mix,
cosine per step). Edges: one ID class, no test negative, no image, labels out of range, no negative image."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from helpers.images import CLASSES, colour_images

import detectors
from detectors.base import ImageSet
from detectors.clip.adaneg import select_negatives
from detectors.clip.lapt import (
    NegativePromptLearner,
    cross_distribution_pairs,
    filter_name,
    lapt_loss,
    select_collected,
)
from detectors.clip.prompts import PLACEHOLDER
from detectors.clip.scores import neglabel
from pipelines.data import make_row, write_manifest

GOLDEN = Path(__file__).with_name("golden")
NOUNS = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar", "kite", "lamp"]
ADJS = ["shiny", "wooden", "tiny", "ancient", "blue"]
FAST = dict(words=NOUNS, adjectives=ADJS, n_train_negatives=4, n_negatives=8, ngroup=2, epochs=1, train_batch=4,
            progress=False)


def golden_inputs() -> dict[str, torch.Tensor]:
    spec = importlib.util.spec_from_file_location("make_lapt_golden", GOLDEN / "make_lapt_golden.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.inputs()


def test_selection_loss_and_score_match_the_official_code():
    gold, x = json.loads((GOLDEN / "lapt.json").read_text()), golden_inputs()
    # cosine matrices as embeddings against the identity: select_negatives reads back exactly these cosines
    eye = torch.eye(x["adj_cos"].shape[1])
    for total, (adj, noun) in gold["selection"].items():
        keep_a, keep_n = select_negatives(x["noun_cos"], x["adj_cos"], eye, int(total))
        assert (keep_a.tolist(), keep_n.tolist()) == (adj, noun)
    C = gold["C"]
    for strategy in ("wccm", "wccm_cd"):
        g = gold[strategy]
        text = x["text"].clone().requires_grad_(True)
        pair = torch.tensor(g["pair"]) if "pair" in g else None
        loss = lapt_loss(x["images"], text, x["mix_text"], x["labels"], gold["scale"], g["lam"],
                         torch.tensor(g["template_idx"]), pair, g.get("lam_cd"))
        loss.backward()
        np.testing.assert_allclose(float(loss.detach()), g["loss"], rtol=1e-5)
        np.testing.assert_allclose(text.grad.numpy(), np.array(g["grad"]), rtol=1e-4, atol=1e-6)
    for group_num in (1, 4, 21):
        g = gold[f"score_g{group_num}"]
        text = x["score_text"]
        got = neglabel(x["images"], text[:C], text[C:], 1.0 / gold["scale"], group_num, 0)
        np.testing.assert_allclose(got, g["score"], rtol=1e-5, atol=1e-7)
        assert (x["images"] @ text[:C].T).argmax(1).tolist() == g["pred"]


def test_cross_distribution_pairs_cross_the_two_kinds():
    labels = torch.tensor([0, 1, 5, 2, 7, 6])
    pair = cross_distribution_pairs(labels, 3, torch.Generator().manual_seed(0))
    assert all((labels[i] < 3) != (labels[int(j)] < 3) for i, j in enumerate(pair))
    only_id = torch.tensor([0, 1, 2])
    assert cross_distribution_pairs(only_id, 3, torch.Generator()).tolist() == [0, 1, 2]


def test_negative_prompts_carry_their_own_context(backbone):
    learner = NegativePromptLearner(backbone, ["dog", "bronze vessel"], ["kite", "shiny"], n_ctx=4)
    placeholder = backbone.token_embeddings(backbone.tokenize([PLACEHOLDER]))[0, 1]
    ctx = " ".join([PLACEHOLDER] * 4)
    with torch.no_grad():
        learner.ctx.copy_(placeholder.expand(4, -1))
        learner.ood_ctx.copy_(placeholder.expand(4, -1))
        got = learner()
        expected = backbone.encode_texts([f"{ctx} dog.", f"{ctx} bronze vessel.", f"{ctx} kite.", f"{ctx} shiny."])
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
        learner.ood_ctx.add_(torch.randn(learner.ood_ctx.shape, generator=torch.Generator().manual_seed(0)))
        moved = learner()
    torch.testing.assert_close(moved[:2], got[:2])
    assert (moved[2:] - got[2:]).abs().max() > 1e-3
    assert learner.ood.numel() == 0 and not torch.equal(
        NegativePromptLearner(backbone, ["dog"], ["kite"], 4).ctx, NegativePromptLearner(backbone, ["dog"], ["kite"],
                                                                                           4).ood_ctx)


def test_negative_labels_are_mined_as_the_official_by_hand(backbone):
    det = detectors.build("lapt", model=backbone, class_names=["dog", "red"], **FAST)  # "dog" is an ID class
    unit = lambda a: a / np.linalg.norm(a, axis=-1, keepdims=True)  # noqa: E731
    enc = lambda texts: backbone.encode_texts(texts).double().numpy()  # noqa: E731
    cls = unit(enc(["The nice dog.", "The nice red."]))
    nouns = [w for w in NOUNS if w != "dog"]
    noun_key = np.sort(unit(enc([f"The nice {w}." for w in nouns])) @ cls.T, axis=1)[:, int(2 * 0.95)]
    adj_key = np.sort(unit(enc([f"This is a {w} photo." for w in ADJS])) @ cls.T, axis=1)[:, int(2 * 0.95)]

    def pick(total):
        n_adj = int(total * (len(ADJS) / (len(ADJS) + len(nouns))))
        return ([ADJS[i] for i in np.argsort(adj_key, kind="stable")[:n_adj]]
                + [nouns[i] for i in np.argsort(noun_key, kind="stable")[:total - n_adj]])

    assert det.train_negative_words == pick(4) and det.negative_words == pick(8)
    assert "dog" not in det.negative_words


def test_one_training_step_equals_a_hand_sgd_step(backbone):
    """One batch, one template: the step is independent of the shuffling; loss written out, SGD nesterov by hand."""
    images = colour_images([0], 3, 0) + colour_images([1], 3, 1) + colour_images([2], 2, 2)
    det = detectors.build("lapt", model=backbone, class_names=CLASSES, **{**FAST, "train_batch": 16},
                          mix_templates=["a photo of a {}."], seed=3)
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 5])  # two images of training negatives 0 and 3
    det.fit(ImageSet(images=images, labels=labels))
    learner = NegativePromptLearner(backbone, CLASSES, det.train_negative_words, 4, seed=3)
    x = F.normalize(det.features(ImageSet(images=images)).global_.double(), dim=-1)
    names = CLASSES + det.train_negative_words
    label_text = backbone.encode_texts([f"a photo of a {n}." for n in names]).double()
    lam = np.random.default_rng(3).beta(1.0, 1.0)
    mixed = F.normalize(lam * x + (1 - lam) * label_text[labels], dim=-1)
    text = learner().double()
    logits = backbone.logit_scale * mixed @ text.T
    loss = -logits.log_softmax(-1)[torch.arange(8), torch.as_tensor(labels)].mean()
    np.testing.assert_allclose(det.losses, [float(loss.detach())], rtol=1e-4)
    loss.backward()
    for name in ("ctx", "ood_ctx"):
        w, grad = getattr(learner, name).detach(), getattr(learner, name).grad.float()
        d = grad + 1e-5 * w  # weight decay; nesterov with zero momentum buffer: w - lr (d + 0.9 d)
        np.testing.assert_allclose(det.state()[f"prompt.{name}"], (w - 0.01 * (d + 0.9 * d)).numpy(), rtol=1e-4,
                                   atol=1e-7)
    assert det.lrs == [0.01]


def test_cosine_per_step_and_the_score_on_the_learned_prompts(backbone):
    images = colour_images([0], 4, 0) + colour_images([1], 4, 1) + colour_images([2], 3, 2)
    labels = np.array([0] * 4 + [1] * 4 + [2, 3, 4])
    det = detectors.build("lapt", model=backbone, class_names=CLASSES, **{**FAST, "epochs": 2},
                          mix_strategy="wccm_cd").fit(ImageSet(images=images, labels=labels))
    total = 2 * math.ceil(11 / 4)
    np.testing.assert_allclose(det.lrs, [0.01 * 0.5 * (1 + math.cos(math.pi * s / total)) for s in range(total)])
    assert len(det.losses) == total and np.isfinite(det.losses).all()
    test = ImageSet(images=colour_images([0, 1], 5, 7))
    text = det.prompt_text()
    assert text.shape[0] == 2 + 8  # the test negatives, with the trained negative context
    expected = neglabel(det.features(test).global_, text[:2], text[2:], 1 / backbone.logit_scale, 2, 0)
    np.testing.assert_allclose(det.score(test), expected)
    assert det.predict(test).tolist() == (det.features(test).global_ @ text[:2].T).argmax(1).tolist()


def test_negative_manifest_rows_are_labelled_by_their_ood_set(backbone, tmp_path):
    det = detectors.build("lapt", model=backbone, class_names=CLASSES, **FAST, negative_manifest=str(tmp_path))
    words = det.train_negative_words
    rows = []
    for i, image in enumerate(colour_images([2], 3, 5)):
        image.save(tmp_path / f"neg{i}.png")
        rows.append(make_row(f"neg{i}.png", split="train", role="ood", ood_set=words[[1, 3, 1][i]]))
    write_manifest(tmp_path, rows)
    train = ImageSet(images=colour_images([0], 2, 0) + colour_images([1], 2, 1), labels=np.array([0, 0, 1, 1]))
    feats, labels = det.training_set(train)
    assert labels.tolist() == [0, 0, 1, 1, 3, 5, 3] and len(feats) == 7
    det.fit(train)
    colour_images([2], 1, 6)[0].save(tmp_path / "other.png")
    write_manifest(tmp_path, rows + [make_row("other.png", role="ood", ood_set="not a negative")])
    with pytest.raises(ValueError, match="not training negatives"):
        det.fit(train)


def test_edges_one_class_no_negative_no_image_bad_labels(backbone):
    one = detectors.build("lapt", model=backbone, class_names=["red"], **FAST)
    images = ImageSet(images=colour_images([0], 2, 0) + colour_images([2], 1, 2), labels=np.array([0, 0, 1]))
    scores = one.fit(images).score(ImageSet(images=colour_images([0], 3, 4)))
    assert scores.shape == (3,) and np.all((scores > 0) & (scores <= 1))
    assert one.score(ImageSet(images=[])).shape == (0,)
    none = detectors.build("lapt", model=backbone, class_names=CLASSES, **{**FAST, "n_negatives": 0})
    with pytest.warns(UserWarning, match="no negative-label images"):
        none.fit(ImageSet(images=colour_images([0], 2, 0) + colour_images([1], 2, 1), labels=np.array([0, 0, 1, 1])))
    np.testing.assert_allclose(none.score(ImageSet(images=colour_images([0], 2, 4))), 1.0)  # no negative: all ID
    with pytest.raises(ValueError, match=r"labels must lie in \[0, 6\)"):
        detectors.build("lapt", model=backbone, class_names=CLASSES, **FAST).fit(
            ImageSet(images=colour_images([0], 2, 0), labels=np.array([0, 6])))
    with pytest.raises(ValueError, match="no training image"):
        detectors.build("lapt", model=backbone, class_names=CLASSES, **FAST).fit(
            ImageSet(images=[], labels=np.zeros(0, dtype=int)))


def test_defaults_are_the_official_scripts(backbone):
    p = detectors.build("lapt", model=backbone, class_names=CLASSES).params
    assert (p["n_ctx"], p["n_train_negatives"], p["n_negatives"], p["ngroup"], p["shots"]) == (4, 1000, 10000, 100,
                                                                                               None)
    assert (p["lr"], p["momentum"], p["weight_decay"], p["train_batch"], p["epochs"]) == (0.01, 0.9, 1e-5, 32, 10)
    assert (p["mix_strategy"], p["alpha"], p["schedule"], len(p["mix_templates"])) == ("wccm", 1.0, "cosine_step", 7)
    assert p["templates"] == ["The nice {}."] and p["adj_template"] == "This is a {} photo."


def test_select_collected_follows_the_official_filter():
    """Per label: `shot` random rows among those predicted as the label; else the `shot` most confident (ties in row
    order)."""
    probs = torch.tensor([[0.6, 0.4], [0.7, 0.3], [0.9, 0.1], [0.2, 0.8],  # label 0: three right
                          [0.5, 0.5], [0.6, 0.4], [0.3, 0.7], [0.8, 0.2]])  # label 1: one right
    labels = [0, 0, 0, 0, 1, 1, 1, 1]
    kept = select_collected(probs, labels, shot=2, seed=5)
    import random

    right0 = random.Random(5).sample([0, 1, 2], k=2)
    assert kept == sorted(right0 + [4, 6])  # label 1: 0.7 (row 6), then 0.5 (row 4) before 0.4 and 0.2
    assert select_collected(probs, labels, shot=10) == list(range(8))  # fewer than shot: every row


def test_filter_collected_classifies_over_classes_and_training_negatives(backbone):
    det = detectors.build("lapt", model=backbone, class_names=["red_thing", "green"], **FAST)
    images = colour_images([0], 3, 0) + colour_images([1], 3, 1) + colour_images([2], 3, 2)
    labels = np.array([0, 0, 0, 1, 1, 1, 2, 2, 3])
    kept = det.filter_collected(ImageSet(images=images, labels=labels), shot=1)
    names = ["red thing", "green"] + [w.lower() for w in det.train_negative_words]
    text = backbone.encode_texts([f"a photo of a {n}." for n in names]).double()
    feats = F.normalize(det.features(ImageSet(images=images)).global_.double(), dim=-1)
    probs = torch.softmax(backbone.logit_scale * feats @ text.T, dim=-1)
    expected = select_collected(probs, labels, shot=1)
    assert len(kept) == 4 and [images.index(im) for im in kept.images] == expected
    assert kept.labels.tolist() == labels[expected].tolist()
    assert filter_name(" Kite_(bird of prey)/x ") == "kite bird of prey x"
