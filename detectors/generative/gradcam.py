"""Grad-CAM (Selvaraju et al., 2017) of one block of a classifier for chosen classes, batched.

cam = ReLU(sum_k w_k A_k) with w_k the spatial mean of d logit_c / d A_k, bilinearly resized to the image and
min-max normalised per image to [0,1] (as pytorch-grad-cam, which DIFFGUARD's latent variant uses).
"""
from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


def last_spatial_block(model: nn.Module, run: Callable[[], object]) -> str:
    """Name of the module that last produced a 4-D feature map with more than one spatial position during `run()`."""
    seen: list[str] = []
    hooks = []
    for name, module in model.named_modules():
        if not name:
            continue

        def hook(mod: nn.Module, args: object, out: object, name: str = name) -> None:
            if isinstance(out, torch.Tensor) and out.dim() == 4 and out.shape[-1] * out.shape[-2] > 1:
                seen.append(name)

        hooks.append(module.register_forward_hook(hook))
    try:
        with torch.no_grad():
            run()
    finally:
        for h in hooks:
            h.remove()
    if not seen:
        raise ValueError(f"{type(model).__name__} has no block with a 4-D spatial output: pass gradcam_layer= "
                         "explicitly")
    return seen[-1]


def logits_and_cam(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    layer: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor | None = None,
    size: tuple[int, int] | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """(logits [B,C] detached, Grad-CAM maps [B,H,W] in [0,1] of `layer`) from ONE forward pass of `logits_fn`.

    `targets` [B] are the CAM's classes; None = the predicted ones (argmax of these logits), so the prediction and
    its CAM share the pass. `size` defaults to x's spatial size. The model's parameters get no gradients.
    """
    captured: list[torch.Tensor] = []
    handle = layer.register_forward_hook(lambda mod, args, out: captured.append(out))
    try:
        with torch.enable_grad():
            logits = logits_fn(x)
            activation = captured[-1]
            if targets is None:
                targets = logits.detach().argmax(1)
            picked = logits.gather(1, targets.view(-1, 1).to(logits.device)).sum()
            grads = torch.autograd.grad(picked, activation)[0]
    finally:
        handle.remove()
    if activation.dim() != 4:
        raise ValueError(f"Grad-CAM needs a 4-D block output [B,C,h,w], got shape {tuple(activation.shape)}")
    weights = grads.float().mean((2, 3), keepdim=True)
    cam = F.relu((weights * activation.detach().float()).sum(1, keepdim=True))
    cam = F.interpolate(cam, size=size or tuple(x.shape[-2:]), mode="bilinear", align_corners=False)[:, 0]
    low = cam.flatten(1).min(1).values.view(-1, 1, 1)
    cam = cam - low
    return logits.detach(), cam / (cam.flatten(1).max(1).values.view(-1, 1, 1) + 1e-7)


def grad_cam(
    logits_fn: Callable[[torch.Tensor], torch.Tensor],
    layer: nn.Module,
    x: torch.Tensor,
    targets: torch.Tensor,
    size: tuple[int, int] | None = None,
) -> torch.Tensor:
    """Grad-CAM maps [B,H,W] in [0,1] of `layer` for classes `targets` [B]; `logits_fn(x)` returns logits [B,C].

    `size` defaults to x's spatial size. The model's parameters get no gradients.
    """
    return logits_and_cam(logits_fn, layer, x, targets, size)[1]
