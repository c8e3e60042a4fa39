"""DIFFGUARD's pixel-space back-end: respaced DDIM with batched adaptive early stop and classifier guidance.

Conventions follow guided-diffusion (which DIFFGUARD builds on): a respaced schedule of S steps has indices k = 0..S-1
with cumulative alphas abar_k = abar[timesteps[k]]; the input image enters inversion at index 0; inversion step k maps
index k to k+1 (abar_S = 0); denoising step k maps index k to k-1 (abar_-1 = 1). Images are in [-1, 1].

Batching: every sample keeps its own step index. Inversion runs all unfinished samples together and freezes a sample
at the first step its stop rule fires; denoising walks k from the largest start index down to 0 and updates only the
samples whose start index is >= k. The model sees only the active rows, so a batch costs what its samples cost alone.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from pipelines.progress import progress as progress_bar


def linear_alphas_cumprod(num_train_timesteps: int = 1000, beta_start: float = 1e-4,
                          beta_end: float = 0.02) -> np.ndarray:
    """Cumulative products of (1 - beta) for the linear beta schedule (float64), ADM / DDPM defaults."""
    betas = np.linspace(beta_start, beta_end, num_train_timesteps, dtype=np.float64)
    return np.cumprod(1.0 - betas)


def ddim_respacing(num_train_timesteps: int, steps: int) -> np.ndarray:
    """guided-diffusion's "ddimN" respacing: every (T // N)-th training timestep starting at 0."""
    if not 0 < steps <= num_train_timesteps:
        raise ValueError(f"steps must be in 1..{num_train_timesteps}, got {steps}")
    stride = num_train_timesteps // steps
    return np.arange(0, num_train_timesteps, stride)[:steps]


@dataclass
class PixelDiffusion:
    """An unconditional epsilon-prediction UNet (`UNet2DModel`; learned-sigma outputs: first 3 channels) on a
    respaced DDIM schedule. `dtype` is the model's compute dtype; the state is kept in float32."""

    unet: nn.Module
    timesteps: torch.Tensor  # [S] long, training timesteps of the respaced indices
    alphas_cumprod: torch.Tensor  # [S] float64 abar of the respaced indices
    clip_denoised: bool = True
    dtype: torch.dtype = torch.float32

    @classmethod
    def build(cls, unet: nn.Module, steps: int = 100, num_train_timesteps: int = 1000, beta_start: float = 1e-4,
              beta_end: float = 0.02, clip_denoised: bool = True,
              dtype: torch.dtype = torch.float32) -> PixelDiffusion:
        abar = linear_alphas_cumprod(num_train_timesteps, beta_start, beta_end)
        ts = ddim_respacing(num_train_timesteps, steps)
        return cls(unet, torch.from_numpy(ts).long(), torch.from_numpy(abar[ts]), clip_denoised, dtype)

    @property
    def steps(self) -> int:
        return len(self.timesteps)

    def abar(self, k: int) -> float:
        """abar at respaced index k, with abar_-1 = 1 and abar_S = 0."""
        if k < 0:
            return 1.0
        if k >= self.steps:
            return 0.0
        return float(self.alphas_cumprod[k])

    def eps(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """The model's noise prediction at respaced index k (float32)."""
        t = self.timesteps[k].to(x.device).expand(len(x))
        out = self.unet(x.to(self.dtype), t).sample
        return out[:, : x.shape[1]].float()

    def x0_from_eps(self, x: torch.Tensor, eps: torch.Tensor, k: int) -> torch.Tensor:
        a = self.abar(k)
        return (x - (1 - a) ** 0.5 * eps) / a**0.5

    def eps_from_x0(self, x: torch.Tensor, x0: torch.Tensor, k: int) -> torch.Tensor:
        a = self.abar(k)
        return (x - a**0.5 * x0) / (1 - a) ** 0.5

    @torch.no_grad()
    def invert_step(self, x: torch.Tensor, k: int) -> torch.Tensor:
        """Deterministic DDIM inversion from index k to k+1 (eps re-derived from the clipped x0 for k > 0)."""
        eps = self.eps(x, k)
        if k > 0 and self.clip_denoised:
            eps = self.eps_from_x0(x, self.x0_from_eps(x, eps, k).clamp(-1, 1), k)
        x0 = self.x0_from_eps(x, eps, k)
        a_next = self.abar(k + 1)
        return a_next**0.5 * x0 + (1 - a_next) ** 0.5 * eps

    def denoise_step(self, x: torch.Tensor, k: int, guidance: Callable[..., torch.Tensor] | None = None,
                     guided: torch.Tensor | None = None) -> torch.Tensor:
        """DDIM (eta 0) from index k to k-1. `guidance(x_t, x0_hat, k, rows) -> grad` shifts eps of the `guided`
        rows (bool [n]) by -sqrt(1 - abar_k) * grad (Song et al.'s conditioning of the score)."""
        with torch.no_grad():
            eps = self.eps(x, k)
            x0_hat = self.x0_from_eps(x, eps, k)
            x0 = x0_hat.clamp(-1, 1) if self.clip_denoised else x0_hat
            eps = self.eps_from_x0(x, x0, k)
        if guidance is not None and guided is not None and guided.any():
            rows = guided.nonzero().view(-1)
            grad = guidance(x[rows], x0_hat[rows], k, rows)
            eps = eps.clone()
            eps[rows] = eps[rows] - (1 - self.abar(k)) ** 0.5 * grad
            x0 = x0.clone()
            x0[rows] = self.x0_from_eps(x[rows], eps[rows], k)
        a_prev = self.abar(k - 1)
        return a_prev**0.5 * x0 + (1 - a_prev) ** 0.5 * eps


def invert_with_early_stop(model: PixelDiffusion, x0: torch.Tensor, max_steps: int,
                           stop_rule: Callable[[torch.Tensor, torch.Tensor], torch.Tensor] | None,
                           progress: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """DDIM-invert a batch; each sample stops after the first step k where `stop_rule(x_{k+1}, rows)` is True (or
    after `max_steps` steps). `rows` [n] indexes the batch rows of x_{k+1} (the unfinished samples), so the rule can
    compare with what it precomputed for x0. Returns (latents [B,...], stop step k [B] long)."""
    if not 0 < max_steps <= model.steps:
        raise ValueError(f"max_inversion_steps must be in 1..{model.steps}, got {max_steps}")
    x = x0.clone()
    stop = torch.full((len(x0),), max_steps - 1, dtype=torch.long)
    active = torch.arange(len(x0), device=x0.device)
    for k in progress_bar(range(max_steps), desc="diffguard inversion", leave=False, disable=not progress):
        x_new = model.invert_step(x[active], k)
        x[active] = x_new
        if stop_rule is None or k == max_steps - 1:
            continue
        done = stop_rule(x_new, active).to(x0.device)
        stop[active[done].cpu()] = k
        active = active[~done]
        if len(active) == 0:
            break
    return x, stop


def denoise_from(model: PixelDiffusion, x_start: torch.Tensor, start: torch.Tensor,
                 guidance: Callable[..., torch.Tensor] | None = None, guided: torch.Tensor | None = None,
                 progress: bool = False) -> torch.Tensor:
    """Denoise each sample from its own respaced index `start` [B] down to 0; `guided` (bool [B]) marks rows that get
    `guidance` (its `rows` argument indexes this batch)."""
    x = x_start.clone()
    start = start.to(x.device)
    top = int(start.max())
    for k in progress_bar(range(top, -1, -1), desc="diffguard denoising", leave=False, disable=not progress):
        active = (start >= k).nonzero().view(-1)
        sub_guided = guided[active] if guided is not None else None
        sub_guidance = (None if guidance is None
                        else (lambda xt, x0h, kk, rows, a=active: guidance(xt, x0h, kk, a[rows])))
        x[active] = model.denoise_step(x[active], k, sub_guidance, sub_guided)
    return x


def nearest_indices(size: int, out: int, device: torch.device | None = None) -> torch.Tensor:
    """Source indices of `F.interpolate(..., size=out, mode="nearest")` along an axis of length `size`:
    min(floor(j * (size / out)), size - 1), in float32 as PyTorch's kernels compute them."""
    scale = torch.tensor(float(size), dtype=torch.float32) / out
    idx = (torch.arange(out, dtype=torch.float32) * scale).floor().long().clamp(max=size - 1)
    return idx.to(device) if device is not None else idx


def random_crops(x: torch.Tensor, n: int, crop_size: int, generators: list[torch.Generator]) -> torch.Tensor:
    """DIFFGUARD's cutouts: `n` random square crops per image, side int(u * (short - low) + low) with u ~ U[0,1),
    low = min(short side, crop_size), uniform offsets, each resampled to crop_size x crop_size by nearest
    interpolation: [B*n,C,crop,crop], sample-major. Draws (side, x offset, y offset) per crop from the sample's
    generator. One differentiable gather for the whole batch."""
    b, _, height, width = x.shape
    short = min(height, width)
    low = min(short, crop_size)
    rows, cols = [], []
    for gen in generators:
        for _ in range(n):
            side = int(torch.rand((), generator=gen) * (short - low) + low)
            ox = int(torch.randint(0, width - side + 1, (), generator=gen))
            oy = int(torch.randint(0, height - side + 1, (), generator=gen))
            idx = nearest_indices(side, crop_size)
            rows.append(oy + idx)
            cols.append(ox + idx)
    sample = torch.arange(b, device=x.device).repeat_interleave(n).view(-1, 1, 1)
    r = torch.stack(rows).to(x.device)[:, :, None]
    c = torch.stack(cols).to(x.device)[:, None, :]
    return x[sample, :, r, c].permute(0, 3, 1, 2)  # advanced indices first: [B*n, crop, crop, C]


@dataclass
class ClassifierGuidance:
    """grad_x log p(y | crops(x_in)) * scale, summed over `n_crops` random crops (`random_crops`, side `crop_size` =
    the classifier's input), where x_in is the "clean grad" blend
    x0_hat * sqrt(1 - abar_k) + x_t * (1 - sqrt(1 - abar_k)) (or x_t itself when `clean_grad` is False).

    `grad_wrt="blend"` differentiates with respect to the blend (DIFFGUARD's code); `"x_t"` backpropagates through
    the UNet's x0_hat to x_t (costs one extra UNet pass with gradients per guided step).
    """

    model: PixelDiffusion
    classifier: nn.Module
    labels: torch.Tensor  # [B] target class per row of the denoised batch
    generators: list[torch.Generator]  # one per row of the denoised batch
    scale: float = 3.0
    n_crops: int = 8
    crop_size: int = 224
    clean_grad: bool = True
    grad_wrt: str = "blend"

    def __post_init__(self) -> None:
        if self.grad_wrt not in ("blend", "x_t"):
            raise ValueError(f"guidance_grad must be 'blend' or 'x_t', got {self.grad_wrt!r}")

    def log_prob(self, x_in: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
        """Sum over rows and crops of log p(label | crop) for images x_in in [-1, 1]."""
        gens = [self.generators[int(r)] for r in rows]
        crops = random_crops((x_in + 1) / 2, self.n_crops, self.crop_size, gens)
        logits, _ = self.classifier.forward_images(crops.to(self.classifier.head.weight.dtype))
        labels = self.labels.to(logits.device)[rows.to(logits.device)].repeat_interleave(self.n_crops)
        return F.log_softmax(logits.float(), dim=-1).gather(1, labels.view(-1, 1)).sum()

    def __call__(self, x_t: torch.Tensor, x0_hat: torch.Tensor, k: int, rows: torch.Tensor) -> torch.Tensor:
        fac = (1 - self.model.abar(k)) ** 0.5
        with torch.enable_grad():
            if self.grad_wrt == "x_t":
                leaf = x_t.detach().requires_grad_(True)
                x0_hat = self.model.x0_from_eps(leaf, self.model.eps(leaf, k), k)
                x_in = x0_hat * fac + leaf * (1 - fac) if self.clean_grad else leaf
            else:
                base = (x0_hat * fac + x_t * (1 - fac)) if self.clean_grad else x_t
                leaf = x_in = base.detach().requires_grad_(True)
            grad = torch.autograd.grad(self.log_prob(x_in, rows), leaf)[0]
        return grad.float() * self.scale
