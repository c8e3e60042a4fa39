"""Tiny random-weight stand-ins of the real models, saved with `save_pretrained` in the real folder layouts.

Tests, the demo and CPU benchmarks build these once, save them to a folder and load them back through the same
`from_pretrained` code paths users run with hub ids, so no weights are ever downloaded. Sizes follow diffusers' and
transformers' own test configurations (REFERENCE.md, "Tiny stand-ins").
"""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Iterable

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
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPProcessor, CLIPTokenizer

    import tempfile

    folder = Path(folder)
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(tmp))
    text_config = dict(
        vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        max_position_embeddings=TOKENIZER_MAX_LENGTH, bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id, pad_token_id=tokenizer.eos_token_id,
    )
    vision_config = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32, patch_size=8)
    torch.manual_seed(seed)
    model = CLIPModel(CLIPConfig(text_config=text_config, vision_config=vision_config, projection_dim=16)).eval()
    model.save_pretrained(folder)
    image_processor = CLIPImageProcessor(size={"shortest_edge": 32}, crop_size={"height": 32, "width": 32})
    CLIPProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(folder)
    return folder


def _tiny_text_encoders(vocab_size: int, bos: int, eos: int):
    """SDXL's two CLIP text encoders at tiny size: hidden 32, 2 layers; the second with a 32-d projection."""
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection

    config = CLIPTextConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=37, num_hidden_layers=2,
                            num_attention_heads=4, projection_dim=32, max_position_embeddings=TOKENIZER_MAX_LENGTH,
                            hidden_act="gelu", bos_token_id=bos, eos_token_id=eos, pad_token_id=eos)
    return CLIPTextModel(config), CLIPTextModelWithProjection(config)


def _tiny_sdxl_unet():
    """diffusers' own SDXL test UNet: (32, 64) channels, text_time embedding of 6 x 8 + 32, cross-attention 64."""
    from diffusers import UNet2DConditionModel

    return UNet2DConditionModel(
        block_out_channels=(32, 64), layers_per_block=2, sample_size=32, in_channels=4, out_channels=4,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        attention_head_dim=(2, 4), use_linear_projection=True, addition_embed_type="text_time",
        addition_time_embed_dim=8, transformer_layers_per_block=(1, 2), projection_class_embeddings_input_dim=80,
        cross_attention_dim=64,
    )


def _tiny_sdxl_vae():
    """A (32, 64)-channel KL VAE (latent scale 2) with SDXL's scaling factor and force_upcast."""
    from diffusers import AutoencoderKL

    return AutoencoderKL(block_out_channels=(32, 64), in_channels=3, out_channels=3, latent_channels=4,
                         down_block_types=("DownEncoderBlock2D",) * 2, up_block_types=("UpDecoderBlock2D",) * 2,
                         sample_size=64, scaling_factor=0.13025, force_upcast=True)


def _sdxl_scheduler():
    """Euler discrete with SDXL base's beta schedule and timestep spacing."""
    from diffusers import EulerDiscreteScheduler

    return EulerDiscreteScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", steps_offset=1,
                                  timestep_spacing="leading", prediction_type="epsilon", num_train_timesteps=1000)


def _ip_adapter_state(unet, image_embed_dim: int, tokens: int = 4) -> dict[str, torch.Tensor]:
    """Flat IP-Adapter weights in the h94 layout: `image_proj.*` and `ip_adapter.<k>.to_{k,v}_ip.weight`, k = 1, 3, ...

    One k per cross-attention processor in `unet.attn_processors` order; its hidden size is its block's width.
    """
    cross_dim = unet.config.cross_attention_dim
    channels = list(unet.config.block_out_channels)
    state = {
        "image_proj.proj.weight": torch.randn(tokens * cross_dim, image_embed_dim) * 0.05,
        "image_proj.proj.bias": torch.zeros(tokens * cross_dim),
        "image_proj.norm.weight": torch.ones(cross_dim),
        "image_proj.norm.bias": torch.zeros(cross_dim),
    }
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
        state[f"ip_adapter.{key}.to_k_ip.weight"] = torch.randn(hidden, cross_dim) * 0.05
        state[f"ip_adapter.{key}.to_v_ip.weight"] = torch.randn(hidden, cross_dim) * 0.05
        key += 2
    return state


def save_tiny_dpt(folder: str | os.PathLike, image_size: int = 64) -> Path:
    """A tiny DPT depth model (REFERENCE.md sizes) and its `DPTImageProcessor`, loadable with the Auto classes."""
    from transformers import DPTConfig, DPTForDepthEstimation, DPTImageProcessor

    folder = Path(folder)
    config = DPTConfig(image_size=image_size, patch_size=16, hidden_size=32, num_hidden_layers=4,
                       num_attention_heads=4, intermediate_size=37, backbone_out_indices=[0, 1, 2, 3],
                       neck_hidden_sizes=[8, 16, 32, 64], fusion_hidden_size=16, reassemble_factors=[4, 2, 1, 0.5])
    DPTForDepthEstimation(config).eval().save_pretrained(folder)
    DPTImageProcessor(size={"height": image_size, "width": image_size}, keep_aspect_ratio=False,
                      image_mean=[0.5] * 3, image_std=[0.5] * 3).save_pretrained(folder)
    return folder


def save_tiny_zest(folder: str | os.PathLike, seed: int = 0) -> "ZeSTConfig":
    """Every ZeST component at tiny size with random weights, saved in the real layouts under `folder`.

    `sdxl/` (an SDXL pipeline folder), `controlnet/` (`ControlNetModel.from_unet`), `ip_adapter/` laid out like
    h94/IP-Adapter (`sdxl_models/ip-adapter_sdxl_vit-h.safetensors` + `models/image_encoder`), `depth/` (DPT).
    Returns a `ZeSTConfig` of these folders. Generates at 64 px (latent 32).
    """
    from diffusers import ControlNetModel, StableDiffusionXLPipeline
    from safetensors.torch import save_file
    from transformers import CLIPTokenizer, CLIPVisionConfig, CLIPVisionModelWithProjection

    from pipelines.zest import ZeSTConfig

    folder = Path(folder)
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as scratch:
        tokenizer = CLIPTokenizer.from_pretrained(save_tiny_tokenizer(scratch))
    text_encoder, text_encoder_2 = _tiny_text_encoders(len(tokenizer), tokenizer.bos_token_id, tokenizer.eos_token_id)
    unet = _tiny_sdxl_unet()
    StableDiffusionXLPipeline(vae=_tiny_sdxl_vae(), text_encoder=text_encoder, text_encoder_2=text_encoder_2,
                              tokenizer=tokenizer, tokenizer_2=tokenizer, unet=unet, scheduler=_sdxl_scheduler(),
                              add_watermarker=False).save_pretrained(folder / "sdxl")
    ControlNetModel.from_unet(unet, conditioning_embedding_out_channels=(16, 32)).save_pretrained(folder / "controlnet")
    encoder_config = CLIPVisionConfig(hidden_size=32, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
                                      image_size=224, patch_size=32, projection_dim=32)
    CLIPVisionModelWithProjection(encoder_config).save_pretrained(folder / "ip_adapter" / "models" / "image_encoder")
    config = ZeSTConfig(base=str(folder / "sdxl"), controlnet=str(folder / "controlnet"),
                        ip_adapter=str(folder / "ip_adapter"), depth=str(folder / "depth"))
    weights = folder / "ip_adapter" / config.ip_adapter_subfolder / config.ip_adapter_weight
    weights.parent.mkdir(parents=True, exist_ok=True)
    save_file(_ip_adapter_state(unet, encoder_config.projection_dim), str(weights))
    save_tiny_dpt(folder / "depth")
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
