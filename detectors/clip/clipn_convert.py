"""Convert a released CLIPN checkpoint (open_clip layout, with the "no" text tower) to our layout: a transformers
`CLIPModel` folder plus a `clipn` detector folder holding the "no" tower and its prompts. Every key is mapped;
an unknown key raises."""
from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any

import torch

from detectors.clip.clipn import STATE_PREFIX
from pipelines.checkpoints import safe_torch_load
from pipelines.io import umask_modes

_BLOCK = re.compile(r"^(?P<tower>visual\.transformer|transformer|transformer_no)\.resblocks\.(?P<i>\d+)\.(?P<rest>.+)$")
_BLOCK_PARTS = {
    "ln_1.weight": "layer_norm1.weight", "ln_1.bias": "layer_norm1.bias",
    "ln_2.weight": "layer_norm2.weight", "ln_2.bias": "layer_norm2.bias",
    "attn.out_proj.weight": "self_attn.out_proj.weight", "attn.out_proj.bias": "self_attn.out_proj.bias",
    "mlp.c_fc.weight": "mlp.fc1.weight", "mlp.c_fc.bias": "mlp.fc1.bias",
    "mlp.c_proj.weight": "mlp.fc2.weight", "mlp.c_proj.bias": "mlp.fc2.bias",
}
_TOWER_PREFIX = {"visual.transformer": "vision_model.encoder.layers", "transformer": "text_model.encoder.layers",
                 "transformer_no": STATE_PREFIX + "text_model.encoder.layers"}
_FLAT = {
    "visual.class_embedding": "vision_model.embeddings.class_embedding",
    "visual.positional_embedding": "vision_model.embeddings.position_embedding.weight",
    "visual.conv1.weight": "vision_model.embeddings.patch_embedding.weight",
    "visual.ln_pre.weight": "vision_model.pre_layrnorm.weight", "visual.ln_pre.bias": "vision_model.pre_layrnorm.bias",
    "visual.ln_post.weight": "vision_model.post_layernorm.weight",
    "visual.ln_post.bias": "vision_model.post_layernorm.bias",
    "token_embedding.weight": "text_model.embeddings.token_embedding.weight",
    "positional_embedding": "text_model.embeddings.position_embedding.weight",
    "ln_final.weight": "text_model.final_layer_norm.weight", "ln_final.bias": "text_model.final_layer_norm.bias",
    "logit_scale": "logit_scale",
    "token_embedding_no.weight": STATE_PREFIX + "text_model.embeddings.token_embedding.weight",
    "positional_embedding_no": STATE_PREFIX + "text_model.embeddings.position_embedding.weight",
    "ln_final_no.weight": STATE_PREFIX + "text_model.final_layer_norm.weight",
    "ln_final_no.bias": STATE_PREFIX + "text_model.final_layer_norm.bias",
    "prompt_no": STATE_PREFIX + "prompt",
}
_TRANSPOSED = {"visual.proj": "visual_projection.weight", "text_projection": "text_projection.weight",
               "text_projection_no": STATE_PREFIX + "projection.weight"}


def strip_wrappers(checkpoint: dict[str, Any]) -> dict[str, torch.Tensor]:
    """The bare state dict of a training checkpoint (`state_dict` entry, DDP `module.` prefixes removed)."""
    state = checkpoint.get("state_dict", checkpoint)
    return {k[len("module."):] if k.startswith("module.") else k: v for k, v in state.items()}


def convert_state_dict(state: dict[str, torch.Tensor]) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """(CLIPModel state dict, "no"-tower state with keys `no.*`) from an open_clip CLIPN state dict."""
    clip, no = {}, {}

    def put(key: str, value: torch.Tensor) -> None:
        (no if key.startswith(STATE_PREFIX) else clip)[key] = value.contiguous()

    for key, value in state.items():
        if key in _FLAT:
            put(_FLAT[key], value)
        elif key in _TRANSPOSED:
            put(_TRANSPOSED[key], value.T)
        elif (m := _BLOCK.match(key)) is not None:
            prefix = f"{_TOWER_PREFIX[m['tower']]}.{m['i']}"
            rest = m["rest"]
            if rest in ("attn.in_proj_weight", "attn.in_proj_bias"):
                kind = "weight" if rest.endswith("weight") else "bias"
                for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                    put(f"{prefix}.self_attn.{name}.{kind}", part)
            elif rest in _BLOCK_PARTS:
                put(f"{prefix}.{_BLOCK_PARTS[rest]}", value)
            else:
                raise KeyError(f"CLIPN checkpoint key {key!r} has no mapping (unknown block part {rest!r})")
        else:
            raise KeyError(f"CLIPN checkpoint key {key!r} has no mapping to the transformers CLIP layout")
    return clip, no


def config_from_state_dict(state: dict[str, torch.Tensor], head_width: int = 64, quick_gelu: bool = False,
                           token_ids: dict[str, int] | None = None) -> Any:
    """The `CLIPConfig` matching an open_clip ViT state dict (heads = width / head_width, as open_clip).

    `token_ids` (bos/eos/pad_token_id, e.g. from the tokenizer the model is used with) default to CLIP's BPE layout:
    BOS and EOS are the vocabulary's last two ids, padding with EOS. Unlike OpenAI's hub configs (eos 2), the ids
    written agree with the tokenizer."""
    from transformers import CLIPConfig

    def layers(prefix: str) -> int:
        return len({k.split(".")[len(prefix.split("."))] for k in state if k.startswith(prefix + ".")})

    vision_width = state["visual.conv1.weight"].shape[0]
    patch = state["visual.conv1.weight"].shape[-1]
    grid = round((state["visual.positional_embedding"].shape[0] - 1) ** 0.5)
    text_width = state["ln_final.weight"].shape[0]
    act = "quick_gelu" if quick_gelu else "gelu"
    vision = dict(hidden_size=vision_width,
                  intermediate_size=state["visual.transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                  num_hidden_layers=layers("visual.transformer.resblocks"),
                  num_attention_heads=vision_width // head_width,
                  image_size=patch * grid, patch_size=patch, hidden_act=act)
    vocab = state["token_embedding.weight"].shape[0]
    text = dict(hidden_size=text_width, intermediate_size=state["transformer.resblocks.0.mlp.c_fc.weight"].shape[0],
                num_hidden_layers=layers("transformer.resblocks"), num_attention_heads=text_width // head_width,
                max_position_embeddings=state["positional_embedding"].shape[0], vocab_size=vocab, hidden_act=act,
                **(token_ids or dict(bos_token_id=vocab - 2, eos_token_id=vocab - 1, pad_token_id=vocab - 1)))
    return CLIPConfig(text_config=text, vision_config=vision, projection_dim=state["text_projection"].shape[1])


def convert_clipn(checkpoint: str | os.PathLike | dict[str, Any], out_dir: str | os.PathLike, processor: Any = None,
                  head_width: int = 64, quick_gelu: bool = False, class_names: list[str] | None = None) -> Path:
    """Write `out_dir/clip` (CLIPModel, plus `processor` — a CLIPProcessor or its hub id/folder — when given) and
    `out_dir` as a `clipn` detector folder whose `model` is `out_dir/clip`. Returns `out_dir`.

    The config's BOS/EOS/pad ids are the processor's tokenizer's when a processor is given, else the vocabulary's
    last two (CLIP's BPE layout)."""
    from transformers import CLIPModel, CLIPProcessor

    from detectors.clip.clipn import CLIPN
    from pipelines.runtime import load_pretrained

    if not isinstance(checkpoint, dict):
        checkpoint = safe_torch_load(checkpoint, "CLIPN checkpoint")
    state = strip_wrappers(checkpoint)
    clip_state, no_state = convert_state_dict(state)
    if isinstance(processor, (str, os.PathLike)):
        processor = load_pretrained(CLIPProcessor.from_pretrained, processor, what="CLIP processor")
    token_ids = None
    if processor is not None:
        tokenizer = processor.tokenizer
        token_ids = dict(bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
                         pad_token_id=tokenizer.pad_token_id)
    model = CLIPModel(config_from_state_dict(state, head_width, quick_gelu, token_ids))
    missing, unexpected = model.load_state_dict(clip_state, strict=False)
    if missing or unexpected:
        raise KeyError(f"converted CLIPN weights do not match CLIPModel: missing {missing}, unexpected {unexpected}")
    out_dir = Path(out_dir)
    clip_dir = out_dir / "clip"
    with umask_modes(clip_dir):  # transformers writes model.safetensors 0600: the umask decides, as for every output
        model.save_pretrained(clip_dir)
        if processor is not None:
            processor.save_pretrained(clip_dir)
    detector = CLIPN(model=str(clip_dir), class_names=class_names or [],
                     n_prompts=int(no_state[STATE_PREFIX + "prompt"].shape[0]))
    detector.load_state({k: v.float().numpy() for k, v in no_state.items()})
    detector.fitted = True
    detector.save_pretrained(out_dir)
    return out_dir
