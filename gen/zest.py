"""ZeST zero-shot material transfer (Cheng et al., ECCV 2024) on diffusers, batched with per-sample exemplars.

Per target: a binary foreground mask, an init image with a grayscale foreground over the colour background, the
depth of the whole colour target (min-max normalised, 8-bit) for the depth ControlNet, and the material exemplar
for the IP-Adapter. SDXL base + depth ControlNet + `StableDiffusionXLControlNetInpaintPipeline`, strength 0.9999 so
the latent starts from the noised grayscale init (ZeST's illumination guidance).

Batching: the constant prompt is encoded once and the text encoders are dropped; exemplar embeddings are computed
per sample (negative = zeros) and passed through the pipeline unchanged (diffusers re-tiles batched embeds, issue
#9813); one generator per sample, so a batch gives the same images as one-at-a-time calls.
"""
from __future__ import annotations

import math
import os
from collections.abc import Sequence
from typing import Any, Literal, get_args

import cv2
import numpy as np
import torch
from PIL import Image

from gen.depth import DepthEstimator
from gen.masks import MASK_METHODS, binarise, foreground_masks, grayscale_init
from pipelines.data import to_rgb
from pipelines.hub_ids import CONTROLNET_ID, DPT_ID, IP_ADAPTER_ID, SDXL_ID
from pipelines.params import Config, ParamError, config, param
from pipelines.runtime import (
    check_model_ref,
    diffusers_dtype,
    enable_attention,
    item_generator,
    item_seed,
    load_pretrained,
    model_revision,
    resolve_device,
    resolve_dtype,
    select_variant,
)

PROMPT = "best quality, high quality"
NEGATIVE_PROMPT = "monochrome, lowres, bad anatomy, worst quality, low quality"
DEFAULT_SEED = 42


MaskMethod = Literal[MASK_METHODS]  # type: ignore[valid-type]
ResizeMode = Literal["squash", "pad"]
RESIZE_MODES = get_args(ResizeMode)


@config
class ZeSTConfig(Config):
    """Where each ZeST component comes from: hub ids by default, a local folder accepted for each (a local path must
    be a folder holding weight files: `pipelines.runtime.check_model_ref`)."""

    DOC = "docs/zest.md"

    base: str = param(SDXL_ID, "SDXL base pipeline: hub id or folder", check=check_model_ref)
    controlnet: str = param(CONTROLNET_ID, "depth ControlNet: hub id or folder", check=check_model_ref)
    ip_adapter: str = param(IP_ADAPTER_ID, "IP-Adapter repo: hub id or folder", check=check_model_ref)
    ip_adapter_subfolder: str = param("sdxl_models", "folder of the IP-Adapter weights inside `ip_adapter`")
    ip_adapter_weight: str = param("ip-adapter_sdxl_vit-h.safetensors", "IP-Adapter weight file name")
    image_encoder: str = param("models/image_encoder", "image encoder folder inside the `ip_adapter` repo / folder")
    depth: str = param(DPT_ID, "DPT depth model: hub id or folder", check=check_model_ref)
    vae: str | None = param(None, "replacement VAE (e.g. madebyollin/sdxl-vae-fp16-fix for fp16); null: the base's",
                            check=check_model_ref)

    @classmethod
    def from_value(cls, value: Any, where: str) -> ZeSTConfig:
        if isinstance(value, dict):  # folders given as paths
            value = {k: (str(v) if isinstance(v, os.PathLike) else v) for k, v in value.items()}
        return super().from_value(value, where)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "models") -> ZeSTConfig:
        return super().from_dict(raw, where)


@config
class ZeSTCall(Config):
    """ZeST's call parameters, defined once: the defaults of `ZeSTPipeline.__call__` / `generate` and of a generation
    config (ZeST's demo notebook, REFERENCE.md). Values that would fail every item are refused here."""

    DOC = "docs/zest.md"

    num_inference_steps: int = param(30, "denoising steps (ZeST: 30)", ge=1)
    strength: float = param(0.9999, "noise level the init image starts from, in (0, 1] (ZeST: 0.9999)", gt=0, le=1)
    guidance_scale: float = param(5.0, "classifier-free guidance scale (ZeST: 5.0; <= 1 turns guidance off)", ge=0)
    controlnet_conditioning_scale: float = param(0.9, "depth ControlNet scale (ZeST: 0.9)", ge=0)
    ip_adapter_scale: float = param(1.0, "IP-Adapter (material exemplar) scale (ZeST: 1.0)", ge=0)
    resolution: int = param(1024, "side of the square the models work at, a multiple of 8 (ZeST: 1024)", ge=8)
    resize: ResizeMode = param("squash", "squash to the square (ZeST) or pad to it, cropped back after")
    composite: bool = param(False, "paste the result over the original through the feathered mask")
    feather: float = param(3.0, "std in pixels of the composite's mask feathering", ge=0)
    mask_method: MaskMethod = param("auto", "masks of targets without a given one: auto (rembg if installed, else "
                                            "OpenCV), rembg or opencv")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if self.resolution % 8:
            raise ParamError("resolution", f"must be a multiple of 8 (the VAE's factor), got {self.resolution}")
        if int(self.num_inference_steps * self.strength) < 1:
            raise ParamError("strength", f"times num_inference_steps must reach 1 denoising step, got "
                                         f"{self.strength} x {self.num_inference_steps}")

    def call_kwargs(self) -> dict[str, Any]:
        """The keyword arguments of `ZeSTPipeline.__call__`."""
        return {name: getattr(self, name) for name in ZeSTCall.fields()}


def diffusers_pipeline_class():
    """`StableDiffusionXLControlNetInpaintPipeline` whose IP-Adapter embeds pass through unchanged (per sample)."""
    from diffusers import StableDiffusionXLControlNetInpaintPipeline

    class PerSampleIPAdapterInpaintPipeline(StableDiffusionXLControlNetInpaintPipeline):
        def prepare_ip_adapter_image_embeds(self, ip_adapter_image, ip_adapter_image_embeds, device,
                                            num_images_per_prompt, do_classifier_free_guidance):
            if ip_adapter_image_embeds is None:
                raise ValueError("ZeST passes precomputed per-sample ip_adapter_image_embeds")
            return [embeds.to(device) for embeds in ip_adapter_image_embeds]

    return PerSampleIPAdapterInpaintPipeline


def fit_square(image: Image.Image, resolution: int, mode: str, resample: int = Image.BICUBIC,
               fill: str = "edge") -> Image.Image:
    """`image` at resolution x resolution: squashed ('squash', ZeST), or padded to a square then resized ('pad').

    Padding is centred; `fill` is 'edge' (replicate the border) or 'zero'.
    """
    if mode not in RESIZE_MODES:
        raise ValueError(f"resize must be one of {RESIZE_MODES}, got {mode!r}")
    if mode == "pad":
        width, height = image.size
        side = max(width, height)
        left, top = (side - width) // 2, (side - height) // 2
        array = np.asarray(image)
        padding = [(top, side - height - top), (left, side - width - left)] + [(0, 0)] * (array.ndim - 2)
        array = np.pad(array, padding, mode="edge" if fill == "edge" else "constant")
        image = Image.fromarray(array, mode=image.mode)
    return image.resize((resolution, resolution), resample)


def unfit_square(image: Image.Image, size: tuple[int, int], mode: str) -> Image.Image:
    """Inverse of `fit_square`: back to `size` = (width, height), cropping away the padding in 'pad' mode."""
    width, height = size
    if mode == "squash":
        return image.resize((width, height), Image.BICUBIC)
    side = max(width, height)
    left, top = (side - width) // 2, (side - height) // 2
    return image.resize((side, side), Image.BICUBIC).crop((left, top, left + width, top + height))


def feathered_weights(mask: Image.Image, feather: float) -> np.ndarray:
    """Mask weights in [0, 1], float64: the binary mask blurred by a Gaussian of std `feather` pixels.

    The kernel is truncated at radius ceil(3 * feather), so pixels farther than that from the mask have weight 0.
    """
    binary = (np.asarray(binarise(mask)) > 0).astype(np.float64)
    if feather <= 0:
        return binary
    radius = math.ceil(3 * feather)
    return np.clip(cv2.GaussianBlur(binary, (2 * radius + 1, 2 * radius + 1), feather, borderType=cv2.BORDER_REPLICATE),
                   0.0, 1.0)


def composite_background(generated: Image.Image, original: Image.Image, mask: Image.Image,
                         feather: float) -> Image.Image:
    """Pixel-space composite: generated inside the feathered mask, the original untouched where its weight is 0."""
    weights = feathered_weights(mask, feather)[..., None]
    new = np.asarray(to_rgb(generated), dtype=np.float64)
    old = np.asarray(to_rgb(original), dtype=np.float64)
    blended = np.where(weights > 0, np.rint(weights * new + (1 - weights) * old), old)
    return Image.fromarray(np.clip(blended, 0, 255).astype(np.uint8), mode="RGB")


class ZeSTPipeline:
    """ZeST material transfer: `pipeline(targets, materials)` -> one image per target, at the target's size."""

    def __init__(self, pipe: Any, depth: DepthEstimator, prompt_embeds: tuple[torch.Tensor, ...],
                 model_ids: dict[str, str], attention: str, model_revisions: dict[str, str | None] | None = None,
                 compiled: bool = False):
        self.pipe = pipe
        self.depth = depth
        self.prompt_embeds = prompt_embeds
        self.model_ids = model_ids
        self.attention = attention
        self.model_revisions = dict(model_revisions or {})
        self.compiled = compiled

    @classmethod
    def from_config(cls, cfg: ZeSTConfig, device: str | torch.device | None = None,
                    dtype: torch.dtype | str | None = None, attention: str = "auto",
                    compile: bool = False) -> ZeSTPipeline:
        """Load every component (hub ids or folders), encode the constant prompt once and drop the text encoders.

        dtype: a torch dtype or a precision name (auto/bf16/fp16/fp32); auto = bf16/fp16 on GPU, fp32 on CPU. In half
        precision the `fp16` weight variant is downloaded where the repo or folder ships it (`select_variant`). The
        DPT depth model always runs in fp32 (as in ZeST's code; its output is min-max normalised to 8 bits).
        attention: auto/xformers/sdpa (never fused QKV: that deletes the IP-Adapter processors).
        compile: torch.compile the UNet and the ControlNet (fixed shapes: keep batch size and resolution constant).
        `model_revisions` records each model's hub commit (from the cache) or local folder hash.
        """
        from diffusers import AutoencoderKL, ControlNetModel

        from pipelines.cli import quiet_library_bars
        from pipelines.progress import progress_style

        if progress_style() != "bar":  # diffusers' loading bar writes carriage returns into logs
            quiet_library_bars()
        device = resolve_device(device)
        if dtype is None or isinstance(dtype, str):
            dtype = resolve_dtype(dtype or "auto", device)

        def variant(name: str) -> dict[str, str]:
            chosen = select_variant(name, dtype)
            return {} if chosen is None else {"variant": chosen}

        controlnet = load_pretrained(ControlNetModel.from_pretrained, cfg.controlnet, "depth ControlNet",
                                     **diffusers_dtype(dtype), **variant(cfg.controlnet))
        components: dict[str, Any] = {"controlnet": controlnet}
        if cfg.vae is not None:
            components["vae"] = load_pretrained(AutoencoderKL.from_pretrained, cfg.vae, "VAE", **diffusers_dtype(dtype),
                                                **variant(cfg.vae))
        pipe = load_pretrained(diffusers_pipeline_class().from_pretrained, cfg.base, "SDXL base pipeline",
                               **diffusers_dtype(dtype), **variant(cfg.base), add_watermarker=False, **components)
        load_pretrained(pipe.load_ip_adapter, cfg.ip_adapter, "IP-Adapter", subfolder=cfg.ip_adapter_subfolder,
                        weight_name=cfg.ip_adapter_weight, image_encoder_folder=cfg.image_encoder)
        depth = DepthEstimator.from_pretrained(cfg.depth, device=device, dtype=torch.float32)
        model_ids = {key: value for key, value in cfg.to_dict().items() if value is not None}
        revisions = {key: model_revision(getattr(cfg, key)) for key in ("base", "controlnet", "ip_adapter", "depth",
                                                                        "vae")
                     if getattr(cfg, key) is not None}
        return cls.from_pipeline(pipe, depth, model_ids, device, attention, compile, revisions)

    @classmethod
    def from_pipeline(cls, pipe: Any, depth: DepthEstimator, model_ids: dict[str, str],
                      device: str | torch.device | None = None, attention: str = "auto", compile: bool = False,
                      model_revisions: dict[str, str | None] | None = None) -> ZeSTPipeline:
        """Wrap an assembled `diffusers_pipeline_class()` pipeline with its IP-Adapter loaded (in its final dtype).

        Moves it to `device`, encodes the constant prompt once, drops the text encoders, sets the attention backend,
        puts the depth model in fp32 and optionally compiles the UNet and ControlNet. `from_config` and the GPU
        benchmark both end here.
        """
        device = resolve_device(device)
        depth.model.to(device=device, dtype=torch.float32)
        if pipe.unet.dtype == torch.bfloat16:
            pipe.vae.register_to_config(force_upcast=False)  # bf16 does not overflow; fp16 keeps SDXL's fp32 upcast
        pipe.to(device)
        with torch.inference_mode():
            prompt_embeds = pipe.encode_prompt(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, device=device,
                                               num_images_per_prompt=1, do_classifier_free_guidance=True)
        pipe.register_modules(text_encoder=None, text_encoder_2=None)
        backend = enable_attention(pipe, attention)
        if compile:
            pipe.unet = torch.compile(pipe.unet, fullgraph=False)
            pipe.controlnet = torch.compile(pipe.controlnet, fullgraph=False)
        pipe.set_progress_bar_config(disable=True)
        return cls(pipe, depth, tuple(e.detach() for e in prompt_embeds), dict(model_ids), backend, model_revisions,
                   compile)

    @property
    def device(self) -> torch.device:
        return self.pipe.unet.device

    @property
    def dtype(self) -> torch.dtype:
        """The diffusion models' dtype (the resolved precision; the depth model is fp32)."""
        return self.pipe.unet.dtype

    @torch.inference_mode()
    def exemplar_embeds(self, materials: Sequence[Image.Image], do_classifier_free_guidance: bool) -> torch.Tensor:
        """Per-sample IP-Adapter image embeds [(2)B, 1, D]: zeros (negative) first under guidance, then the
        exemplars."""
        embeds, negative = self.pipe.encode_image([to_rgb(m) for m in materials], self.device, 1)
        stacked = torch.cat([negative, embeds]) if do_classifier_free_guidance else embeds
        return stacked[:, None].to(self.pipe.unet.dtype)

    def prepare(self, targets: Sequence[Image.Image], masks: Sequence[Any] | None, resolution: int, resize: str,
                mask_method: str = "auto"
                ) -> tuple[list[Image.Image], list[Image.Image], list[Image.Image], list[Image.Image]]:
        """ZeST inputs at resolution x resolution: init images, binary masks, RGB depth maps; plus full-size masks."""
        rgb = [to_rgb(t) for t in targets]
        full_masks = foreground_masks(rgb, masks, mask_method)
        depths = self.depth(rgb)
        inits = [fit_square(grayscale_init(t, m), resolution, resize) for t, m in zip(rgb, full_masks)]
        fitted_masks = [binarise(fit_square(m, resolution, resize, Image.NEAREST, fill="zero")) for m in full_masks]
        controls = [fit_square(d, resolution, resize).convert("RGB") for d in depths]
        return inits, fitted_masks, controls, full_masks

    @torch.inference_mode()
    def generate(self, targets: Sequence[Image.Image], materials: Sequence[Image.Image],
                 masks: Sequence[Any] | None = None, seeds: Sequence[int] | None = None,
                 **params: Any) -> tuple[np.ndarray, list[Image.Image]]:
        """One batched diffusion call with the `ZeSTCall` keys `params` (unset: ZeST's): float images
        [B, resolution, resolution, 3] in [0, 1] and full-size masks."""
        call = ZeSTCall.from_dict(params, "zest")
        if len(materials) != len(targets):
            raise ValueError(f"materials: got {len(materials)} exemplars for {len(targets)} targets")
        if seeds is None:
            seeds = [item_seed(DEFAULT_SEED, index) for index in range(len(targets))]
        if len(seeds) != len(targets):
            raise ValueError(f"seeds: got {len(seeds)} seeds for {len(targets)} targets")
        resolution, guidance_scale = call.resolution, call.guidance_scale
        batch = len(targets)
        inits, fitted_masks, controls, full_masks = self.prepare(targets, masks, resolution, call.resize,
                                                                 call.mask_method)
        cfg = guidance_scale > 1.0
        positive, negative, pooled, negative_pooled = (e.repeat(batch, *[1] * (e.dim() - 1))
                                                       for e in self.prompt_embeds)
        self.pipe.set_ip_adapter_scale(call.ip_adapter_scale)
        images = self.pipe(
            prompt_embeds=positive, negative_prompt_embeds=negative, pooled_prompt_embeds=pooled,
            negative_pooled_prompt_embeds=negative_pooled, image=inits, mask_image=fitted_masks, control_image=controls,
            ip_adapter_image_embeds=[self.exemplar_embeds(materials, cfg)], height=resolution, width=resolution,
            num_inference_steps=call.num_inference_steps, strength=call.strength, guidance_scale=guidance_scale,
            controlnet_conditioning_scale=call.controlnet_conditioning_scale, num_images_per_prompt=1,
            generator=[item_generator(seed) for seed in seeds], output_type="np",
        ).images
        return np.asarray(images, dtype=np.float32), full_masks

    def __call__(self, targets: list[Image.Image], materials: list[Image.Image], masks: list[Any] | None = None,
                 seeds: list[int] | None = None, **call: Any) -> list[Image.Image]:
        """Transfer each material onto its target; returns RGB images at each target's size.

        masks: given foreground masks (files or images, None entries computed by `mask_method`: auto = rembg when
        installed, else the OpenCV fallback with a warning; see gen.masks).
        seeds: one per target (default: `item_seed(42, index)`); generators live on the CPU so results do not
        depend on the device's RNG. `call`: any `ZeSTCall` key (num_inference_steps, strength, guidance_scale,
        controlnet_conditioning_scale, ip_adapter_scale, resolution, resize: 'squash' (ZeST) or 'pad'
        (aspect-preserving, cropped back), composite: paste the result over the original through the mask feathered
        by a Gaussian of std `feather` px, mask_method); unset keys are ZeST's defaults, a bad value one ConfigError.
        """
        params = ZeSTCall.from_dict(call, "zest")
        arrays, full_masks = self.generate(targets, materials, masks, seeds, **call)
        resize = params.resize
        outputs = []
        for array, target, mask in zip(arrays, targets, full_masks):
            image = unfit_square(Image.fromarray(np.rint(array * 255).astype(np.uint8), mode="RGB"), target.size,
                                 resize)
            outputs.append(composite_background(image, target, mask, params.feather) if params.composite else image)
        return outputs

