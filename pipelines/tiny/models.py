"""Random-weight stand-ins built from the configs of `pipelines.tiny.configs`, saved with `save_pretrained` in the real
folder layouts (CLIP, the ZeST components, Stable Diffusion, DIFFGUARD's pixel UNet, single models)."""
from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from pipelines.tiny.configs import (
    CLIP_ID,
    DPT_ID,
    SD15_ID,
    SDXL_ID,
    TINY,
    full_config,
    sized_config,
    tiny_config,
    zest_configs,
)
from pipelines.tiny.tokenizer import load_tiny_tokenizer

if TYPE_CHECKING:  # imported where used: loading diffusers is slow
    pass


def build_model(config: dict[str, Any]) -> Any:
    """A random-weight model from a config dict: diffusers models by `_class_name`, transformers models by
    `architectures[0]` (falling back to the model type's base model)."""
    # the version that wrote a file is not a property of the model (an old `_diffusers_version` would make
    # StableDiffusionPipeline "fix" a small sample_size)
    config = {k: v for k, v in config.items() if k not in ("_diffusers_version", "transformers_version")}
    if "_class_name" in config:
        import diffusers

        return getattr(diffusers, config["_class_name"]).from_config(config)
    import transformers
    from transformers import CONFIG_MAPPING

    cfg = CONFIG_MAPPING[config["model_type"]].from_dict(config)
    arch = (config.get("architectures") or [None])[0]
    if arch is None:
        return transformers.AutoModel.from_config(cfg)
    return getattr(transformers, arch)(cfg)


# --- CLIP ---
def save_tiny_clip(folder: str | os.PathLike, seed: int = 0, model_id: str = CLIP_ID) -> Path:
    """A random-weight `CLIPModel` + `CLIPProcessor` folder: `model_id`'s real config (default CLIP ViT-B/16) with
    the sizes of `TINY` (vision hidden 32, 2 layers, image 32, patch 8; text hidden 32, 2 layers; projection 16),
    and the tiny BPE tokenizer.

    Like the real checkpoint, the text config keeps OpenAI's `bos_token_id=0, eos_token_id=2, pad_token_id=1`
    while the tokenizer's end-of-text token is its last id: pooling must not trust the config's eos id.
    Loads with `CLIPModel.from_pretrained(folder)` and `CLIPProcessor.from_pretrained(folder)`.
    """
    from transformers import CLIPImageProcessor, CLIPProcessor

    folder = Path(folder)
    tokenizer = load_tiny_tokenizer(model_id)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = build_model(tiny_config(model_id)).eval()
    model.save_pretrained(folder)
    image_processor = CLIPImageProcessor.from_dict(tiny_config(model_id, "preprocessor_config.json"))
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


# --- ZeST: SDXL base + depth ControlNet + IP-Adapter ViT-H + DPT-hybrid ---
def scheduler_from_config(model_id: str, file: str = "scheduler/scheduler_config.json") -> Any:
    """The scheduler class and settings of a real pipeline's scheduler config."""
    import diffusers

    config = full_config(model_id, file)
    return getattr(diffusers, config["_class_name"]).from_config(config)


def sdxl_scheduler():
    """SDXL base's scheduler (Euler discrete, scaled-linear betas, leading spacing) from its real config."""
    return scheduler_from_config(SDXL_ID)


def ip_adapter_state(unet, image_embed_dim: int, tokens: int = 4, device: str | torch.device = "cpu",
                     dtype: torch.dtype = torch.float32) -> dict[str, dict[str, torch.Tensor]]:
    """Random IP-Adapter weights as `{"image_proj": ..., "ip_adapter": ...}` with h94's key names.

    `ip_adapter` holds `<k>.to_k_ip.weight` / `<k>.to_v_ip.weight`, k = 1, 3, 5, ..., one k per cross-attention
    processor in `unet.attn_processors` order, its hidden size the width of its block; `image_proj.proj` maps the
    image encoder's projection to `tokens` x cross_attention_dim. On the `meta` device the tensors have shapes only.
    """
    def randn(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=dtype) * 0.05

    cross_dim = unet.config.cross_attention_dim
    channels = list(unet.config.block_out_channels)
    image_proj = {"proj.weight": randn(tokens * cross_dim, image_embed_dim),
                  "proj.bias": torch.zeros(tokens * cross_dim, device=device, dtype=dtype),
                  "norm.weight": torch.ones(cross_dim, device=device, dtype=dtype),
                  "norm.bias": torch.zeros(cross_dim, device=device, dtype=dtype)}
    adapter: dict[str, torch.Tensor] = {}
    key = 1
    for name in unet.attn_processors:
        if name.endswith("attn1.processor"):
            continue
        if name.startswith("mid_block"):
            hidden = channels[-1]
        elif name.startswith("up_blocks"):
            hidden = list(reversed(channels))[int(name.split(".")[1])]
        else:
            hidden = channels[int(name.split(".")[1])]
        adapter[f"{key}.to_k_ip.weight"] = randn(hidden, cross_dim)
        adapter[f"{key}.to_v_ip.weight"] = randn(hidden, cross_dim)
        key += 2
    return {"image_proj": image_proj, "ip_adapter": adapter}


@contextmanager
def _default_dtype(dtype: torch.dtype) -> Iterator[None]:
    """Temporarily make `dtype` torch's default floating dtype."""
    previous = torch.get_default_dtype()
    torch.set_default_dtype(dtype)
    try:
        yield
    finally:
        torch.set_default_dtype(previous)


def random_zest_modules(size: str = "tiny", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                        seed: int = 0) -> dict[str, Any]:
    """Random-weight ZeST modules of `size` ('tiny' or 'full' = the real configs) built directly on `device` in `dtype`.

    Keys: tokenizer, tokenizer_2 (the tiny byte-level BPE with SDXL's special tokens: tokenizer_2 pads with "!"),
    text_encoder, text_encoder_2, unet, vae, scheduler, controlnet, image_encoder, ip_adapter (state dict),
    depth (DPTForDepthEstimation). At 'full' size the text encoders keep the real 49408-token vocabulary, so only
    the tiny tokenizer's ids (all below it) are fed to them.
    """
    configs = zest_configs(size)
    torch.manual_seed(seed)
    tokenizers = {name: load_tiny_tokenizer(SDXL_ID, name) for name in ("tokenizer", "tokenizer_2")}
    with torch.device(device), _default_dtype(dtype):  # parameters are created where and as they will live
        modules = {name: build_model(configs[name]) for name in
                   ("text_encoder", "text_encoder_2", "unet", "vae", "controlnet", "image_encoder", "depth")}
    for module in modules.values():
        module.to(dtype).eval()
    modules.update(tokenizers)
    modules["scheduler"] = sdxl_scheduler()
    modules["ip_adapter"] = ip_adapter_state(modules["unet"], configs["image_encoder"]["projection_dim"], device=device,
                                             dtype=dtype)
    return modules


def dpt_processor(size: str = "tiny"):
    """DPT-hybrid-MiDaS's image processor (square resize, mean/std 0.5) at `size`."""
    from transformers import DPTImageProcessor

    return DPTImageProcessor.from_dict(sized_config(DPT_ID, "preprocessor_config.json", size))


def save_tiny_dpt(folder: str | os.PathLike, model: Any = None) -> Path:
    """A tiny DPT-hybrid depth model (random unless `model` is given) and its image processor."""
    folder = Path(folder)
    (model if model is not None else build_model(tiny_config(DPT_ID)).eval()).save_pretrained(folder)
    dpt_processor("tiny").save_pretrained(folder)
    return folder


def save_tiny_model(folder: str | os.PathLike, model_id: str, file: str = "config.json", seed: int = 0,
                    labels: int | None = None) -> Path:
    """One random-weight model of `model_id` at tiny size (e.g. microsoft/resnet-50, madebyollin/sdxl-vae-fp16-fix),
    saved with its image processor when the model id keeps one; `labels` gives a classifier that many outputs
    (`id2label` LABEL_0, LABEL_1, ...)."""
    folder = Path(folder)
    config = tiny_config(model_id, file)
    if labels is not None:
        config.pop("num_labels", None)
        config["id2label"] = {str(i): f"LABEL_{i}" for i in range(labels)}
        config["label2id"] = {f"LABEL_{i}": i for i in range(labels)}
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        build_model(config).eval().save_pretrained(folder)
    if "preprocessor_config.json" in TINY[model_id]:
        from transformers import AutoImageProcessor

        processor_config = tiny_config(model_id, "preprocessor_config.json")
        with tempfile.TemporaryDirectory() as scratch:
            (Path(scratch) / "preprocessor_config.json").write_text(json.dumps(processor_config), encoding="utf-8")
            (Path(scratch) / "config.json").write_text(json.dumps(tiny_config(model_id, file)), encoding="utf-8")
            AutoImageProcessor.from_pretrained(scratch).save_pretrained(folder)
    return folder


# --- generative detectors ---
def save_tiny_pixel_unet(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random-weight ADM-style unconditional `UNet2DModel` (32 px, learned-sigma 6 output channels) for DIFFGUARD.

    Two resolutions (16, 32 channels), one attention level, group norm of 8. Loads with `UNet2DModel.from_pretrained`.
    """
    from diffusers import UNet2DModel

    torch.manual_seed(seed)
    unet = UNet2DModel(
        sample_size=32, in_channels=3, out_channels=6, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "AttnDownBlock2D"), up_block_types=("AttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=8, norm_num_groups=8, resnet_time_scale_shift="scale_shift",
    )
    unet.save_pretrained(folder)
    return Path(folder)


def save_tiny_stable_diffusion(folder: str | os.PathLike, seed: int = 0, model_id: str = SD15_ID) -> Path:
    """A random-weight Stable Diffusion folder of `model_id` (default SD 1.5; also
    stabilityai/stable-diffusion-2-1-base): the real UNet, VAE, text-encoder, scheduler and feature-extractor configs
    with `TINY`'s sizes (UNet latent 8 -> 64 px images, VAE x8 as the real one), the tiny BPE tokenizer, without the
    safety checker. Loads with `StableDiffusionPipeline.from_pretrained(folder)`.
    """
    from diffusers import StableDiffusionPipeline
    from transformers import CLIPImageProcessor

    folder = Path(folder)
    tokenizer = load_tiny_tokenizer(model_id, "tokenizer")
    torch.manual_seed(seed)
    parts = {name: build_model(tiny_config(model_id, f"{name}/config.json")).eval()
             for name in ("unet", "vae", "text_encoder")}
    feature_extractor = CLIPImageProcessor.from_dict(tiny_config(model_id,
                                                                 "feature_extractor/preprocessor_config.json"))
    pipe = StableDiffusionPipeline(**parts, tokenizer=tokenizer, scheduler=scheduler_from_config(model_id),
                                   safety_checker=None, feature_extractor=feature_extractor,
                                   requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return folder
