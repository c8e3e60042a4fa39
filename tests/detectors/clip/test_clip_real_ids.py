"""CLIP text pooling on checkpoints whose config disagrees with their tokenizer, as openai/clip-vit-base-patch16 does
(config eos_token_id 2 = '#', tokenizer <|endoftext|> = the last id), on open_clip/LAION-style configs (eos = the
tokenizer's) and on the CLIPN converter's output. The shared `backbone` fixture is the stand-in with OpenAI's ids;
MCM, GL-MCM and NegLabel are compared with transformers' own `get_text_features` / `get_image_features` and cosine
similarities computed by hand in float64."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import torch
from helpers.images import colour_images
from scipy.special import softmax

import detectors
from detectors.base import ImageSet
from detectors.clip.backbone import ClipBackbone

CLASSES = ["c#", "green"]  # "c#." tokenizes to "c", "#" (id 2: the config's wrong end-of-text id), ".</w>"


def unit64(a: torch.Tensor) -> np.ndarray:
    a = a.detach().double().numpy()
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def hf_text(backbone, texts) -> np.ndarray:
    tok = backbone.processor.tokenizer(list(texts), padding=True, return_tensors="pt")
    with torch.no_grad():
        return unit64(backbone.model.get_text_features(**tok).pooler_output)


def hf_image(backbone, images) -> np.ndarray:
    pixels = backbone.processor(images=images, return_tensors="pt")["pixel_values"]
    with torch.no_grad():
        return unit64(backbone.model.get_image_features(pixel_values=pixels).pooler_output)


def prompts(names):
    return [f"a photo of a {name}." for name in names]


def test_stand_in_has_openai_ids_and_hash_is_id_2(backbone):
    text, tokenizer = backbone.model.config.text_config, backbone.tokenizer
    assert (text.bos_token_id, text.eos_token_id, text.pad_token_id) == (0, 2, 1)
    assert backbone.eos_token_id == tokenizer.eos_token_id == len(tokenizer) - 1
    ids = backbone.tokenize(prompts(CLASSES))
    assert (ids[0] == 2).any()  # the "#" of "c#."


def test_pooling_is_at_the_tokenizer_eos_not_at_the_config_id(backbone):
    ids = backbone.tokenize(prompts(CLASSES))
    eot = backbone.eot_index(ids)
    expected = torch.tensor([row.tolist().index(backbone.tokenizer.eos_token_id) for row in ids])
    torch.testing.assert_close(eot, expected)
    np.testing.assert_allclose(backbone.encode_texts(prompts(CLASSES)).double().numpy(),
                               hf_text(backbone, prompts(CLASSES)), rtol=1e-5, atol=1e-6)
    # pooling at the config's id (the '#') gives another embedding: the check above would catch that bug
    at_hash = (ids[0] == 2).int().argmax()
    with torch.no_grad():
        wrong = backbone.text_from_embeddings(backbone.token_embeddings(ids[:1]), at_hash[None])
    assert not np.allclose(unit64(wrong), hf_text(backbone, prompts(CLASSES[:1])), atol=1e-3)


def test_mcm_glmcm_neglabel_equal_independent_computation(backbone):
    images = colour_images([0], 3, 11) + colour_images([1], 3, 12) + colour_images([0, 1], 3, 13)
    imset = ImageSet(images=images)
    # the official prompts: MCM / GL-MCM "a photo of a {label}" (no full stop), NegLabel "the nice {}" for both parts
    img, txt = hf_image(backbone, images), hf_text(backbone, [f"a photo of a {name}" for name in CLASSES])

    mcm = detectors.build("mcm", model=backbone, class_names=CLASSES)
    np.testing.assert_allclose(mcm.score(imset), softmax(img @ txt.T, axis=1).max(1), rtol=1e-5)

    glmcm = detectors.build("glmcm", model=backbone, class_names=CLASSES, lam=1.0)
    pixels = backbone.preprocess(images)
    vision = backbone.model.vision_model
    with torch.no_grad():  # local features: last block with self-only attention, as GL-MCM's official code
        hidden = vision(pixel_values=pixels, output_hidden_states=True).hidden_states[-2]
        self_only = torch.full((hidden.shape[1],) * 2, float("-inf")).fill_diagonal_(0.0)[None, None]
        local = backbone.model.visual_projection(
            vision.post_layernorm(vision.encoder.layers[-1](hidden, self_only)[:, 1:]))
    loc = unit64(local)
    expected = softmax(img @ txt.T, axis=1).max(1) + softmax(loc @ txt.T, axis=-1).max(-1).max(-1)
    np.testing.assert_allclose(glmcm.score(imset), expected, rtol=1e-4)

    words = ["apple", "c#d", "cloud", "dog", "egg", "fish"]
    neglabel = detectors.build("neglabel", model=backbone, class_names=CLASSES, words=words, mine=False, ngroup=1,
                               temperature=0.05)
    ids, neg = hf_text(backbone, [f"the nice {w}" for w in CLASSES]), hf_text(backbone,
                                                                              [f"the nice {w}" for w in words])
    full = softmax(np.concatenate([img @ ids.T, img @ neg.T], axis=1) / 0.05, axis=1)
    np.testing.assert_allclose(neglabel.score(imset), full[:, :len(CLASSES)].sum(1), rtol=1e-5)


@pytest.fixture(scope="module")
def laion_style_dir(tiny_clip_dir, tmp_path_factory):
    """The stand-in with the config's ids set to the tokenizer's (as open_clip/LAION conversions on the hub have)."""
    folder = tmp_path_factory.mktemp("laion_style")
    shutil.copytree(tiny_clip_dir, folder, dirs_exist_ok=True)
    config = json.loads((folder / "config.json").read_text())
    vocab = config["text_config"]["vocab_size"]
    config["text_config"].update(bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)
    (folder / "config.json").write_text(json.dumps(config))
    return folder


def test_laion_style_ids_pool_the_same_and_match_transformers(backbone, laion_style_dir):
    laion = ClipBackbone.load(str(laion_style_dir), device="cpu")
    assert laion.model.config.text_config.eos_token_id == laion.eos_token_id
    texts = prompts(CLASSES + ["moth"])
    np.testing.assert_allclose(laion.encode_texts(texts).double().numpy(), hf_text(laion, texts), rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(laion.encode_texts(texts), backbone.encode_texts(texts))  # same weights, same pooling


def test_without_a_tokenizer_eos_the_legacy_config_id_pools_at_argmax(backbone):
    class NoEos:
        eos_token_id = None

    bare = ClipBackbone(model=backbone.model, processor=type("P", (), {"tokenizer": NoEos()})(), model_id="bare")
    ids = backbone.tokenize(prompts(CLASSES))
    assert bare.eos_token_id == -1
    torch.testing.assert_close(bare.eot_index(ids), backbone.eot_index(ids))


def test_clipn_converter_output_pools_at_its_eos(backbone, tmp_path):
    """An open_clip-layout checkpoint converted by clipn_convert: config ids from the tokenizer, pooling as
    transformers."""
    from detectors.clip.clipn_convert import convert_clipn

    model = backbone.model
    sd = {k: v.clone() for k, v in to_open_clip(model).items()}
    for key in [k for k in sd if k.startswith(("transformer.", "token_embedding", "positional_embedding", "ln_final",
                                               "text_projection"))]:
        head, _, tail = key.partition(".")
        sd[f"{head}_no.{tail}" if tail else f"{head}_no"] = sd[key].clone()
    sd["prompt_no"] = torch.zeros(16, 77, 32)
    out = convert_clipn({"state_dict": sd}, tmp_path / "clipn", processor=backbone.processor, head_width=8,
                        quick_gelu=True)
    converted = ClipBackbone.load(str(out / "clip"), device="cpu")
    text = converted.model.config.text_config
    assert text.eos_token_id == converted.tokenizer.eos_token_id == converted.eos_token_id
    assert (text.bos_token_id, text.pad_token_id) == (converted.tokenizer.bos_token_id,
                                                      converted.tokenizer.pad_token_id)
    texts = prompts(CLASSES)
    np.testing.assert_allclose(converted.encode_texts(texts).double().numpy(), hf_text(converted, texts), rtol=1e-5,
                               atol=1e-6)
    torch.testing.assert_close(converted.encode_texts(texts), backbone.encode_texts(texts), rtol=1e-5, atol=1e-6)


def to_open_clip(model) -> dict[str, torch.Tensor]:
    """A transformers CLIPModel's weights in open_clip's layout (inverse of the converter's mapping, written out)."""
    sd = model.state_dict()
    out = {
        "visual.class_embedding": sd["vision_model.embeddings.class_embedding"],
        "visual.positional_embedding": sd["vision_model.embeddings.position_embedding.weight"],
        "visual.conv1.weight": sd["vision_model.embeddings.patch_embedding.weight"],
        "visual.ln_pre.weight": sd["vision_model.pre_layrnorm.weight"],
        "visual.ln_pre.bias": sd["vision_model.pre_layrnorm.bias"],
        "visual.ln_post.weight": sd["vision_model.post_layernorm.weight"],
        "visual.ln_post.bias": sd["vision_model.post_layernorm.bias"],
        "visual.proj": sd["visual_projection.weight"].T, "text_projection": sd["text_projection.weight"].T,
        "token_embedding.weight": sd["text_model.embeddings.token_embedding.weight"],
        "positional_embedding": sd["text_model.embeddings.position_embedding.weight"],
        "ln_final.weight": sd["text_model.final_layer_norm.weight"],
        "ln_final.bias": sd["text_model.final_layer_norm.bias"], "logit_scale": sd["logit_scale"],
    }
    for tower, prefix in (("visual.transformer", "vision_model.encoder.layers"),
                          ("transformer", "text_model.encoder.layers")):
        layers = len({k.split(".")[3] for k in sd if k.startswith(prefix + ".")})
        for i in range(layers):
            p, q = f"{prefix}.{i}.", f"{tower}.resblocks.{i}."
            out[q + "attn.in_proj_weight"] = torch.cat([sd[p + f"self_attn.{n}_proj.weight"] for n in "qkv"])
            out[q + "attn.in_proj_bias"] = torch.cat([sd[p + f"self_attn.{n}_proj.bias"] for n in "qkv"])
            for ours, theirs in (("layer_norm1", "ln_1"), ("layer_norm2", "ln_2"),
                                 ("self_attn.out_proj", "attn.out_proj"),
                                 ("mlp.fc1", "mlp.c_fc"), ("mlp.fc2", "mlp.c_proj")):
                for kind in ("weight", "bias"):
                    out[q + f"{theirs}.{kind}"] = sd[p + f"{ours}.{kind}"]
    return out
