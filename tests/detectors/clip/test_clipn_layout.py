"""The CLIPN converter accepts the full-size key layout of CLIPN's released checkpoints: open_clip's ViT-B-16 state
dict (every key and shape as open_clip 3.3.0 builds it, kept in pipelines/hub_configs/open_clip) plus the "no" text
tower's `*_no` keys and `prompt_no`. Everything runs on the meta device: no weights."""
from __future__ import annotations

import json

import torch
from accelerate import init_empty_weights

from detectors.clip.clipn import STATE_PREFIX, NoTextTower
from detectors.clip.clipn_convert import config_from_state_dict, convert_state_dict
from pipelines import hub

TEXT_PREFIXES = ("transformer.", "token_embedding.", "positional_embedding", "ln_final.", "text_projection")


def clipn_meta_state(n_prompts: int = 16) -> dict[str, torch.Tensor]:
    """Meta tensors with the keys and shapes of a CLIPN ViT-B/16 checkpoint."""
    shapes = json.loads((hub.fixtures_root() / "open_clip" / "ViT-B-16.state_dict_shapes.json").read_text())
    state = {key: torch.empty(shape, device="meta") for key, shape in shapes.items()}
    for key in [k for k in shapes if k.startswith(TEXT_PREFIXES)]:
        head, dot, tail = key.partition(".")
        state[f"{head}_no{dot}{tail}"] = torch.empty(shapes[key], device="meta")
    context, width = shapes["positional_embedding"]
    state["prompt_no"] = torch.empty(n_prompts, context, width, device="meta")
    return state


def test_open_clip_vit_b16_key_list_is_the_published_architecture():
    shapes = json.loads((hub.fixtures_root() / "open_clip" / "ViT-B-16.state_dict_shapes.json").read_text())
    config = json.loads((hub.fixtures_root() / "open_clip" / "ViT-B-16.json").read_text())
    assert len(shapes) == 302 and sum(torch.Size(s).numel() for s in shapes.values()) == 149_620_737
    vision, text = config["vision_cfg"], config["text_cfg"]
    assert shapes["visual.conv1.weight"] == [vision["width"], 3, vision["patch_size"], vision["patch_size"]]
    assert shapes["token_embedding.weight"] == [text["vocab_size"], text["width"]]
    assert shapes["text_projection"] == [text["width"], config["embed_dim"]]


def test_converter_maps_every_key_of_a_full_size_clipn_checkpoint():
    state = clipn_meta_state()
    clip_state, no_state = convert_state_dict(state)
    config = config_from_state_dict(state)
    with init_empty_weights():
        from transformers import CLIPModel

        model = CLIPModel(config)
    expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
    assert {k: tuple(v.shape) for k, v in clip_state.items()} == expected  # no missing, no unexpected key
    # the architecture read from the state dict is openai/clip-vit-base-patch16's
    real = hub.real_effective("openai/clip-vit-base-patch16", "config.json")
    for section in ("text_config", "vision_config"):
        for field in ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads"):
            assert getattr(getattr(config, section), field) == real[section][field], (section, field)
    assert (config.vision_config.patch_size, config.vision_config.image_size, config.projection_dim) == (16, 224, 512)
    # the "no" tower: exactly the keys and shapes of the detector's NoTextTower
    with init_empty_weights():
        tower = NoTextTower.from_clip(model, n_prompts=16)
    assert {k: tuple(v.shape) for k, v in no_state.items()} == \
        {STATE_PREFIX + k: tuple(v.shape) for k, v in tower.state_dict().items()}
