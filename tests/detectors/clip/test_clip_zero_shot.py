"""MCM, GL-MCM and the image-feature cache against independent computations on a tiny CLIP."""
from __future__ import annotations

import numpy as np
import torch
from helpers.images import CLASSES, colour_images
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from pipelines.data import make_row, read_manifest, write_manifest


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
        return unit64(backbone.model.get_text_features(input_ids=tok["input_ids"],
                                                       attention_mask=tok["attention_mask"]).pooler_output)


def test_mcm_equals_softmax_of_raw_cosine_over_temperature(backbone):
    images = colour_images([0], 3, 0) + colour_images([2], 3, 1)
    det = detectors.build("mcm", model=backbone, class_names=CLASSES + ["blue"], temperature=0.5)
    # official: no full stop
    img, txt = hf_image(backbone, images), hf_text(backbone, [f"a photo of a {c}" for c in CLASSES + ["blue"]])
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
        mcm = detectors.build("mcm", model=backbone, class_names=CLASSES, cache_dir=str(cache), embed_batch_size=2)
        first = mcm.score(imset)
        assert len(calls) == 3  # 5 images in batches of 2
        detectors.build("mcm", model=backbone, class_names=CLASSES, cache_dir=str(cache), temperature=2.0).score(imset)
        assert len(calls) == 3  # same ImageSet: memory cache
        fresh = ImageSet.from_manifest(read_manifest(tmp_path))
        again = detectors.build("mcm", model=backbone, class_names=CLASSES, cache_dir=str(cache)).score(fresh)
        assert len(calls) == 3  # new ImageSet object, same manifest: the safetensors file
        np.testing.assert_allclose(again, first, rtol=1e-6)
        assert len(list(cache.glob("*.safetensors"))) == 1
    finally:
        hook.remove()


def test_predict_is_the_nearest_class_prompt(backbone):
    """`predict` (the open-set metrics' known-class predictions): argmax of the raw cosine to each class prompt, by
    transformers' own towers; MCM's argmax of its softmax picks the same class."""
    images = colour_images([0, 1, 2], 2, 4)
    names = CLASSES + ["blue"]
    for name in ("mcm", "glmcm"):
        det = detectors.build(name, model=backbone, class_names=names)
        img, txt = hf_image(backbone, images), hf_text(backbone, [f"a photo of a {c}" for c in names])
        np.testing.assert_array_equal(det.predict(ImageSet(images=images)), (img @ txt.T).argmax(1))
