"""OpenAI guided-diffusion (ADM, Dhariwal & Nichol 2021) checkpoints as diffusers `UNet2DModel`s.

An ADM UNet is described by the MODEL_FLAGS of openai/guided-diffusion's README (`ADM_256_UNCOND` is the one of
`256x256_diffusion_uncond.pt`, the model DIFFGUARD runs). `unet_config(flags)` gives the equivalent `UNet2DModel`
config, `convert_state_dict(state, flags)` renames (and, for attention, splits) the checkpoint's tensors into that
model's layout, and `load_adm_checkpoint(path)` does both. Equivalences this relies on:

- timestep embedding: ADM's [cos, sin] with frequencies exp(-ln(10^4) i / half) = `flip_sin_to_cos=True, freq_shift=0`;
- ResBlock: in_layers (norm, SiLU, conv), emb_layers (SiLU, linear), out_layers (norm, SiLU, dropout, conv), 1x1 skip
  conv; scale-shift norm = `resnet_time_scale_shift="scale_shift"`; `resblock_updown` = ResNet blocks with
  `up`/`down` (nearest upsampling / 2x2 average pooling after the first norm+SiLU, on both branches);
- AttentionBlock: the fused 1x1 `qkv` convolution becomes `to_q`/`to_k`/`to_v`; the legacy order
  (`use_new_attention_order=False`, all released checkpoints) interleaves channels per head as [q_h, k_h, v_h];
  every attention block (the middle one too) has its own 32-group norm (`attn_norm_num_groups=32`); a fixed
  `num_heads` over several widths (improved-diffusion's checkpoints, whose layout guided-diffusion kept) gives head
  sizes that differ between blocks: `set_attention_heads` sets each block's head count after the model is built;
- learned sigma: 6 output channels, the first 3 are epsilon.

ADM's `use_fp16` keeps the time embedding, the embedding projections, the norms' arithmetic and the output head in
float32; a diffusers model cast to float16 runs them in float16 (the convolutions and attention match ADM's).
"""
from __future__ import annotations

import math
import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import torch

from pipelines.checkpoints import check_safetensors, safe_torch_load

# MODEL_FLAGS of openai/guided-diffusion's README for 256x256_diffusion_uncond.pt (a copy with its source is kept in
# pipelines/hub_configs/openai/guided-diffusion/256x256_diffusion_uncond.json; a test checks they are equal).
ADM_256_UNCOND: dict[str, Any] = {
    "attention_resolutions": "32,16,8",
    "class_cond": False,
    "diffusion_steps": 1000,
    "image_size": 256,
    "learn_sigma": True,
    "noise_schedule": "linear",
    "num_channels": 256,
    "num_head_channels": 64,
    "num_res_blocks": 2,
    "resblock_updown": True,
    "use_fp16": True,
    "use_scale_shift_norm": True,
}

# guided_diffusion.script_util.model_and_diffusion_defaults(), the model part: what a README flag line leaves unset.
ADM_MODEL_DEFAULTS: dict[str, Any] = {
    "image_size": 64,
    "num_channels": 128,
    "num_res_blocks": 2,
    "num_heads": 4,
    "num_heads_upsample": -1,
    "num_head_channels": -1,
    "attention_resolutions": "16,8",
    "channel_mult": "",
    "dropout": 0.0,
    "class_cond": False,
    "use_checkpoint": False,
    "use_scale_shift_norm": True,
    "resblock_updown": False,
    "use_fp16": False,
    "use_new_attention_order": False,
    "learn_sigma": False,
    "diffusion_steps": 1000,
    "noise_schedule": "linear",
}

# script_util.create_model's channel multipliers when `channel_mult` is "".
_DEFAULT_CHANNEL_MULT = {512: (0.5, 1, 1, 2, 2, 4, 4), 256: (1, 1, 2, 2, 4, 4), 128: (1, 1, 2, 3, 4), 64: (1, 2, 3, 4)}
_GROUPS = 32  # guided_diffusion.nn.normalization: GroupNorm32(32, channels)
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".safetensors")


def resolve_flags(flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Flags completed with guided-diffusion's defaults (`None` = `ADM_256_UNCOND`); unknown names raise."""
    flags = dict(ADM_256_UNCOND if flags is None else flags)
    unknown = sorted(set(flags) - set(ADM_MODEL_DEFAULTS))
    if unknown:
        raise ValueError(f"unknown guided-diffusion model flags {unknown}; known: {sorted(ADM_MODEL_DEFAULTS)}")
    return {**ADM_MODEL_DEFAULTS, **flags}


def channel_mult(flags: Mapping[str, Any]) -> tuple[float, ...]:
    """The per-level channel multipliers (create_model's defaults by image size when `channel_mult` is "")."""
    flags = resolve_flags(flags)
    text = str(flags["channel_mult"])
    if text:
        return tuple(float(v) for v in text.split(","))
    size = int(flags["image_size"])
    if size not in _DEFAULT_CHANNEL_MULT:
        raise ValueError(f"guided-diffusion has no default channel_mult for image_size {size}: set channel_mult")
    return _DEFAULT_CHANNEL_MULT[size]


def attention_levels(flags: Mapping[str, Any]) -> list[bool]:
    """Per level: does it have attention (its downsampling factor is image_size // some attention resolution)?"""
    flags = resolve_flags(flags)
    factors = {int(flags["image_size"]) // int(r) for r in str(flags["attention_resolutions"]).split(",")}
    return [2**level in factors for level in range(len(channel_mult(flags)))]


def _heads(flags: dict[str, Any], width: int, upsampling: bool) -> int:
    """ADM's head count of an attention block of `width` channels (create_model: `num_head_channels` when set, else
    `num_heads`, or `num_heads_upsample` in the output blocks)."""
    if int(flags["num_head_channels"]) != -1:
        return width // int(flags["num_head_channels"])
    if upsampling and int(flags["num_heads_upsample"]) != -1:
        return int(flags["num_heads_upsample"])
    return int(flags["num_heads"])


def attention_heads(flags: Mapping[str, Any] | None = None) -> dict[str, int]:
    """The `UNet2DModel` attention modules of `unet_config(flags)` -> ADM's head count for each."""
    flags = resolve_flags(flags)
    widths = [int(m * int(flags["num_channels"])) for m in channel_mult(flags)]
    attention, blocks = attention_levels(flags), int(flags["num_res_blocks"])
    out = {"mid_block.attentions.0": _heads(flags, widths[-1], False)}
    for level, (width, attends) in enumerate(zip(widths, attention)):
        if attends:
            out.update({f"down_blocks.{level}.attentions.{j}": _heads(flags, width, False) for j in range(blocks)})
    for u, level in enumerate(reversed(range(len(widths)))):
        if attention[level]:
            out.update({f"up_blocks.{u}.attentions.{i}": _heads(flags, widths[level], True)
                        for i in range(blocks + 1)})
    return out


def _head_dim(flags: dict[str, Any], channels: list[int]) -> int:
    """`UNet2DModel`'s one `attention_head_dim`: ADM's head size where all blocks share it; otherwise (`num_heads`
    fixed over widths, as improved-diffusion's models) a size dividing every attended width, the per-block head
    counts being set by `set_attention_heads`."""
    if int(flags["num_head_channels"]) != -1:
        return int(flags["num_head_channels"])
    dims = {c // h for c in channels for h in {_heads(flags, c, False), _heads(flags, c, True)}}
    return dims.pop() if len(dims) == 1 else math.gcd(*channels)


def set_attention_heads(unet: Any, flags: Mapping[str, Any] | None = None) -> Any:
    """Give each attention module of `unet` ADM's head count (and scale 1 / sqrt(head size)): needed where head sizes
    differ between blocks, which one `attention_head_dim` cannot say. Such a model saved as a diffusers folder reloads
    with the placeholder heads: load it from its ADM checkpoint."""
    for name, heads in attention_heads(flags).items():
        attn = unet.get_submodule(name)
        attn.heads = attn.sliceable_head_dim = heads
        attn.scale = (attn.inner_dim // heads) ** -0.5
    return unet


def unet_config(flags: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The diffusers `UNet2DModel` config equivalent to guided-diffusion's `create_model(**flags)`."""
    flags = resolve_flags(flags)
    if flags["class_cond"]:
        raise NotImplementedError("class-conditional ADM checkpoints are not supported (DIFFGUARD uses the "
                                  "unconditional one)")
    base = int(flags["num_channels"])
    mults = channel_mult(flags)
    widths = [int(m * base) for m in mults]
    attention = attention_levels(flags)
    attended = [w for w, a in zip(widths, attention) if a] + [widths[-1]]  # the middle block always attends
    updown = bool(flags["resblock_updown"])
    down = ["AttnDownBlock2D" if a else ("ResnetDownsampleBlock2D" if updown else "DownBlock2D") for a in attention]
    up = ["AttnUpBlock2D" if a else ("ResnetUpsampleBlock2D" if updown else "UpBlock2D") for a in reversed(attention)]
    return dict(
        sample_size=int(flags["image_size"]), in_channels=3, out_channels=6 if flags["learn_sigma"] else 3,
        center_input_sample=False, time_embedding_type="positional", flip_sin_to_cos=True, freq_shift=0,
        down_block_types=tuple(down), up_block_types=tuple(up), block_out_channels=tuple(widths),
        layers_per_block=int(flags["num_res_blocks"]), mid_block_scale_factor=1, downsample_padding=1,
        downsample_type="resnet" if updown else "conv", upsample_type="resnet" if updown else "conv",
        dropout=float(flags["dropout"]), act_fn="silu", attention_head_dim=_head_dim(flags, attended),
        norm_num_groups=_GROUPS, attn_norm_num_groups=_GROUPS, norm_eps=1e-5,
        resnet_time_scale_shift="scale_shift" if flags["use_scale_shift_norm"] else "default", add_attention=True,
    )


def build_unet(flags: Mapping[str, Any] | None = None, empty: bool = False):
    """A `UNet2DModel` for `flags` with random weights (or, `empty=True`, on the meta device: no memory, for checks),
    with ADM's head count in every attention block."""
    from diffusers import UNet2DModel

    if not empty:
        return set_attention_heads(UNet2DModel(**unet_config(flags)), flags)
    from accelerate import init_empty_weights

    with init_empty_weights():
        return set_attention_heads(UNet2DModel(**unet_config(flags)), flags)


# -- state-dict conversion ------------------------------------------------------------------------------------
_RESBLOCK = {"in_layers.0": "norm1", "in_layers.2": "conv1", "emb_layers.1": "time_emb_proj", "out_layers.0": "norm2",
             "out_layers.3": "conv2", "skip_connection": "conv_shortcut"}


def _module_map(flags: dict[str, Any]) -> dict[str, tuple[str, str]]:
    """ADM module prefix -> (diffusers module prefix, kind) with kind in resnet | attention | conv | linear | norm."""
    mults, attention = channel_mult(flags), attention_levels(flags)
    levels, blocks, updown = len(mults), int(flags["num_res_blocks"]), bool(flags["resblock_updown"])
    out = {"time_embed.0": ("time_embedding.linear_1", "linear"), "time_embed.2": ("time_embedding.linear_2", "linear"),
           "input_blocks.0.0": ("conv_in", "conv"), "out.0": ("conv_norm_out", "norm"), "out.2": ("conv_out", "conv"),
           "middle_block.0": ("mid_block.resnets.0", "resnet"),
           "middle_block.1": ("mid_block.attentions.0", "attention"),
           "middle_block.2": ("mid_block.resnets.1", "resnet")}
    out.update(_down_modules(levels, blocks, updown, attention))
    out.update(_up_modules(levels, blocks, updown, attention))
    return out


def _down_modules(levels: int, blocks: int, updown: bool, attention: list[bool]) -> dict[str, tuple[str, str]]:
    """`input_blocks.<n>` (numbered across levels, block 0 being conv_in) -> `down_blocks.<level>`."""
    out: dict[str, tuple[str, str]] = {}
    n = 0
    for level in range(levels):
        for j in range(blocks):
            n += 1
            out[f"input_blocks.{n}.0"] = (f"down_blocks.{level}.resnets.{j}", "resnet")
            if attention[level]:
                out[f"input_blocks.{n}.1"] = (f"down_blocks.{level}.attentions.{j}", "attention")
        if level != levels - 1:
            n += 1
            if updown:
                out[f"input_blocks.{n}.0"] = (f"down_blocks.{level}.downsamplers.0", "resnet")
            else:
                out[f"input_blocks.{n}.0.op"] = (f"down_blocks.{level}.downsamplers.0.conv", "conv")
    return out


def _up_modules(levels: int, blocks: int, updown: bool, attention: list[bool]) -> dict[str, tuple[str, str]]:
    """`output_blocks.<m>` (numbered across levels, deepest first) -> `up_blocks.<u>`."""
    out: dict[str, tuple[str, str]] = {}
    m = 0
    for u, level in enumerate(reversed(range(levels))):
        for i in range(blocks + 1):
            out[f"output_blocks.{m}.0"] = (f"up_blocks.{u}.resnets.{i}", "resnet")
            k = 1
            if attention[level]:
                out[f"output_blocks.{m}.1"] = (f"up_blocks.{u}.attentions.{i}", "attention")
                k = 2
            if level and i == blocks:
                if updown:
                    out[f"output_blocks.{m}.{k}"] = (f"up_blocks.{u}.upsamplers.0", "resnet")
                else:
                    out[f"output_blocks.{m}.{k}.conv"] = (f"up_blocks.{u}.upsamplers.0.conv", "conv")
            m += 1
    return out


def _split_qkv(weight: torch.Tensor, bias: torch.Tensor, heads: int,
               legacy: bool) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """ADM's fused qkv 1x1 conv [3C, C, 1] -> [(W_q, b_q), (W_k, b_k), (W_v, b_v)] of Linear [C, C]."""
    three_c, c = weight.shape[:2]
    w = weight.reshape(three_c, c)
    if legacy:  # channels ordered (head, q|k|v, head channel)
        w, b = w.reshape(heads, 3, -1, c), bias.reshape(heads, 3, -1)
        return [(w[:, i].reshape(-1, c), b[:, i].reshape(-1)) for i in range(3)]
    w, b = w.reshape(3, -1, c), bias.reshape(3, -1)  # (q|k|v, head, head channel)
    return [(w[i], b[i]) for i in range(3)]


def convert_state_dict(state: Mapping[str, torch.Tensor],
                       flags: Mapping[str, Any] | None = None) -> dict[str, torch.Tensor]:
    """An ADM checkpoint's state dict (guided_diffusion.unet.UNetModel) -> the `UNet2DModel` of `unet_config(flags)`.

    Every source tensor must be used: an unmapped key raises (with the flags that probably do not match)."""
    flags = resolve_flags(flags)
    modules = _module_map(flags)
    heads_of = attention_heads(flags)
    legacy = not flags["use_new_attention_order"]
    out: dict[str, torch.Tensor] = {}
    for prefix, params in _group_by_module(state).items():
        owner, sub = _owner(prefix, modules)
        if not owner:
            raise KeyError(f"ADM checkpoint key {prefix!r} has no counterpart for flags {flags}: are they the "
                           "checkpoint's MODEL_FLAGS?")
        target, kind = modules[owner]
        if kind == "resnet":
            out.update(_resnet_params(prefix, target, sub, params))
        elif kind == "attention":
            out.update(_attention_params(prefix, target, sub, params, heads_of, legacy))
        else:
            if sub:
                raise KeyError(f"unexpected ADM checkpoint key {prefix!r}")
            out.update({f"{target}.{name}": tensor for name, tensor in params.items()})
    return out


def _group_by_module(state: Mapping[str, torch.Tensor]) -> dict[str, dict[str, torch.Tensor]]:
    """`a.b.weight`, `a.b.bias` -> {"a.b": {"weight": ..., "bias": ...}}; a key ending otherwise raises."""
    pattern = re.compile(r"^(.*)\.(weight|bias)$")
    grouped: dict[str, dict[str, torch.Tensor]] = {}
    for key, value in state.items():
        match = pattern.match(key)
        if not match:
            raise KeyError(f"unexpected ADM checkpoint key {key!r}")
        grouped.setdefault(match.group(1), {})[match.group(2)] = value
    return grouped


def _owner(prefix: str, modules: Mapping[str, tuple[str, str]]) -> tuple[str, str]:
    """The longest leading part of `prefix` that is a mapped module, and the rest (the parameter's path inside it);
    ("", ...) when no part is mapped."""
    sub = ""
    owner = prefix
    while owner and owner not in modules:
        owner, _, last = owner.rpartition(".")
        sub = f"{last}.{sub}" if sub else last
    return owner, sub


def _resnet_params(prefix: str, target: str, sub: str,
                   params: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """One ResBlock layer's tensors under its diffusers name (`_RESBLOCK`)."""
    if sub not in _RESBLOCK:
        raise KeyError(f"unexpected ResBlock parameter {prefix!r}")
    return {f"{target}.{_RESBLOCK[sub]}.{name}": tensor for name, tensor in params.items()}


def _attention_params(prefix: str, target: str, sub: str, params: Mapping[str, torch.Tensor],
                      heads_of: Mapping[str, int], legacy: bool) -> dict[str, torch.Tensor]:
    """One AttentionBlock layer's tensors: the norm as is, the fused qkv split in three, proj_out's 1x1 conv as a
    Linear."""
    out: dict[str, torch.Tensor] = {}
    if sub == "norm":
        for name, tensor in params.items():
            out[f"{target}.group_norm.{name}"] = tensor
    elif sub == "qkv":
        for part, (w, b) in zip(("to_q", "to_k", "to_v"),
                                _split_qkv(params["weight"], params["bias"], heads_of[target], legacy)):
            out[f"{target}.{part}.weight"], out[f"{target}.{part}.bias"] = w.contiguous(), b.contiguous()
    elif sub == "proj_out":
        out[f"{target}.to_out.0.weight"] = params["weight"].reshape(params["weight"].shape[:2]).contiguous()
        out[f"{target}.to_out.0.bias"] = params["bias"]
    else:
        raise KeyError(f"unexpected AttentionBlock parameter {prefix!r}")
    return out


def read_checkpoint(path: str | os.PathLike) -> dict[str, torch.Tensor]:
    """A state dict from a .pt/.pth/.bin (torch.load, weights only) or .safetensors file."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"guided-diffusion checkpoint {str(path)!r} does not exist")
    if path.suffix == ".safetensors":
        from safetensors.torch import load_file

        check_safetensors(path)
        return load_file(str(path))
    state = safe_torch_load(path, "guided-diffusion checkpoint")
    if not isinstance(state, Mapping):
        raise ValueError(f"{path}: expected a state dict, got {type(state).__name__}")
    return dict(state)


def load_adm_checkpoint(path: str | os.PathLike, flags: Mapping[str, Any] | None = None,
                        dtype: torch.dtype | None = None):
    """A `UNet2DModel` holding the weights of an ADM checkpoint (e.g. `256x256_diffusion_uncond.pt`; `flags` = its
    MODEL_FLAGS, default `ADM_256_UNCOND`). Loaded without a random initialisation; missing or unexpected tensors
    raise."""
    converted = convert_state_dict(read_checkpoint(path), flags)
    unet = build_unet(flags, empty=True)
    expected = {k: tuple(v.shape) for k, v in unet.state_dict().items()}
    got = {k: tuple(v.shape) for k, v in converted.items()}
    missing, unexpected = sorted(set(expected) - set(got)), sorted(set(got) - set(expected))
    wrong = sorted(k for k in set(expected) & set(got) if expected[k] != got[k])
    if missing or unexpected or wrong:
        raise ValueError(f"{path}: checkpoint does not fit the flags {resolve_flags(flags)}: missing {missing[:5]}, "
                         f"unexpected {unexpected[:5]}, wrong shapes {[(k, got[k], expected[k]) for k in wrong[:5]]}")
    if dtype is not None:
        converted = {k: v.to(dtype) for k, v in converted.items()}
    unet.load_state_dict(converted, strict=True, assign=True)
    return unet.eval()


def is_adm_checkpoint(name_or_path: str | os.PathLike) -> bool:
    """True for a checkpoint file (.pt/.pth/.bin/.safetensors), False for a diffusers folder or hub id."""
    return Path(name_or_path).suffix in CHECKPOINT_SUFFIXES and Path(name_or_path).is_file()


def load_pixel_unet(name_or_path: str | os.PathLike, flags: Mapping[str, Any] | None = None,
                    dtype: torch.dtype | None = None):
    """A pixel-space `UNet2DModel` from an ADM checkpoint file (converted, see `load_adm_checkpoint`) or a diffusers
    folder / hub id (`UNet2DModel.from_pretrained`)."""
    if is_adm_checkpoint(name_or_path):
        return load_adm_checkpoint(name_or_path, flags, dtype)
    if Path(name_or_path).suffix in CHECKPOINT_SUFFIXES:
        raise FileNotFoundError(f"guided-diffusion checkpoint {str(name_or_path)!r} does not exist")
    from diffusers import UNet2DModel

    from pipelines.runtime import diffusers_dtype, load_pretrained

    return load_pretrained(UNet2DModel.from_pretrained, name_or_path, "pixel diffusion UNet",
                           **(diffusers_dtype(dtype) if dtype is not None else {}))


def shrink_flags(flags: Mapping[str, Any] | None = None, image_size: int = 32, num_channels: int = 32,
                 num_head_channels: int = 16) -> dict[str, Any]:
    """A stand-in of `flags` with only size fields changed: image size, widths and head size; the channel multipliers
    and the attention levels (downsampling factors) stay those of the real model."""
    flags = resolve_flags(flags)
    factors = [int(flags["image_size"]) // int(r) for r in str(flags["attention_resolutions"]).split(",")]
    if any(image_size % f for f in factors):
        raise ValueError(f"image_size {image_size} must be divisible by the attention factors {factors}")
    small = {k: v for k, v in flags.items() if k in ADM_256_UNCOND or k == "channel_mult"}
    small.update(image_size=image_size, num_channels=num_channels, num_head_channels=num_head_channels,
                 channel_mult=",".join(f"{m:g}" for m in channel_mult(flags)),
                 attention_resolutions=",".join(str(image_size // f) for f in factors))
    return small


def save_tiny_adm_unet(folder: str | os.PathLike, flags: Mapping[str, Any] | None = None, seed: int = 0) -> Path:
    """A random-weight stand-in of the 256x256 unconditional ADM (`shrink_flags`: 32 px, width 32) saved as a diffusers
    folder; loads with `UNet2DModel.from_pretrained` or `load_pixel_unet`."""
    torch.manual_seed(seed)
    build_unet(flags or shrink_flags()).save_pretrained(folder)
    return Path(folder)
