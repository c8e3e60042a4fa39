"""The shrink table: which size fields of each real hub config (pipelines/hub_configs, see `pipelines.hub`) a tiny
stand-in changes, and the configs at 'tiny' or 'full' size built from it."""
from __future__ import annotations

import hashlib
import json
from typing import Any

from pipelines.hub import fixtures_root, real_config, set_dotted
from pipelines.hub_ids import (  # noqa: F401
    CLIP_ID,
    CONTROLNET_ID,
    DPT_ID,
    IMAGE_ENCODER_FILE,
    IP_ADAPTER_ID,
    RESNET_ID,
    SD15_ID,
    SD21_ID,
    SDXL_ID,
    SDXL_VAE_FP16_ID,
)
from pipelines.tiny.tokenizer import TINY_VOCAB_SIZE


def _prefixed(section: str, fields: dict[str, Any]) -> dict[str, Any]:
    """`{"a": 1}` -> `{"section.a": 1}` (overrides of a nested config section)."""
    return {f"{section}.{key}": value for key, value in fields.items()}


# Only size fields change (hidden sizes, depths, heads, channels, sample/image sizes, the vocabulary size the tiny
# BPE forces); every other value — token ids, activations, norm types and eps, scheduler flags, block types,
# projection types — is the real config's. tests/pipelines/test_hub_configs.py proves it per model id.
_TINY_TEXT = {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2, "num_attention_heads": 4,
              "projection_dim": 32, "vocab_size": TINY_VOCAB_SIZE}
_TINY_SDXL_UNET = {"block_out_channels": [32, 64, 64], "attention_head_dim": [2, 4, 4],
                   "transformer_layers_per_block": [1, 2, 2], "cross_attention_dim": 64, "addition_time_embed_dim": 8,
                   "projection_class_embeddings_input_dim": 6 * 8 + 32, "sample_size": 8}
_TINY_CLIP_TEXT = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                   "projection_dim": 16, "vocab_size": TINY_VOCAB_SIZE}
_TINY_CLIP_VISION = {"hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2, "num_attention_heads": 4,
                     "projection_dim": 16, "image_size": 32, "patch_size": 8}

_TINY_VAE = {"block_out_channels": [32, 32, 64, 64], "sample_size": 64}
_TINY_SD_UNET = {"block_out_channels": [32, 64, 64, 64], "cross_attention_dim": 32, "sample_size": 8}
TINY: dict[str, dict[str, dict[str, Any]]] = {
    SDXL_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "tokenizer_2/tokenizer_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "text_encoder_2/config.json": _TINY_TEXT,
        "unet/config.json": _TINY_SDXL_UNET,
        "vae/config.json": _TINY_VAE,
    },
    CONTROLNET_ID: {"config.json": {k: v for k, v in _TINY_SDXL_UNET.items() if k != "sample_size"}},
    IP_ADAPTER_ID: {IMAGE_ENCODER_FILE: {"hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 2,
                                         "num_attention_heads": 4, "projection_dim": 32}},
    DPT_ID: {
        "config.json": {"hidden_size": 32, "intermediate_size": 37, "num_attention_heads": 4, "image_size": 64,
                        "neck_hidden_sizes": [8, 16, 32, 32], "fusion_hidden_size": 16,
                        "backbone_featmap_shape": [1, 32, 4, 4], "backbone_config.hidden_sizes": [8, 16, 32, 64],
                        "backbone_config.embedding_size": 8, "backbone_config.num_groups": 2,
                        "pooler_output_size": 32},  # derived from hidden_size when absent
        "preprocessor_config.json": {"size": {"height": 64, "width": 64}},
    },
    CLIP_ID: {
        # transformers rebuilds the vision tower from `vision_config_dict` (CLIPVisionConfig defaults + its keys),
        # so the vision sizes are shrunk there as well as in `vision_config`
        "config.json": {"projection_dim": 16, **_prefixed("text_config", _TINY_CLIP_TEXT),
                        **_prefixed("vision_config", _TINY_CLIP_VISION),
                        **_prefixed("vision_config_dict", _TINY_CLIP_VISION)},
        "preprocessor_config.json": {"size": 32, "crop_size": 32},
        "tokenizer_config.json": {},
    },
    SD15_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "feature_extractor/preprocessor_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "unet/config.json": _TINY_SD_UNET,
        "vae/config.json": _TINY_VAE,
    },
    SD21_ID: {
        "model_index.json": {},
        "scheduler/scheduler_config.json": {},
        "tokenizer/tokenizer_config.json": {},
        "feature_extractor/preprocessor_config.json": {},
        "text_encoder/config.json": _TINY_TEXT,
        "unet/config.json": {**_TINY_SD_UNET, "attention_head_dim": [2, 4, 4, 4]},
        "vae/config.json": _TINY_VAE,
    },
    RESNET_ID: {
        "config.json": {"embedding_size": 8, "hidden_sizes": [8, 16, 32, 64], "depths": [1, 1, 1, 1]},
        "preprocessor_config.json": {"size": 32},
    },
    SDXL_VAE_FP16_ID: {"config.json": _TINY_VAE},
}
# Components a tiny pipeline folder leaves out (listed in the model_index check; never a size field).
OMITTED_COMPONENTS: dict[str, tuple[str, ...]] = {SD15_ID: ("safety_checker", "requires_safety_checker")}


def standin_fingerprint() -> str:
    """A short hash of what decides the stand-ins: the shrink table and the kept real config files. A folder of
    stand-ins built once and reused (e.g. `models: tiny` of generation jobs) is stale when this changes."""
    digest = hashlib.sha256(json.dumps(TINY, sort_keys=True, default=str).encode())
    for path in sorted(fixtures_root().rglob("*.json")):
        digest.update(path.relative_to(fixtures_root()).as_posix().encode() + path.read_bytes())
    return digest.hexdigest()[:16]


def tiny_config(model_id: str, file: str = "config.json") -> dict[str, Any]:
    """The real config file `file` of `model_id` with the size fields of `TINY` shrunk."""
    return set_dotted(real_config(model_id, file), TINY[model_id][file])


def full_config(model_id: str, file: str = "config.json") -> dict[str, Any]:
    """The real config file (full size)."""
    return real_config(model_id, file)


def sized_config(model_id: str, file: str, size: str) -> dict[str, Any]:
    """`tiny_config` or `full_config` by `size` ('tiny' or 'full')."""
    if size not in ("tiny", "full"):
        raise ValueError(f"size must be 'tiny' or 'full', got {size!r}")
    return tiny_config(model_id, file) if size == "tiny" else full_config(model_id, file)


def zest_configs(size: str = "tiny") -> dict[str, dict[str, Any]]:
    """The component configs of the ZeST models at `size` ('tiny': `TINY`'s shrink, 'full': the real configs)."""
    return {
        "unet": sized_config(SDXL_ID, "unet/config.json", size),
        "vae": sized_config(SDXL_ID, "vae/config.json", size),
        "text_encoder": sized_config(SDXL_ID, "text_encoder/config.json", size),
        "text_encoder_2": sized_config(SDXL_ID, "text_encoder_2/config.json", size),
        "controlnet": sized_config(CONTROLNET_ID, "config.json", size),
        "image_encoder": sized_config(IP_ADAPTER_ID, IMAGE_ENCODER_FILE, size),
        "depth": sized_config(DPT_ID, "config.json", size),
    }
