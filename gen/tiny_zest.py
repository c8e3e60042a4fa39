"""The ZeST stand-ins: every ZeST component at tiny size with random weights, saved in the real layouts
(`save_tiny_zest`, what `models: tiny` and the tests load) or assembled in memory (`random_zest_pipeline`, the GPU
benchmark's path). The modules themselves are `pipelines.tiny`'s."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from gen.depth import DepthEstimator
from gen.zest import ZeSTConfig, ZeSTPipeline, diffusers_pipeline_class
from pipelines.tiny import dpt_processor, random_zest_modules, save_tiny_dpt


def random_zest_pipeline(size: str = "full", device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
                         attention: str = "auto", compile: bool = False, seed: int = 0) -> ZeSTPipeline:
    """A `ZeSTPipeline` of random-weight modules assembled in memory (no files), for benchmarks on any device."""
    modules = random_zest_modules(size, device, dtype, seed)
    pipe = diffusers_pipeline_class()(
        vae=modules["vae"], text_encoder=modules["text_encoder"], text_encoder_2=modules["text_encoder_2"],
        tokenizer=modules["tokenizer"], tokenizer_2=modules["tokenizer_2"], unet=modules["unet"],
        controlnet=modules["controlnet"], scheduler=modules["scheduler"], image_encoder=modules["image_encoder"],
        add_watermarker=False,
    )
    pipe.load_ip_adapter(modules["ip_adapter"], subfolder="", weight_name="", image_encoder_folder=None)
    depth = DepthEstimator(modules["depth"], dpt_processor(size), f"random-{size}")
    model_ids = {name: f"random-{size}-{name}" for name in ("base", "controlnet", "ip_adapter", "depth")}
    return ZeSTPipeline.from_pipeline(pipe, depth, model_ids, device, attention, compile)


def save_tiny_zest(folder: str | os.PathLike, seed: int = 0) -> ZeSTConfig:
    """Every ZeST component at tiny size with random weights, saved in the real layouts under `folder`.

    `sdxl/` (an SDXL pipeline folder), `controlnet/`, `ip_adapter/` laid out like h94/IP-Adapter
    (`sdxl_models/ip-adapter_sdxl_vit-h.safetensors` + `models/image_encoder`), `depth/` (DPT-hybrid).
    Returns a `ZeSTConfig` of these folders. The VAE downsamples by 8 like SDXL's: 64 px images have 8 x 8 latents.
    """
    from diffusers import StableDiffusionXLPipeline
    from safetensors.torch import save_file

    folder = Path(folder)
    modules = random_zest_modules("tiny", seed=seed)
    StableDiffusionXLPipeline(vae=modules["vae"], text_encoder=modules["text_encoder"],
                              text_encoder_2=modules["text_encoder_2"], tokenizer=modules["tokenizer"],
                              tokenizer_2=modules["tokenizer_2"], unet=modules["unet"], scheduler=modules["scheduler"],
                              add_watermarker=False).save_pretrained(folder / "sdxl")
    modules["controlnet"].save_pretrained(folder / "controlnet")
    config = ZeSTConfig(base=str(folder / "sdxl"), controlnet=str(folder / "controlnet"),
                        ip_adapter=str(folder / "ip_adapter"), depth=str(folder / "depth"))
    modules["image_encoder"].save_pretrained(folder / "ip_adapter" / config.image_encoder)
    weights = folder / "ip_adapter" / config.ip_adapter_subfolder / config.ip_adapter_weight
    weights.parent.mkdir(parents=True, exist_ok=True)
    flat = {f"{part}.{key}": tensor.contiguous() for part, tensors in modules["ip_adapter"].items()
            for key, tensor in tensors.items()}
    save_file(flat, str(weights))
    save_tiny_dpt(folder / "depth", modules["depth"])
    return config
