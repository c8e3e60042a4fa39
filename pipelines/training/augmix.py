"""AugMix (Hendrycks et al., ICLR 2020) as torchvision's `transforms.AugMix` computes it, without torchvision, and the
clean + two AugMix views OpenOOD's AugMix preprocessor hands its JSD trainer.

torchvision (0.14, `transforms/autoaugment.py:466-601`, the version Debian ships; OpenOOD's
`augmix_preprocessor.py:28-33` builds it) turns a PIL image into a uint8 tensor and runs TENSOR ops on it
(`functional_tensor.py`: grid-sample affine without fill, the float32 `_blend` of the colour ops, `bincount`
equalize), so these are tensor ops too:
- weights: m ~ Dirichlet(alpha, alpha) (m[0] for the original), w ~ Dirichlet(alpha x mixture_width) * m[1];
- each of `mixture_width` chains: depth `chain_depth`, or uniform in {1, 2, 3} when it is <= 0; each op uniform over
  `augmix_ops(all_ops)`, its magnitude bin uniform in [0, severity) of 10 bins, negated with probability 1/2 where
  signed; `mix = m[0] * x + sum_i w_i * chain_i(x)` in float32, truncated to uint8 (`.to(uint8)`, no rounding).
The draws come from a NumPy generator (the loaders' per (seed, epoch, row) one), not torch's global generator, in the
order torchvision draws them; `AugMix.draw` / `AugMix.mix` split the draw from the pixels so the pixels can be checked
against torchvision with the same draws (tests/pipelines/training/test_augmix.py).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import torch
import torch.nn.functional as F
from PIL import Image

from pipelines.decode import Decode
from pipelines.training.transforms import GEOMETRIC_OPS, Compose, inverse_affine, to_uint8_tensor

BINS = 10
"""torchvision's `AugMix._PARAMETER_MAX`: magnitude bins per op, and the largest severity."""
BASE_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Posterize", "Solarize", "AutoContrast",
            "Equalize")
COLOUR_OPS = ("Brightness", "Color", "Contrast", "Sharpness")
"""The ops `all_ops` adds (AugMix's paper leaves them out: they overlap ImageNet-C's corruptions)."""


def augmix_ops(all_ops: bool) -> tuple[str, ...]:
    """The op list in torchvision's order (`AugMix._augmentation_space`)."""
    return BASE_OPS + COLOUR_OPS if all_ops else BASE_OPS


def magnitudes(op: str, width: int, height: int) -> tuple[torch.Tensor | None, bool]:
    """(the 10 magnitude bins, signed) of `op` on a width x height image; None for the ops without a magnitude."""
    linear = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": width / 3.0, "TranslateY": height / 3.0, "Rotate": 30.0,
              "Brightness": 0.9, "Color": 0.9, "Contrast": 0.9, "Sharpness": 0.9}
    if op in linear:
        return torch.linspace(0.0, linear[op], BINS), True
    if op == "Posterize":
        return 4 - (torch.arange(BINS) / ((BINS - 1) / 4)).round().int(), False
    if op == "Solarize":
        return torch.linspace(255.0, 0.0, BINS), False
    if op in ("AutoContrast", "Equalize"):
        return None, False
    raise ValueError(f"unknown AugMix op {op!r}; known: {', '.join(augmix_ops(True))}")


# -- torchvision's tensor ops on uint8 [..., C, H, W] -----------------------------------------------------------------


def _grid_transform(img: torch.Tensor, matrix: list[float], mode: str) -> torch.Tensor:
    """`functional_tensor.affine` without fill: pixel-centre grid through `matrix`, grid_sample with zero padding,
    rounded back to uint8."""
    h, w = img.shape[-2:]
    theta = torch.tensor(matrix, dtype=torch.float32).reshape(1, 2, 3)
    base = torch.empty(1, h, w, 3, dtype=torch.float32)
    base[..., 0].copy_(torch.linspace(-w * 0.5 + 0.5, w * 0.5 + 0.5 - 1, steps=w))
    base[..., 1].copy_(torch.linspace(-h * 0.5 + 0.5, h * 0.5 + 0.5 - 1, steps=h).unsqueeze_(-1))
    base[..., 2].fill_(1)
    rescaled = theta.transpose(1, 2) / torch.tensor([0.5 * w, 0.5 * h])  # [1, 3, 2]
    # torchvision's `base.bmm(rescaled)`, as torch 1.13 summed it on the CPU: left to right, no fused multiply-add
    # (a newer bmm rounds some points differently, and a pixel-centre tie then samples another pixel)
    rows = base.view(1, h * w, 3)
    grid = (rows[..., 0:1] * rescaled[:, 0:1] + rows[..., 1:2] * rescaled[:, 1:2] + rows[..., 2:3] * rescaled[:, 2:3])
    grid = grid.view(1, h, w, 2)
    x = img.reshape(-1, *img.shape[-3:]).float()
    out = F.grid_sample(x, grid.expand(x.shape[0], h, w, 2), mode=mode, padding_mode="zeros", align_corners=False)
    return torch.round(out).to(img.dtype).reshape(img.shape)


def _blend(img1: torch.Tensor, img2: torch.Tensor, ratio: float) -> torch.Tensor:
    return (float(ratio) * img1 + (1.0 - float(ratio)) * img2).clamp(0, 255.0).to(img1.dtype)


def _grayscale(img: torch.Tensor) -> torch.Tensor:
    r, g, b = img.unbind(dim=-3)
    return (0.2989 * r + 0.587 * g + 0.114 * b).to(img.dtype).unsqueeze(dim=-3)


def _sharpness(img: torch.Tensor, factor: float) -> torch.Tensor:
    """`adjust_sharpness`: blend with the 3x3 (1, 5 centre) / 13 smoothed image inside a one-pixel border."""
    if img.shape[-1] <= 2 or img.shape[-2] <= 2:
        return img
    kernel = torch.ones((3, 3), dtype=torch.float32)
    kernel[1, 1] = 5.0
    kernel /= kernel.sum()
    channels = img.shape[-3]
    x = img.reshape(-1, *img.shape[-3:]).float()
    smooth = torch.round(F.conv2d(x, kernel.expand(channels, 1, 3, 3), groups=channels)).to(img.dtype)
    degenerate = img.clone()
    degenerate[..., 1:-1, 1:-1] = smooth.reshape(*img.shape[:-2], *smooth.shape[-2:])
    return _blend(img, degenerate, factor)


def _autocontrast(img: torch.Tensor) -> torch.Tensor:
    low = img.amin(dim=(-2, -1), keepdim=True).float()
    high = img.amax(dim=(-2, -1), keepdim=True).float()
    scale = 255.0 / (high - low)
    flat = torch.isfinite(scale).logical_not()
    low[flat], scale[flat] = 0, 1
    return ((img - low) * scale).clamp(0, 255.0).to(img.dtype)


def _equalize_channel(chan: torch.Tensor) -> torch.Tensor:
    hist = torch.bincount(chan.reshape(-1), minlength=256)
    nonzero = hist[hist != 0]
    step = torch.div(nonzero[:-1].sum(), 255, rounding_mode="floor")
    if step == 0:
        return chan
    lut = torch.div(torch.cumsum(hist, 0) + torch.div(step, 2, rounding_mode="floor"), step, rounding_mode="floor")
    lut = F.pad(lut, [1, 0])[:-1].clamp(0, 255)
    return lut[chan.to(torch.int64)].to(torch.uint8)


def _equalize(img: torch.Tensor) -> torch.Tensor:
    flat = img.reshape(-1, *img.shape[-2:])
    return torch.stack([_equalize_channel(c) for c in flat]).reshape(img.shape)


def apply_op(img: torch.Tensor, op: str, magnitude: float, interpolation: str = "bilinear") -> torch.Tensor:
    """One AugMix op on a uint8 tensor [..., C, H, W], as torchvision's `autoaugment._apply_op` on tensors (no fill)."""
    if op in GEOMETRIC_OPS:
        return _geometric_op(img, op, magnitude, interpolation)
    return _pixel_op(img, op, magnitude)


def _geometric_op(img: torch.Tensor, op: str, magnitude: float, interpolation: str) -> torch.Tensor:
    """`apply_op`'s affine ops: shear about the corner, translation and rotation about the centre."""
    h, w = img.shape[-2:]
    centre = (0.0, 0.0)
    corner = (-w * 0.5, -h * 0.5)  # center=[0, 0] in pixels, relative to the image centre
    if op == "ShearX":
        return _grid_transform(img, inverse_affine(corner, 0.0, (0, 0), (math.degrees(math.atan(magnitude)), 0.0)),
                               interpolation)
    if op == "ShearY":
        return _grid_transform(img, inverse_affine(corner, 0.0, (0, 0), (0.0, math.degrees(math.atan(magnitude)))),
                               interpolation)
    if op == "TranslateX":
        return _grid_transform(img, inverse_affine(centre, 0.0, (float(int(magnitude)), 0.0), (0.0, 0.0)),
                               interpolation)
    if op == "TranslateY":
        return _grid_transform(img, inverse_affine(centre, 0.0, (0.0, float(int(magnitude))), (0.0, 0.0)),
                               interpolation)
    return _grid_transform(img, inverse_affine(centre, -magnitude, (0.0, 0.0), (0.0, 0.0)), interpolation)  # Rotate


def _pixel_op(img: torch.Tensor, op: str, magnitude: float) -> torch.Tensor:
    """`apply_op`'s colour and tone ops; an op of neither kind raises."""
    if op == "Brightness":
        return _blend(img, torch.zeros_like(img), 1.0 + magnitude)
    if op == "Color":
        return _blend(img, _grayscale(img), 1.0 + magnitude)
    if op == "Contrast":
        mean = torch.mean(_grayscale(img).float(), dim=(-3, -2, -1), keepdim=True)
        return _blend(img, mean, 1.0 + magnitude)
    if op == "Sharpness":
        return _sharpness(img, 1.0 + magnitude)
    if op == "Posterize":
        return img & (256 - 2 ** (8 - int(magnitude)))  # torchvision's -2**(8 - bits), as a uint8 mask
    if op == "Solarize":
        return torch.where(img >= magnitude, 255 - img, img)
    if op == "AutoContrast":
        return _autocontrast(img)
    if op == "Equalize":
        return _equalize(img)
    raise ValueError(f"unknown AugMix op {op!r}; known: {', '.join(augmix_ops(True))}")


# -- AugMix ------------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class AugMixDraw:
    """One AugMix call's randomness: the (original, augmented) Beta share `m` [2], the chains' weights `weights`
    [mixture_width] (already times m[1]) and each chain's (op, signed magnitude) list."""

    m: tuple[float, float]
    weights: tuple[float, ...]
    chains: tuple[tuple[tuple[str, float], ...], ...]


class AugMix:
    """torchvision's `AugMix(severity, mixture_width, chain_depth, alpha, all_ops, interpolation)`, fill None, on a
    uint8 tensor [C,H,W] or an RGB PIL image (returned as it came)."""

    def __init__(self, severity: int = 3, mixture_width: int = 3, chain_depth: int = -1, alpha: float = 1.0,
                 all_ops: bool = True, interpolation: Literal["bilinear", "nearest"] = "bilinear"):
        if not 1 <= severity <= BINS:
            raise ValueError(f"AugMix severity must be in [1, {BINS}], got {severity}")
        if mixture_width < 1:
            raise ValueError(f"AugMix mixture_width must be >= 1, got {mixture_width}")
        if alpha <= 0:
            raise ValueError(f"AugMix alpha must be > 0 (Dirichlet concentration), got {alpha}")
        if interpolation not in ("bilinear", "nearest"):
            raise ValueError(f"AugMix interpolation on tensors is bilinear or nearest, got {interpolation!r}")
        self.severity, self.mixture_width, self.chain_depth = int(severity), int(mixture_width), int(chain_depth)
        self.alpha, self.all_ops, self.interpolation = float(alpha), bool(all_ops), interpolation

    def draw(self, width: int, height: int, rng: np.random.Generator) -> AugMixDraw:
        """The draws of one call, in torchvision's order: m, the chain weights, then per chain its depth and per op
        the op, the magnitude bin (ops with magnitudes) and the sign (signed ops)."""
        m = rng.dirichlet([self.alpha, self.alpha]).astype(np.float32)
        weights = rng.dirichlet([self.alpha] * self.mixture_width).astype(np.float32) * m[1]
        ops = augmix_ops(self.all_ops)
        chains = []
        for _ in range(self.mixture_width):
            depth = self.chain_depth if self.chain_depth > 0 else int(rng.integers(1, 4))
            chain = []
            for _ in range(depth):
                op = ops[int(rng.integers(len(ops)))]
                bins, signed = magnitudes(op, width, height)
                magnitude = float(bins[int(rng.integers(self.severity))].item()) if bins is not None else 0.0
                if signed and rng.integers(2):
                    magnitude *= -1.0
                chain.append((op, magnitude))
            chains.append(tuple(chain))
        return AugMixDraw((float(m[0]), float(m[1])), tuple(float(v) for v in weights), tuple(chains))

    def mix(self, img: torch.Tensor, draw: AugMixDraw) -> torch.Tensor:
        """float32 m[0] * img + sum_i weights[i] * chain_i(img), truncated to uint8."""
        batch = img.reshape(1, *img.shape[-3:])
        out = torch.tensor(draw.m[0], dtype=torch.float32) * batch
        for weight, chain in zip(draw.weights, draw.chains):
            aug = batch
            for op, magnitude in chain:
                aug = apply_op(aug, op, magnitude, self.interpolation)
            out.add_(torch.tensor(weight, dtype=torch.float32) * aug)
        return out.reshape(img.shape).to(img.dtype)

    def __call__(self, img: Any, rng: np.random.Generator) -> Any:
        tensor = img if isinstance(img, torch.Tensor) else to_uint8_tensor(img)
        out = self.mix(tensor, self.draw(tensor.shape[-1], tensor.shape[-2], rng))
        if isinstance(img, torch.Tensor):
            return out
        return Image.fromarray(out.permute(1, 2, 0).numpy())

    def __repr__(self) -> str:
        return (f"AugMix(severity={self.severity}, mixture_width={self.mixture_width}, chain_depth={self.chain_depth}, "
                f"alpha={self.alpha}, all_ops={self.all_ops}, interpolation={self.interpolation})")


class AugMixViews:
    """OpenOOD's `AugMixPreprocessor.__call__` (`augmix_preprocessor.py:65-72`) on a training transform `base`
    (`transforms.Compose`, uint8 [3,H,W] out): with `jsd` the uint8 [3, 3, H, W] stack (clean, AugMix, AugMix) of one
    base crop, two independent AugMix draws; without, AugMix of the crop, [3, H, W]. Normalisation stays on the
    device (`transforms.Normalize` broadcasts over the view axis)."""

    def __init__(self, base: Compose, augmix: AugMix, jsd: bool = True):
        self.base, self.augmix, self.jsd = base, augmix, bool(jsd)

    def views(self, orig: torch.Tensor, rng: np.random.Generator) -> torch.Tensor:
        if not self.jsd:
            return self.augmix(orig, rng)
        return torch.stack([orig, self.augmix(orig, rng), self.augmix(orig, rng)])

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = rng if rng is not None else np.random.default_rng(0)
        return self.views(self.base(image, rng), rng)

    def load(self, path: Any, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = rng if rng is not None else np.random.default_rng(0)
        return self.views(self.base.load(path, rng), rng)

    def with_decode(self, decode: Decode) -> AugMixViews:
        return AugMixViews(self.base.with_decode(decode), self.augmix, self.jsd)

    def identity(self) -> dict[str, Any]:
        return {**self.base.identity(), "augmix": repr(self.augmix), "jsd": self.jsd}

    def __repr__(self) -> str:
        return f"AugMixViews({self.base!r}, {self.augmix!r}, jsd={self.jsd})"
