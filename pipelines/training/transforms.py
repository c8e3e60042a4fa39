"""Image transforms of classifier training and fine-tuning, in PIL + NumPy (no torchvision), with torchvision's op
semantics (`torchvision.transforms` 0.14+ on PIL images: the same boxes, rounding, resampling filters and fills).

Each op maps `(PIL image, rng) -> PIL image`; `Compose(ops)` runs them and returns the uint8 [3,H,W] tensor the loaders
hand on (normalisation happens on the device, on whole batches: `Normalize`). `Compose.load(path, rng)` decodes a file
for its ops (`pipelines.decode`): the first op plans the box of the full image it reads (`plan`), so with
`Decode(draft=True)` a JPEG is decoded at the coarsest DCT scale that still has the op's output pixels, and the op
applies its full-size geometry to the smaller image (`apply`); without draft the pixels are those of a full decode.
Randomness comes from a NumPy generator seeded per (seed, epoch, row), so an image's augmentation does not depend on the
worker, the process or a resume (the draws follow torchvision's rules; the stream is not torch's global generator).

- `RandomResizedCrop(size, scale, ratio)`: ten tries of an area share in `scale` and a log-uniform aspect ratio, else
  the centre crop clamped to `ratio`; crop, then resize (bilinear).
- `Resize(size)`: the shorter side to `size` (the longer one truncated, `int(size * long / short)`), or (h, w).
- `CenterCrop(size)`: offsets `round((H - h) / 2)` (zero padding first when the image is smaller).
- `RandomCrop(size, padding)`: zero padding on every side, then a uniform window.
- `HorizontalFlip(p)`.
- `RandAugment(num_ops, magnitude)`: torchvision's 14 ops, 31 magnitude bins, sign flipped with probability 1/2,
  nearest-neighbour resampling and fill 0 for the geometric ops.
- `ResizeCenterCrop(size, crop_pct)`: the ConvNext-style image processor's evaluation pixels (`microsoft/resnet-50`):
  shorter side to `int(size / crop_pct)`, centre crop with floor offsets.

`reference_train(name, image_size, pre_size)` / `reference_eval(image_size, pre_size)` assemble Open-Insect's
preprocessor branches (`src/openood/preprocessors/base_preprocessor.py`, `test_preprocessor.py`; docs/training.md).
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any, Literal

import numpy as np
import torch
from PIL import Image, ImageEnhance, ImageOps

from pipelines.decode import Decode, Decoded, Region, decode, to_rgb_mode

Op = Callable[[Image.Image, np.random.Generator], Image.Image]


def to_uint8_tensor(image: Image.Image) -> torch.Tensor:
    """An RGB PIL image -> uint8 tensor [3,H,W]."""
    rgb = image if image.mode == "RGB" else image.convert("RGB")
    return torch.from_numpy(np.array(rgb, dtype=np.uint8)).permute(2, 0, 1).contiguous()


class Compose:
    """Run PIL ops in order (RGB first), return the uint8 [3,H,W] tensor; `load` decodes a file for them (`decode`:
    draft and orientation, `pipelines.decode.Decode`)."""

    def __init__(self, ops: Sequence[Op], decode: Decode = Decode()):
        self.ops, self.decode = list(ops), decode

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> torch.Tensor:
        rng = rng if rng is not None else np.random.default_rng(0)
        image = to_rgb_mode(image)
        for op in self.ops:
            image = op(image, rng)
        return to_uint8_tensor(image)

    def load(self, path: Any, rng: np.random.Generator | None = None) -> torch.Tensor:
        """Decode `path` (raises `ImageLoadError`) and run the ops: the first one on the decoded image through its
        planned region when it plans one, the others as `__call__` does."""
        rng = rng if rng is not None else np.random.default_rng(0)
        first = self.ops[0] if self.ops and hasattr(self.ops[0], "plan") else None
        planner = (lambda width, height: first.plan(width, height, rng)) if first is not None else None
        decoded, region = decode(path, self.decode, planner)
        image = first.apply(decoded, region) if first is not None else decoded.image
        for op in self.ops[1 if first is not None else 0:]:
            image = op(image, rng)
        return to_uint8_tensor(image)

    def with_decode(self, decode: Decode) -> Compose:
        """The same ops with another decode."""
        return Compose(self.ops, decode)

    def identity(self) -> dict[str, Any]:
        """What decides the pixels (for cache keys): the ops and the decode."""
        return {"ops": repr(self.ops), "decode": self.decode.identity()}

    def __repr__(self) -> str:
        draft = ", draft" if self.decode.draft else ""
        return f"Compose({self.ops!r}{draft}{'' if self.decode.orient else ', stored orientation'})"


class RandomResizedCrop:
    """A random area share in `scale` with a log-uniform aspect ratio in `ratio`, resized to size x size."""

    def __init__(self, size: int, scale: tuple[float, float] = (0.08, 1.0), ratio: tuple[float, float] = (3 / 4, 4 / 3),
                 resample: int = Image.BILINEAR):
        self.size, self.scale, self.ratio, self.resample = int(size), tuple(scale), tuple(ratio), resample

    def box(self, width: int, height: int, rng: np.random.Generator) -> tuple[int, int, int, int]:
        """(left, top, w, h) of the crop (torchvision's `RandomResizedCrop.get_params` rule)."""
        area = width * height
        log_ratio = (math.log(self.ratio[0]), math.log(self.ratio[1]))
        for _ in range(10):
            target = area * rng.uniform(*self.scale)
            aspect = math.exp(rng.uniform(*log_ratio))
            w, h = int(round(math.sqrt(target * aspect))), int(round(math.sqrt(target / aspect)))
            if 0 < w <= width and 0 < h <= height:
                top = int(rng.integers(0, height - h + 1))
                return int(rng.integers(0, width - w + 1)), top, w, h
        aspect = width / height
        if aspect < min(self.ratio):
            w, h = width, int(round(width / min(self.ratio)))
        elif aspect > max(self.ratio):
            w, h = int(round(height * max(self.ratio))), height
        else:
            w, h = width, height
        return (width - w) // 2, (height - h) // 2, w, h

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> Image.Image:
        left, top, w, h = self.box(*image.size, rng)
        return image.crop((left, top, left + w, top + h)).resize((self.size, self.size), self.resample)

    def plan(self, width: int, height: int, rng: np.random.Generator) -> Region:
        """The crop box drawn on the full size (the draws of `__call__`), written at size x size."""
        left, top, w, h = self.box(width, height, rng)
        return Region((left, top, left + w, top + h), (self.size, self.size))

    def apply(self, decoded: Decoded, region: Region) -> Image.Image:
        """Crop and resize at full scale; from a coarser decode, resize the box's pixels in one step."""
        if decoded.scale == 1:
            return decoded.image.crop(region.box).resize(region.out, self.resample)
        return decoded.image.resize(region.out, self.resample, box=decoded.box(region.box))

    def __repr__(self) -> str:
        return f"RandomResizedCrop({self.size}, scale={self.scale}, ratio={self.ratio})"


def resized_size(width: int, height: int, size: int | tuple[int, int]) -> tuple[int, int]:
    """(width, height) after torchvision's `Resize(size)`: an int is the shorter side, a pair is (h, w)."""
    if not isinstance(size, int):
        return int(size[1]), int(size[0])
    if width <= height:
        return size, int(size * height / width)
    return int(size * width / height), size


class Resize:
    """torchvision's `Resize(size)` on a PIL image (bilinear by default)."""

    def __init__(self, size: int | tuple[int, int], resample: int = Image.BILINEAR):
        self.size, self.resample = size if isinstance(size, int) else tuple(size), resample

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> Image.Image:
        return image.resize(resized_size(*image.size, self.size), self.resample)

    def plan(self, width: int, height: int, rng: np.random.Generator | None = None) -> Region:
        """The whole image, written at the size the full image resizes to."""
        return Region((0, 0, width, height), resized_size(width, height, self.size))

    def apply(self, decoded: Decoded, region: Region) -> Image.Image:
        return _resize_whole(decoded, region, self.resample)

    def __repr__(self) -> str:
        return f"Resize({self.size})"


def _resize_whole(decoded: Decoded, region: Region, resample: int) -> Image.Image:
    """The decoded image resized to `region.out`; from a coarser decode, the full image's exact extent (its last DCT
    block may be partial)."""
    if decoded.scale == 1:
        return decoded.image.resize(region.out, resample)
    return decoded.image.resize(region.out, resample, box=decoded.box(region.box))


def _pad(image: Image.Image, left: int, top: int, right: int, bottom: int) -> Image.Image:
    out = Image.new(image.mode, (image.width + left + right, image.height + top + bottom), 0)
    out.paste(image, (left, top))
    return out


class CenterCrop:
    """torchvision's `CenterCrop(size)`: zero padding when the image is smaller, offsets round((H - h) / 2)."""

    def __init__(self, size: int):
        self.size = int(size)

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> Image.Image:
        width, height = image.size
        if self.size > width or self.size > height:
            pad_w, pad_h = max(self.size - width, 0), max(self.size - height, 0)
            image = _pad(image, pad_w // 2, pad_h // 2, (pad_w + 1) // 2, (pad_h + 1) // 2)
            width, height = image.size
        top, left = int(round((height - self.size) / 2.0)), int(round((width - self.size) / 2.0))
        return image.crop((left, top, left + self.size, top + self.size))

    def __repr__(self) -> str:
        return f"CenterCrop({self.size})"


class RandomCrop:
    """torchvision's `RandomCrop(size, padding)`: zero padding on every side, then a uniform size x size window."""

    def __init__(self, size: int, padding: int = 0):
        self.size, self.padding = int(size), int(padding)

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> Image.Image:
        if self.padding:
            image = _pad(image, self.padding, self.padding, self.padding, self.padding)
        width, height = image.size
        top = int(rng.integers(0, height - self.size + 1))
        left = int(rng.integers(0, width - self.size + 1))
        return image.crop((left, top, left + self.size, top + self.size))

    def __repr__(self) -> str:
        return f"RandomCrop({self.size}, padding={self.padding})"


class HorizontalFlip:
    """Mirror left-right with probability `p`."""

    def __init__(self, p: float = 0.5):
        self.p = float(p)

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> Image.Image:
        return image.transpose(Image.FLIP_LEFT_RIGHT) if rng.random() < self.p else image

    def __repr__(self) -> str:
        return f"HorizontalFlip({self.p})"


# -- RandAugment ------------------------------------------------------------------------------------------------
RANDAUGMENT_OPS = ("Identity", "ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate", "Brightness", "Color",
                   "Contrast", "Sharpness", "Posterize", "Solarize", "AutoContrast", "Equalize")
"""torchvision's RandAugment op list, in its order (`_augmentation_space`)."""


def randaugment_magnitude(op: str, level: int, bins: int, width: int, height: int) -> tuple[float, bool]:
    """(magnitude, signed) of `op` at magnitude bin `level` of `bins` (torchvision's table)."""
    def linspace(start: float, end: float) -> float:  # torch.linspace(start, end, bins)[level], float32
        return float(np.float32(start + (end - start) * level / (bins - 1)))

    linear = {"ShearX": 0.3, "ShearY": 0.3, "TranslateX": 150.0 / 331.0 * width, "TranslateY": 150.0 / 331.0 * height,
              "Rotate": 30.0, "Brightness": 0.9, "Color": 0.9, "Contrast": 0.9, "Sharpness": 0.9}
    if op in linear:
        return linspace(0.0, linear[op]), True
    if op == "Posterize":
        return float(8 - int(round(level / ((bins - 1) / 4)))), False
    if op == "Solarize":
        return linspace(255.0, 0.0), False
    return 0.0, False


def inverse_affine(center: tuple[float, float], angle: float, translate: tuple[float, float],
                    shear: tuple[float, float]) -> list[float]:
    """torchvision's `_get_inverse_affine_matrix` (scale 1): the PIL ops here and AugMix's tensor ops."""
    rot, sx, sy = math.radians(angle), math.radians(shear[0]), math.radians(shear[1])
    a = math.cos(rot - sy) / math.cos(sy)
    b = -math.cos(rot - sy) * math.tan(sx) / math.cos(sy) - math.sin(rot)
    c = math.sin(rot - sy) / math.cos(sy)
    d = -math.sin(rot - sy) * math.tan(sx) / math.cos(sy) + math.cos(rot)
    (cx, cy), (tx, ty) = center, translate
    m = [d, -b, 0.0, -c, a, 0.0]
    m[2] += m[0] * (-cx - tx) + m[1] * (-cy - ty) + cx
    m[5] += m[3] * (-cx - tx) + m[4] * (-cy - ty) + cy
    return m


def _affine(image: Image.Image, angle: float, translate: tuple[float, float], shear: tuple[float, float],
            center: tuple[float, float]) -> Image.Image:
    """torchvision's PIL affine (scale 1): the inverse matrix about `center`, nearest neighbour, fill 0."""
    return image.transform(image.size, Image.AFFINE, inverse_affine(center, angle, translate, shear), Image.NEAREST,
                           fillcolor=(0,) * len(image.getbands()))


GEOMETRIC_OPS = ("ShearX", "ShearY", "TranslateX", "TranslateY", "Rotate")
"""The ops that move pixels (an affine map); the others change their values."""


def apply_op(image: Image.Image, op: str, magnitude: float) -> Image.Image:
    """One RandAugment op at a signed magnitude, as torchvision's `_apply_op` on a PIL image."""
    if op in GEOMETRIC_OPS:
        return _geometric_op(image, op, magnitude)
    return _pixel_op(image, op, magnitude)


def _geometric_op(image: Image.Image, op: str, magnitude: float) -> Image.Image:
    """`apply_op`'s affine ops: shear about the corner, translation about the centre, rotation."""
    w, h = image.size
    if op == "ShearX":
        return _affine(image, 0.0, (0, 0), (math.degrees(math.atan(magnitude)), 0.0), (0.0, 0.0))
    if op == "ShearY":
        return _affine(image, 0.0, (0, 0), (0.0, math.degrees(math.atan(magnitude))), (0.0, 0.0))
    if op == "TranslateX":
        return _affine(image, 0.0, (int(magnitude), 0), (0.0, 0.0), (w * 0.5, h * 0.5))
    if op == "TranslateY":
        return _affine(image, 0.0, (0, int(magnitude)), (0.0, 0.0), (w * 0.5, h * 0.5))
    return image.rotate(magnitude, Image.NEAREST, False, None, fillcolor=(0,) * len(image.getbands()))  # Rotate


def _pixel_op(image: Image.Image, op: str, magnitude: float) -> Image.Image:
    """`apply_op`'s colour and tone ops (and Identity); an op of neither kind raises."""
    enhance = {"Brightness": ImageEnhance.Brightness, "Color": ImageEnhance.Color, "Contrast": ImageEnhance.Contrast,
               "Sharpness": ImageEnhance.Sharpness}
    if op in enhance:
        return enhance[op](image).enhance(1.0 + magnitude)
    if op == "Posterize":
        return ImageOps.posterize(image, int(magnitude))
    if op == "Solarize":
        return ImageOps.solarize(image, magnitude)
    if op == "AutoContrast":
        return ImageOps.autocontrast(image)
    if op == "Equalize":
        return ImageOps.equalize(image)
    if op == "Identity":
        return image
    raise ValueError(f"unknown RandAugment op {op!r}; known: {', '.join(RANDAUGMENT_OPS)}")


class RandAugment:
    """torchvision's `RandAugment(num_ops, magnitude, num_magnitude_bins)`: `num_ops` ops drawn uniformly (with
    repetition) from `RANDAUGMENT_OPS`, each at bin `magnitude`, negated with probability 1/2 where signed."""

    def __init__(self, num_ops: int = 2, magnitude: int = 9, bins: int = 31):
        if not 0 <= magnitude < bins:
            raise ValueError(f"RandAugment magnitude must be in [0, {bins - 1}], got {magnitude}")
        self.num_ops, self.magnitude, self.bins = int(num_ops), int(magnitude), int(bins)

    def draws(self, width: int, height: int, rng: np.random.Generator) -> list[tuple[str, float]]:
        """The (op, signed magnitude) pairs of one call."""
        out = []
        for _ in range(self.num_ops):
            op = RANDAUGMENT_OPS[int(rng.integers(len(RANDAUGMENT_OPS)))]
            magnitude, signed = randaugment_magnitude(op, self.magnitude, self.bins, width, height)
            if signed and rng.integers(2):
                magnitude = -magnitude
            out.append((op, magnitude))
        return out

    def __call__(self, image: Image.Image, rng: np.random.Generator) -> Image.Image:
        for op, magnitude in self.draws(*image.size, rng):
            image = apply_op(image, op, magnitude)
        return image

    def __repr__(self) -> str:
        return f"RandAugment(num_ops={self.num_ops}, magnitude={self.magnitude})"


# -- the image processor's evaluation pixels ------------------------------------------------------------------
class ResizeCenterCrop:
    """Shorter side to `int(size / crop_pct)` (`size` itself when crop_pct is 1), then the centre size x size with
    floor offsets: what a ConvNext-style image processor does at sizes under 384."""

    def __init__(self, size: int, crop_pct: float = 0.875, resample: int = Image.BICUBIC):
        self.size, self.crop_pct, self.resample = int(size), float(crop_pct), resample

    def __call__(self, image: Image.Image, rng: np.random.Generator | None = None) -> Image.Image:
        return self._crop(image.resize(self.plan(*image.size).out, self.resample))

    def plan(self, width: int, height: int, rng: np.random.Generator | None = None) -> Region:
        short = int(self.size / self.crop_pct)
        new = (short, int(short * height / width)) if width <= height else (int(short * width / height), short)
        return Region((0, 0, width, height), new)

    def apply(self, decoded: Decoded, region: Region) -> Image.Image:
        return self._crop(_resize_whole(decoded, region, self.resample))

    def _crop(self, image: Image.Image) -> Image.Image:
        left, top = (image.width - self.size) // 2, (image.height - self.size) // 2
        return image.crop((left, top, left + self.size, top + self.size))

    def __repr__(self) -> str:
        return f"ResizeCenterCrop({self.size}, crop_pct={self.crop_pct})"


# -- Open-Insect's preprocessors --------------------------------------------------------------------------------
AUGMENTS = ("ami", "region", "imagenet")
"""Training branches of Open-Insect's `BasePreprocessor`, chosen there by `dataset.name`:
"ami" (classifier training, `ami_<region>`), "region" (the else branch `finetune.sh` takes with `--dataset.name
<region>`), "imagenet" (RandomResizedCrop(0.08-1) + flip, torchvision's ImageNet recipe, our `exact` one)."""


def reference_train(augment: Literal["ami", "region", "imagenet"], image_size: int, pre_size: int,
                    decode: Decode = Decode()) -> Compose:
    """The training transform of one `BasePreprocessor` branch at `image_size` (`pre_size`: the region branch's
    resize)."""
    if augment == "ami":
        return Compose([RandomResizedCrop(image_size, scale=(0.3, 1.0)), HorizontalFlip(), RandAugment(2, 9),
                        Resize((image_size, image_size))], decode)
    if augment == "region":
        return Compose([Resize(pre_size), CenterCrop(image_size), HorizontalFlip(), RandomCrop(image_size, padding=4)],
                       decode)
    if augment == "imagenet":
        return Compose([RandomResizedCrop(image_size), HorizontalFlip()], decode)
    raise ValueError(f"augment must be one of {AUGMENTS}, got {augment!r}")


def reference_eval(image_size: int, pre_size: int, decode: Decode = Decode()) -> Compose:
    """`TestStandardPreProcessor`: Resize(pre_size) + CenterCrop(image_size), bilinear (the aux rows' pixels too)."""
    return Compose([Resize(pre_size), CenterCrop(image_size)], decode)


class Normalize:
    """uint8 [B,3,H,W] on any device -> float (x / 255 - mean) / std, in channels-last memory when asked."""

    def __init__(self, mean: Sequence[float], std: Sequence[float], channels_last: bool = False):
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
        self.channels_last = channels_last

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if x.dtype != torch.uint8:
            return x
        mean, std = self.mean.to(x.device), self.std.to(x.device)
        out = (x.float() / 255.0 - mean) / std
        # a stack of views [B, V, 3, H, W] (AugMix) broadcasts too; channels-last memory is for 4-D batches
        return out.contiguous(memory_format=torch.channels_last) if self.channels_last and out.dim() == 4 else out
