"""Image similarities for generation-based detectors (images in [0,1], Tensor[B,3,H,W]; HIGHER = MORE SIMILAR).

`psnr` (dB), `ssim` (Gaussian window, Wang et al. 2004), `l2` (negative RMSE), `logit_l1` (negative mean absolute
difference of the protected classifier's logits: DIFFGUARD's CIFAR choice) and the perceptual `dists` / `lpips`
(1 - distance), which need their pretrained VGG16 weights as local files (`weights=`); nothing is downloaded.
"""
from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pipelines.checkpoints import check_safetensors, safe_torch_load

SIMILARITIES = ("dists", "lpips", "logit_l1", "ssim", "psnr", "l2")
Similarity = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def _wide(t: torch.Tensor) -> torch.Tensor:
    """`t` in float64 for the distances' sums, float32 on MPS (which has no float64): the scores then carry float32
    rounding there, about 1e-7 relative."""
    return t.float() if t.device.type == "mps" else t.double()


def psnr(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0) -> torch.Tensor:
    """Peak signal-to-noise ratio per image in dB (float64): 10 log10(range^2 / MSE)."""
    mse = (_wide(a) - _wide(b)).pow(2).flatten(1).mean(1)
    return 10.0 * torch.log10(data_range**2 / mse.clamp_min(1e-20))


def l2(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Negative root-mean-square difference per image (float64)."""
    return -(_wide(a) - _wide(b)).pow(2).flatten(1).mean(1).sqrt()


def _gaussian_window(sigma: float, truncate: float, dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    radius = int(truncate * sigma + 0.5)
    x = torch.arange(-radius, radius + 1, dtype=dtype, device=device)
    w = torch.exp(-0.5 * (x / sigma) ** 2)
    return w / w.sum()


def ssim(a: torch.Tensor, b: torch.Tensor, data_range: float = 1.0, sigma: float = 1.5,
         truncate: float = 3.5) -> torch.Tensor:
    """Mean SSIM per image (float64) with a Gaussian window (sigma 1.5, 11x11), K1 0.01, K2 0.03, population statistics.

    Averaged over channels and the positions where the window fits inside the image (as scikit-image's
    `structural_similarity(..., gaussian_weights=True, use_sample_covariance=False)`).
    """
    a, b = _wide(a), _wide(b)
    channels = a.shape[1]
    w = _gaussian_window(sigma, truncate, a.dtype, a.device)
    if a.shape[-1] < len(w) or a.shape[-2] < len(w):
        raise ValueError(f"ssim needs images of at least {len(w)}x{len(w)} pixels, got {tuple(a.shape[-2:])}")
    kernel_h = w.view(1, 1, -1, 1).repeat(channels, 1, 1, 1)
    kernel_w = w.view(1, 1, 1, -1).repeat(channels, 1, 1, 1)

    def blur(x: torch.Tensor) -> torch.Tensor:
        return F.conv2d(F.conv2d(x, kernel_h, groups=channels), kernel_w, groups=channels)

    mu_a, mu_b = blur(a), blur(b)
    var_a = blur(a * a) - mu_a**2
    var_b = blur(b * b) - mu_b**2
    cov = blur(a * b) - mu_a * mu_b
    c1, c2 = (0.01 * data_range) ** 2, (0.03 * data_range) ** 2
    s = ((2 * mu_a * mu_b + c1) * (2 * cov + c2)) / ((mu_a**2 + mu_b**2 + c1) * (var_a + var_b + c2))
    return s.flatten(1).mean(1)


def logit_l1(classifier: Any) -> Similarity:
    """Negative mean |logits(a) - logits(b)| of `classifier.forward_images` (the protected classifier)."""

    def similarity(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        dtype = classifier.head.weight.dtype
        with torch.no_grad():
            la, _ = classifier.forward_images(a.to(dtype))
            lb, _ = classifier.forward_images(b.to(dtype))
        return -(_wide(la) - _wide(lb)).abs().mean(1)

    return similarity


# -- perceptual (VGG16) ---------------------------------------------------------------------------------------
_VGG16_LAYOUT = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M", 512, 512, 512)
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def vgg16_features() -> nn.Sequential:
    """VGG16 convolutional trunk up to relu5_3 with torchvision's module indices (so `features.N.*` weights load)."""
    layers: list[nn.Module] = []
    channels = 3
    for item in _VGG16_LAYOUT:
        if item == "M":
            layers.append(nn.MaxPool2d(2, 2))
        else:
            layers += [nn.Conv2d(channels, int(item), 3, padding=1), nn.ReLU()]
            channels = int(item)
    return nn.Sequential(*layers)


class L2Pool(nn.Module):
    """DISTS' anti-aliased pooling: sqrt(Hann-filtered x^2), stride 2."""

    def __init__(self, channels: int) -> None:
        super().__init__()
        a = torch.tensor([0.5, 1.0, 0.5])
        g = a[:, None] * a[None, :]
        self.register_buffer("filter", (g / g.sum()).expand(channels, 1, 3, 3).contiguous(), persistent=False)
        self.channels = channels

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return (F.conv2d(x * x, self.filter, stride=2, padding=1, groups=self.channels) + 1e-12).sqrt()


def load_weight_files(paths: str | os.PathLike | Sequence[str | os.PathLike] | None,
                      what: str) -> dict[str, torch.Tensor]:
    """Merge local weight files (.safetensors, .pt/.pth state dicts) into one dict; a clear error when none is given."""
    if not paths:
        raise FileNotFoundError(
            f"{what} needs pretrained VGG16 weights as local files, none given: pass perceptual_weights=[...] "
            "(torchvision's vgg16 state dict with `features.N.*` keys plus the metric's own file), or choose "
            "distance 'logit_l1', 'ssim', 'psnr' or 'l2'"
        )
    paths = [paths] if isinstance(paths, (str, os.PathLike)) else list(paths)
    state: dict[str, torch.Tensor] = {}
    for path in paths:
        path = os.fspath(path)
        if not os.path.isfile(path):
            raise FileNotFoundError(f"{what}: weight file {path!r} does not exist")
        if path.endswith(".safetensors"):
            from safetensors.torch import load_file

            check_safetensors(path)
            state.update(load_file(path))
        else:
            state.update(safe_torch_load(path, f"{what} weight file"))
    return state


class DISTS(nn.Module):
    """DISTS (Ding et al., 2020) = 1 - sum_k alpha_k * structure + beta_k * texture over the input and 5 VGG stages."""

    channels = (3, 64, 128, 256, 512, 512)

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        vgg = vgg16_features()
        vgg.load_state_dict({k[len("features."):]: v for k, v in state.items() if k.startswith("features.")})
        # max-pools (indices 4, 9, 16, 23) are replaced by L2 pooling
        self.stages = nn.ModuleList([
            vgg[0:4], nn.Sequential(L2Pool(64), *vgg[5:9]), nn.Sequential(L2Pool(128), *vgg[10:16]),
            nn.Sequential(L2Pool(256), *vgg[17:23]), nn.Sequential(L2Pool(512), *vgg[24:30]),
        ])
        missing = {"alpha", "beta"} - set(state)
        if missing:
            raise KeyError(f"DISTS weights lack {sorted(missing)} (DISTS_pytorch's weights.pt holds alpha and beta)")
        self.register_buffer("alpha", state["alpha"].float().reshape(1, -1, 1, 1))
        self.register_buffer("beta", state["beta"].float().reshape(1, -1, 1, 1))
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1))
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1))
        self.requires_grad_(False)

    def features(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The input and the 5 VGG stages of images in [0,1]; images whose short side exceeds 256 px are first
        bilinearly downsampled by 256 / short side (piq's DISTS, which DIFFGUARD uses)."""
        x = x.float()
        short = min(x.shape[-2:])
        if short > 256:
            x = F.interpolate(x, scale_factor=256 / short, recompute_scale_factor=False, mode="bilinear",
                              align_corners=False)
        out, h = [x], (x - self.mean) / self.std
        for stage in self.stages:
            h = stage(h)
            out.append(h)
        return out

    def distance(self, fa: list[torch.Tensor], fb: list[torch.Tensor]) -> torch.Tensor:
        """DISTS [B] between two images' `features`."""
        total = self.alpha.sum() + self.beta.sum()
        alphas = torch.split(self.alpha / total, list(self.channels), dim=1)
        betas = torch.split(self.beta / total, list(self.channels), dim=1)
        c1 = c2 = 1e-6
        dist = torch.zeros(len(fa[0]), device=fa[0].device)
        for xa, xb, wa, wb in zip(fa, fb, alphas, betas):
            ma, mb = xa.mean((2, 3), keepdim=True), xb.mean((2, 3), keepdim=True)
            structure = (2 * ma * mb + c1) / (ma**2 + mb**2 + c1)
            va, vb = ((xa - ma) ** 2).mean((2, 3), keepdim=True), ((xb - mb) ** 2).mean((2, 3), keepdim=True)
            cov = (xa * xb).mean((2, 3), keepdim=True) - ma * mb
            texture = (2 * cov + c2) / (va + vb + c2)
            dist = dist + (wa * structure + wb * texture).sum((1, 2, 3))
        return 1.0 - dist

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.distance(self.features(a), self.features(b))


class LPIPS(nn.Module):
    """LPIPS-VGG v0.1 (Zhang et al., 2018): unit-normalised relu1_2..relu5_3 differences, learned 1x1 weights."""

    taps = (4, 9, 16, 23, 30)

    def __init__(self, state: dict[str, torch.Tensor]) -> None:
        super().__init__()
        self.vgg = vgg16_features()
        self.vgg.load_state_dict({k[len("features."):]: v for k, v in state.items() if k.startswith("features.")})
        keys = [f"lin{k}.model.1.weight" for k in range(5)]
        missing = [k for k in keys if k not in state]
        if missing:
            raise KeyError(f"LPIPS weights lack {missing} (the lpips package's weights/v0.1/vgg.pth holds them)")
        self.lins = nn.ParameterList([nn.Parameter(state[k].float(), requires_grad=False) for k in keys])
        self.register_buffer("shift", torch.tensor([-0.030, -0.088, -0.188]).view(1, 3, 1, 1))
        self.register_buffer("scale", torch.tensor([0.458, 0.448, 0.450]).view(1, 3, 1, 1))
        self.requires_grad_(False)

    def features(self, x01: torch.Tensor) -> list[torch.Tensor]:
        """Unit-normalised VGG features at the 5 taps of images in [0,1]."""
        h, out, start = ((2 * x01.float() - 1) - self.shift) / self.scale, [], 0
        for tap in self.taps:
            h = self.vgg[start:tap](h)
            out.append(h / (h.pow(2).sum(1, keepdim=True).sqrt() + 1e-10))
            start = tap
        return out

    def distance(self, fa: list[torch.Tensor], fb: list[torch.Tensor]) -> torch.Tensor:
        """LPIPS [B] between two images' `features`."""
        dist = torch.zeros(len(fa[0]), device=fa[0].device)
        for xa, xb, w in zip(fa, fb, self.lins):
            dist = dist + F.conv2d((xa - xb) ** 2, w).mean((1, 2, 3))
        return dist

    def forward(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return self.distance(self.features(a), self.features(b))


class Perceptual:
    """1 - DISTS or 1 - LPIPS (float64, no gradients) from a model with `features` and `distance`."""

    def __init__(self, model: DISTS | LPIPS) -> None:
        self.model = model

    @torch.no_grad()
    def __call__(self, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 1.0 - _wide(self.model(a, b))

    @torch.no_grad()
    def against(self, b: torch.Tensor) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
        """`sim(a, rows)` = self(a, b[rows]) with b's features computed once, here."""
        fb = self.model.features(b)

        def sim(a: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
            with torch.no_grad():
                return 1.0 - _wide(self.model.distance(self.model.features(a), [f[rows] for f in fb]))

        return sim


def perceptual(name: str, weights: Any, device: torch.device) -> Perceptual:
    """1 - DISTS or 1 - LPIPS from local weight files, evaluated without gradients."""
    return Perceptual({"dists": DISTS, "lpips": LPIPS}[name](load_weight_files(weights, name.upper()))
                      .to(device).eval())


def against(similarity: Similarity, b: torch.Tensor,
            cache: bool = True) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """`sim(a, rows)` = similarity(a, b[rows]) for repeated comparisons with one reference batch `b` (e.g. every
    inversion step against the input): a perceptual similarity computes b's features once (`cache=False`: at
    every call, the plain computation)."""
    if cache and hasattr(similarity, "against"):
        return similarity.against(b)
    return lambda a, rows: similarity(a, b[rows])


def build_similarity(name: str, *, classifier: Any = None, weights: Any = None,
                     device: torch.device | str = "cpu") -> Similarity:
    """The similarity `name` (one of SIMILARITIES) as a function (a, b) -> float64 [B], higher = more similar."""
    if name in ("dists", "lpips"):
        return perceptual(name, weights, torch.device(device))
    if name == "logit_l1":
        if classifier is None:
            raise ValueError("distance 'logit_l1' needs the protected classifier")
        return logit_l1(classifier)
    simple = {"ssim": ssim, "psnr": psnr, "l2": l2}
    if name not in simple:
        raise ValueError(f"unknown distance {name!r}; choose one of {SIMILARITIES}")
    return simple[name]

