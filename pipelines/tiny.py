"""Tiny random-weight stand-ins of the real models, saved with `save_pretrained` in the real folder layouts.

Tests, the demo and CPU benchmarks build these once, save them to a folder and load them back through the same
`from_pretrained` code paths users run with hub ids, so no weights are ever downloaded. Sizes follow diffusers' and
transformers' own test configurations (REFERENCE.md, "Tiny stand-ins").
"""
from __future__ import annotations

import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterable, Iterator

import torch

DEFAULT_VOCAB_WORDS = (
    "a", "photo", "of", "the", "best", "quality", "high", "monochrome", "lowres", "bad", "anatomy", "worst", "low",
    "bronze", "container", "vessel", "moth", "insect", "bird", "dog", "cat", "no", "not", "this", "is",
)
TOKENIZER_MAX_LENGTH = 77
BOS_TOKEN = "<|startoftext|>"
EOS_TOKEN = "<|endoftext|>"


def _byte_symbols() -> list[str]:
    """The 256 printable characters GPT-2/CLIP byte-level BPE uses for the bytes 0..255, in byte order."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), 256))
    codes = printable[:]
    extra = 0
    for byte in range(256):
        if byte not in printable:
            printable.append(byte)
            codes.append(256 + extra)
            extra += 1
    by_byte = dict(zip(printable, codes))
    return [chr(by_byte[b]) for b in range(256)]


def _word_merges(words: Iterable[str]) -> list[tuple[str, str]]:
    """Left-to-right merges that assemble each (lower-case ASCII) word into one `word</w>` token."""
    merges: list[tuple[str, str]] = []
    seen: set[tuple[str, str]] = set()
    for word in words:
        word = word.lower()
        if not word.isascii() or not word.isalpha() or len(word) < 2:
            continue
        pieces = list(word[:-1]) + [word[-1] + "</w>"]
        merged = pieces[0]
        for piece in pieces[1:]:
            pair = (merged, piece)
            if pair not in seen:
                seen.add(pair)
                merges.append(pair)
            merged += piece
    return merges


def tiny_tokenizer_vocab(vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS) -> tuple[dict[str, int], list[tuple[str, str]]]:
    """Vocabulary and merges of a byte-level CLIP BPE: bytes, bytes + `</w>`, merged words, then BOS and EOS last."""
    symbols = _byte_symbols()
    tokens = symbols + [s + "</w>" for s in symbols]
    merges = _word_merges(vocab_words)
    for left, right in merges:
        token = left + right
        if token not in tokens:
            tokens.append(token)
    tokens += [BOS_TOKEN, EOS_TOKEN]
    return {token: i for i, token in enumerate(tokens)}, merges


def save_tiny_tokenizer(folder: str | os.PathLike, vocab_words: Iterable[str] = DEFAULT_VOCAB_WORDS) -> Path:
    """Write a working byte-level CLIP BPE tokenizer to `folder` and return the folder.

    The folder holds `vocab.json`, `merges.txt`, `tokenizer.json` and `tokenizer_config.json` (model_max_length 77),
    loadable with `CLIPTokenizer`, `CLIPTokenizerFast` and `AutoTokenizer`. Its vocabulary size is
    `len(tokenizer)`; BOS and EOS are the last two ids (set a text config's `eos_token_id`/`pad_token_id` to match).
    """
    from transformers import CLIPTokenizer

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab, merges = tiny_tokenizer_vocab(vocab_words)
    tokenizer = CLIPTokenizer(vocab=vocab, merges=merges, model_max_length=TOKENIZER_MAX_LENGTH)
    tokenizer.save_pretrained(folder)
    (folder / "vocab.json").write_text(json.dumps(vocab, ensure_ascii=False), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "".join(f"{left} {right}\n" for left, right in merges)
    (folder / "merges.txt").write_text(merges_text, encoding="utf-8")
    config_path = folder / "tokenizer_config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config.update(model_max_length=TOKENIZER_MAX_LENGTH, tokenizer_class="CLIPTokenizer")
    config_path.write_text(json.dumps(config, indent=2, ensure_ascii=False), encoding="utf-8")
    return folder


# --- CLIP ---
def save_tiny_clip(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random-weight `CLIPModel` + `CLIPProcessor` folder (REFERENCE.md "CLIP" sizes) with the tiny BPE tokenizer.

    Vision: hidden 32, 2 layers, image 32, patch 8; text: hidden 32, 2 layers, 77 positions; projection 16. The text
    config's vocabulary size, BOS, EOS and pad ids match the tokenizer, so pooling at the end-of-text token works.
    Loads with `CLIPModel.from_pretrained(folder)` and `CLIPProcessor.from_pretrained(folder)`.
    """
    import tempfile

    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    folder = Path(folder)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(tmp))
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=TOKENIZER_MAX_LENGTH, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )
    vision_config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = CLIPModel(CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=16)).eval()
    model.save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder



# Component configurations of the ZeST models: "tiny" = diffusers'/transformers' own test sizes (REFERENCE.md),
# "full" = the public configs of SDXL base 1.0, controlnet-depth-sdxl-1.0, IP-Adapter SDXL ViT-H and DPT-hybrid-MiDaS
# (random weights, for the GPU benchmark; nothing is downloaded).
ZEST_SIZES: dict[str, dict[str, dict[str, Any]]] = {
    "tiny": {
        "unet": dict(block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
                     down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                     up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), attention_head_dim=(2, 4),
                     use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                     transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80,
                     cross_attention_dim=64),
        "vae": dict(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4,
                    down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                    sample_size=64, scaling_factor=0.13025, force_upcast=True),
        "text_encoder": dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                             projection_dim=32, hidden_act="gelu"),
        "text_encoder_2": dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                               projection_dim=32, hidden_act="gelu"),
        "controlnet": dict(conditioning_embedding_out_channels=(16, 32)),
        "image_encoder": dict(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                              image_size=224, patch_size=32, projection_dim=32),
        "depth": dict(image_size=64, patch_size=16, hidden_size=32, num_hidden_layers=4, num_attention_heads=4,
                      intermediate_size=37, backbone_out_indices=[0, 1, 2, 3], neck_hidden_sizes=[8, 16, 32, 64],
                      fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5]),
    },
    "full": {
        "unet": dict(block_out_channels=(320, 640, 1280), layers_per_block=2, sample_size=128, in_channels=4,
                     out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                     up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                     attention_head_dim=(5, 10, 20), use_linear_projection=True, addition_embed_type="text_time",
                     addition_time_embed_dim=256, transformer_layers_per_block=(1, 2, 10),
                     projection_class_embeddings_input_dim=2816, cross_attention_dim=2048),
        "vae": dict(block_out_channels=(128, 256, 512, 512), in_channels=3, out_channels=3, latent_channels=4,
                    down_block_types=("DownEncoderBlock2D",) * 4, up_block_types=("UpDecoderBlock2D",) * 4,
                    layers_per_block=2, sample_size=1024, scaling_factor=0.13025, force_upcast=True),
        "text_encoder": dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
                             projection_dim=768, hidden_act="quick_gelu"),
        "text_encoder_2": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                               projection_dim=1280, hidden_act="gelu"),
        "controlnet": dict(conditioning_embedding_out_channels=(16, 32, 96, 256)),
        "image_encoder": dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=16,
                              image_size=224, patch_size=14, projection_dim=1024, hidden_act="gelu",
                              layer_norm_eps=1e-5),
        "depth": dict(is_hybrid=True, image_size=384, patch_size=16, hidden_size=768, num_hidden_layers=12,
                      num_attention_heads=12, intermediate_size=3072, backbone_out_indices=[2, 5, 8, 11],
                      neck_hidden_sizes=[256, 512, 768, 768], reassemble_factors=[1, 1, 1, 0.5],
                      fusion_hidden_size=256, readout_type="project", backbone_featmap_shape=[1, 1024, 24, 24],
                      backbone_config=dict(global_padding="same", layer_type="bottleneck", depths=[3, 4, 9],
                                           out_features=["stage1", "stage2", "stage3"],
                                           embedding_dynamic_padding=True)),
    },
}


def sdxl_scheduler():
    """Euler discrete with SDXL base's beta schedule and timestep spacing."""
    from diffusers import EulerDiscreteScheduler

    return EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                                  timestep_spacing="leading", prediction_type="epsilon", num_train_timesteps=1000)


def ip_adapter_state(unet, image_embed_dim: int, tokens: int = 4) -> dict[str, dict[str, torch.Tensor]]:
    """Random IP-Adapter weights as `{"image_proj": ..., "ip_adapter": ...}` with h94's key names.

    `ip_adapter` holds `<k>.to_k_ip.weight` / `<k>.to_v_ip.weight`, k = 1, 3, 5, ..., one k per cross-attention
    processor in `unet.attn_processors` order, its hidden size the width of its block; `image_proj.proj` maps the
    image encoder's projection to `tokens` x cross_attention_dim.
    """
    cross_dim = unet.config.cross_attention_dim
    channels = list(unet.config.block_out_channels)
    image_proj = {"proj.weight": torch.randn(tokens * cross_dim, image_embed_dim) * 0.05,
                  "proj.bias": torch.zeros(tokens * cross_dim),
                  "norm.weight": torch.ones(cross_dim), "norm.bias": torch.zeros(cross_dim)}
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
        adapter[f"{key}.to_k_ip.weight"] = torch.randn(hidden, cross_dim) * 0.05
        adapter[f"{key}.to_v_ip.weight"] = torch.randn(hidden, cross_dim) * 0.05
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
    """Random-weight ZeST modules of `size` ('tiny' or 'full') built directly on `device` in `dtype`.

    Keys: tokenizer (the tiny byte-level BPE, enough to encode the constant prompt), text_encoder, text_encoder_2,
    unet, vae, scheduler, controlnet, image_encoder, ip_adapter (state dict), depth (DPTForDepthEstimation).
    """
    from diffusers import AutoencoderKL, ControlNetModel, UNet2DConditionModel
    from transformers import (CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer,
                              CLIPVisionConfig, CLIPVisionModelWithProjection, DPTConfig, DPTForDepthEstimation)

    if size not in ZEST_SIZES:
        raise ValueError(f"size must be one of {sorted(ZEST_SIZES)}, got {size!r}")
    sizes = ZEST_SIZES[size]
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(scratch))
    vocab = len(tokenizer) if size == "tiny" else 49408
    ids = dict(vocab_size=vocab, bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id,
               pad_token_id=tokenizer.eos_token_id, max_position_embeddings=TOKENIZER_MAX_LENGTH)
    with torch.device(device), _default_dtype(dtype):  # parameters are created where and as they will live
        unet = UNet2DConditionModel(**sizes["unet"])
        modules = {
            "tokenizer": tokenizer,
            "text_encoder": CLIPTextModel(CLIPTextConfig(**sizes["text_encoder"], **ids)),
            "text_encoder_2": CLIPTextModelWithProjection(CLIPTextConfig(**sizes["text_encoder_2"], **ids)),
            "unet": unet,
            "vae": AutoencoderKL(**sizes["vae"]),
            "controlnet": ControlNetModel.from_unet(unet, **sizes["controlnet"]),
            "image_encoder": CLIPVisionModelWithProjection(CLIPVisionConfig(**sizes["image_encoder"])),
            "depth": DPTForDepthEstimation(DPTConfig(**sizes["depth"])),
        }
    for module in modules.values():
        if isinstance(module, torch.nn.Module):
            module.to(dtype).eval()
    modules["scheduler"] = sdxl_scheduler()
    modules["ip_adapter"] = ip_adapter_state(unet, sizes["image_encoder"]["projection_dim"])
    return modules


def dpt_processor(image_size: int):
    """The DPT image processor at `image_size` (square resize, mean/std 0.5 as DPT-hybrid-MiDaS)."""
    from transformers import DPTImageProcessor

    return DPTImageProcessor(size={"height": image_size, "width": image_size}, keep_aspect_ratio=False,
                             image_mean=[0.5] * 3, image_std=[0.5] * 3)


def random_zest_pipeline(size: str = "full", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                         attention: str = "auto", compile: bool = False, seed: int = 0) -> "ZeSTPipeline":
    """A `ZeSTPipeline` of random-weight modules assembled in memory (no files), for benchmarks on any device."""
    from pipelines.depth import DepthEstimator
    from pipelines.zest import ZeSTPipeline, diffusers_pipeline_class

    modules = random_zest_modules(size, device, dtype, seed)
    pipe = diffusers_pipeline_class()(
        vae=modules["vae"], text_encoder=modules["text_encoder"], text_encoder_2=modules["text_encoder_2"],
        tokenizer=modules["tokenizer"], tokenizer_2=modules["tokenizer"], unet=modules["unet"],
        controlnet=modules["controlnet"], scheduler=modules["scheduler"], image_encoder=modules["image_encoder"],
        add_watermarker=False,
    )
    pipe.load_ip_adapter(modules["ip_adapter"], subfolder="", weight_name="", image_encoder_folder=None)
    depth = DepthEstimator(modules["depth"], dpt_processor(ZEST_SIZES[size]["depth"]["image_size"]), f"random-{size}")
    model_ids = {name: f"random-{size}-{name}" for name in ("base", "controlnet", "ip_adapter", "depth")}
    return ZeSTPipeline.from_pipeline(pipe, depth, model_ids, device, attention, compile)


def save_tiny_dpt(folder: str | os.PathLike, model: Any = None) -> Path:
    """A tiny DPT depth model (REFERENCE.md sizes; random unless `model` is given) and its image processor."""
    from transformers import DPTConfig, DPTForDepthEstimation

    folder = Path(folder)
    config = ZEST_SIZES["tiny"]["depth"]
    (model if model is not None else DPTForDepthEstimation(DPTConfig(**config)).eval()).save_pretrained(folder)
    dpt_processor(config["image_size"]).save_pretrained(folder)
    return folder


def save_tiny_zest(folder: str | os.PathLike, seed: int = 0) -> "ZeSTConfig":
    """Every ZeST component at tiny size with random weights, saved in the real layouts under `folder`.

    `sdxl/` (an SDXL pipeline folder), `controlnet/` (`ControlNetModel.from_unet`), `ip_adapter/` laid out like
    h94/IP-Adapter (`sdxl_models/ip-adapter_sdxl_vit-h.safetensors` + `models/image_encoder`), `depth/` (DPT).
    Returns a `ZeSTConfig` of these folders. Generates at 64 px (latent 32).
    """
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file

    from pipelines.zest import ZeSTConfig

    folder = Path(folder)
    modules = random_zest_modules("tiny", seed=seed)
    StableDiffusionXLPipeline(vae=modules["vae"], text_encoder=modules["text_encoder"],
                              text_encoder_2=modules["text_encoder_2"], tokenizer=modules["tokenizer"],
                              tokenizer_2=modules["tokenizer"], unet=modules["unet"], scheduler=modules["scheduler"],
                              add_watermarker=False).save_pretrained(folder / "sdxl")
    modules["controlnet"].save_pretrained(folder / "controlnet")
    modules["image_encoder"].save_pretrained(folder / "ip_adapter" / "models" / "image_encoder")
    config = ZeSTConfig(base=str(folder / "sdxl"), controlnet=str(folder / "controlnet"),
                        ip_adapter=str(folder / "ip_adapter"), depth=str(folder / "depth"))
    weights = folder / "ip_adapter" / config.ip_adapter_subfolder / config.ip_adapter_weight
    weights.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"{part}.{key}": tensor.contiguous() for part, tensors in modules["ip_adapter"].items()
            for key, tensor in tensors.items()}
    save_file(flat, str(weights))
    save_tiny_dpt(folder / "depth", modules["depth"])
    return config


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


def save_tiny_stable_diffusion(folder: str | os.PathLike, seed: int = 0) -> Path:
    """A random-weight Stable Diffusion 1.x folder (UNet latent 16 -> 32 px images, VAE x2, 2-layer CLIP text encoder,
    the tiny BPE tokenizer, SD's DDIM scheduler settings), without safety checker. Loads with
    `StableDiffusionPipeline.from_pretrained(folder)`.
    """
    from diffusers import AutoencoderKL, DDIMScheduler, StableDiffusionPipeline, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    folder = Path(folder)
    tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(folder / "tokenizer"))
    torch.manual_seed(seed)
    unet = UNet2DConditionModel(
        sample_size=16, in_channels=4, out_channels=4, block_out_channels=(16, 32), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=4, norm_num_groups=8,
    )
    vae = AutoencoderKL(
        in_channels=3, out_channels=3, block_out_channels=(16, 32), latent_channels=4, layers_per_block=1,
        down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2, norm_num_groups=8,
    )
    text_encoder = CLIPTextModel(CLIPTextConfig(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=TOKENIZER_MAX_LENGTH, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    ))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", clip_sample=False,
                              set_alpha_to_one=False, steps_offset=1)
    pipe = StableDiffusionPipeline(vae=vae, text_encoder=text_encoder, tokenizer=tokenizer, unet=unet, scheduler=scheduler,
                                   safety_checker=None, feature_extractor=None, requires_safety_checker=False)
    pipe.save_pretrained(folder)
    return folder
