"""MCM, GL-MCM, NegLabel and the image-feature cache against independent computations on a tiny CLIP."""
from __future__ import annotations

import numpy as np
import torch
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.neglabel import mine_negatives
from pipelines.data import make_row, write_manifest, read_manifest

from clip_toys import CLASSES, colour_images


def unit64(a: torch.Tensor) -> np.ndarray:
    a = a.double().numpy()
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def hf_image(backbone, images) -> np.ndarray:
    """Normalised image embeddings through transformers' own `get_image_features` (float64)."""
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output)


def hf_text(backbone, texts) -> np.ndarray:
    """Normalised text embeddings through transformers' own `get_text_features` (float64)."""
    tok = backbone.processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        return unit64(backbone.model.get_text_features(input_ids=tok["input_ids"], attention_mask=tok["attention_mask"]).pooler_output)


def test_mcm_equals_softmax_of_raw_cosine_over_temperature(backbone):
    images = colour_images([0], 3, 0) + colour_images([2], 3, 1)
    det = detectors.build("mcm", model=backbone, class_names=CLASSES + ["blue"], temperature=0.5)
    img, txt = hf_image(backbone, images), hf_text(backbone, [f"a photo of a {c}." for c in CLASSES + ["blue"]])
    expected = softmax(img @ txt.T / 0.5, axis=1).max(1)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), expected, rtol=1e-5)


def test_text_tower_from_embeddings_equals_get_text_features(backbone):
    texts = ["a photo of a dog.", "a bronze vessel with a long inscription"]
    tok = backbone.processor.tokenizer(texts, padding=True, return_tensors="pt")
    with torch.no_grad():
        expected = backbone.model.get_text_features(**tok).pooler_output
    ids = tok["input_ids"]
    ours = backbone.text_from_embeddings(backbone.token_embeddings(ids), backbone.eot_index(ids))
    torch.testing.assert_close(ours, expected, rtol=1e-5, atol=1e-6)


def test_glmcm_local_features_equal_last_block_with_self_only_attention(backbone):
    images = colour_images([1], 2, 3)
    pixels = backbone.preprocess(images)
    vision, model = backbone.model.vision_model, backbone.model
    with torch.no_grad():
        hidden = vision(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]
        tokens = hidden.shape[1]
        identity = torch.full((tokens, tokens), float("-inf")).fill_diagonal_(0.0)[None, None]
        out = vision.encoder.layers[-1](hidden, identity)
        expected = model.visual_projection(vision.post_layernorm(out[:, 1:]))
        global_, local = backbone.image_embeddings(pixels)
    torch.testing.assert_close(local, expected, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(global_, model.get_image_features(pixel_values=pixels).pooler_output)


def test_glmcm_score_adds_lambda_times_best_patch_mcm(backbone):
    images = colour_images([0], 2, 4) + colour_images([0, 1], 2, 5)
    imset = ImageSet(images=images)
    det = detectors.build("glmcm", model=backbone, class_names=CLASSES, lam=0.5)
    feats = det.features(imset)
    txt = det.class_text().double().numpy()
    g, loc = unit64(feats.global_), unit64(feats.local)
    expected = softmax(g @ txt.T, axis=-1).max(-1) + 0.5 * softmax(loc @ txt.T, axis=-1).max(-1).max(-1)
    np.testing.assert_allclose(det.score(imset), expected, rtol=1e-4)


def test_cached_features_skip_the_vision_tower(backbone, tmp_path):
    calls = []
    hook = backbone.model.vision_model.embeddings.register_forward_hook(lambda *a: calls.append(1))
    try:
        images = colour_images([0], 5, 6)
        for i, im in enumerate(images):
            im.save(tmp_path / f"{i}.png")
        write_manifest(tmp_path, [make_row(f"{i}.png", label=0) for i in range(5)])
        imset = ImageSet.from_manifest(read_manifest(tmp_path))
        cache = tmp_path / "cache"
        mcm = detectors.build("mcm", model=backbone, class_names=CLASSES, cache_dir=str(cache), batch_size=2)
        first = mcm.score(imset)
        assert len(calls) == 3  # 5 images in batches of 2
        detectors.build("glmcm", model=backbone, class_names=CLASSES, cache_dir=str(cache)).score(imset)
        assert len(calls) == 3  # same ImageSet: memory cache
        fresh = ImageSet.from_manifest(read_manifest(tmp_path))
        again = detectors.build("mcm", model=backbone, class_names=CLASSES, cache_dir=str(cache)).score(fresh)
        assert len(calls) == 3  # new ImageSet object, same manifest: the safetensors file
        np.testing.assert_allclose(again, first, rtol=1e-6)
        assert len(list(cache.glob("*.safetensors"))) == 1
    finally:
        hook.remove()


def test_neglabel_mining_and_score_match_hand_computation(backbone):
    words = ["apple", "boat", "cloud", "dog", "egg", "fish", "goat", "hat", "ice", "jar", "red"]
    det = detectors.build("neglabel", model=backbone, class_names=CLASSES, words=words, neg_fraction=0.5,
                          percentile=0.9, ngroup=1, temperature=0.05)
    cand = [w for w in words if w != "red"]
    pos = hf_text(backbone, [f"a photo of a {c}." for c in CLASSES])
    neg = hf_text(backbone, [f"a photo of a {w}." for w in cand])
    quant = np.quantile(neg @ pos.T, 0.9, axis=1)
    keep = np.argsort(quant, kind="stable")[: len(cand) // 2]
    assert det.negative_words == [cand[i] for i in keep]
    images = colour_images([0], 3, 7)
    img = hf_image(backbone, images)
    full = softmax(np.concatenate([img @ pos.T, img @ neg[keep].T], axis=1) / 0.05, axis=1)
    np.testing.assert_allclose(det.score(ImageSet(images=images)), full[:, :2].sum(1), rtol=1e-5)
    torch.testing.assert_close(mine_negatives(torch.tensor(neg), torch.tensor(pos), 0.5, 0.9), torch.tensor(keep))


def test_neglabel_grouping_averages_over_groups():
    from detectors.clip.scores import neglabel

    g = torch.randn(4, 8, dtype=torch.float64)
    pos, neg = torch.randn(3, 8, dtype=torch.float64), torch.randn(7, 8, dtype=torch.float64)
    got = neglabel(g, pos, neg, temperature=0.1, ngroup=3, seed=5)
    gs, ps, ns = unit64(g), unit64(pos), unit64(neg)
    order = torch.randperm(7, generator=torch.Generator().manual_seed(5)).numpy()[:6].reshape(3, 2)
    expected = np.mean([softmax(np.concatenate([gs @ ps.T, gs @ ns[o].T], 1) / 0.1, axis=1)[:, :3].sum(1) for o in order], axis=0)
    np.testing.assert_allclose(got, expected, rtol=1e-6)


def test_neglabel_default_groups_hold_about_a_hundred_negatives(backbone):
    words = [f"word{i}" for i in range(1000)]
    det = detectors.build("neglabel", model=backbone, class_names=CLASSES, words=words, neg_fraction=0.5)
    assert len(det.negative_words) == 500 and det.groups() == 5
    assert detectors.build("neglabel", model=backbone, class_names=CLASSES, words=words[:40]).groups() == 1
    assert detectors.build("neglabel", model=backbone, class_names=CLASSES, words=words, ngroup=7).groups() == 7
