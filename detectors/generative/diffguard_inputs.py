"""The model files a DIFFGUARD configuration names, checked at plan time (nothing is loaded): the ADM UNet checkpoint
of the pixel back-end and the VGG16 / DISTS (or LPIPS) weights of its perceptual similarities."""
from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from detectors.generative.guided_diffusion import CHECKPOINT_SUFFIXES

PERCEPTUAL = ("dists", "lpips")


def missing_unet(params: Mapping[str, Any]) -> str | None:
    """Why the pixel back-end's `unet_id` cannot load, or None (a folder or hub id is left to the loader)."""
    unet = params.get("unet_id")
    if unet is None:
        return ("unet_id: none given; the pixel back-end needs the ADM 256x256 unconditional checkpoint "
                "(guided-diffusion's 256x256_diffusion_uncond.pt)")
    if Path(str(unet)).suffix in CHECKPOINT_SUFFIXES and not Path(str(unet)).is_file():
        return f"unet_id: {unet} does not exist (the ADM 256x256 unconditional checkpoint, 256x256_diffusion_uncond.pt)"
    return None


def missing_perceptual(params: Mapping[str, Any]) -> str | None:
    """Why the DISTS / LPIPS similarities the parameters use cannot load, or None."""
    uses = {params.get("distance")} | ({params.get("early_stop_similarity")} if params.get("backend") == "pixel"
                                       else set())
    uses &= set(PERCEPTUAL)
    if not uses:
        return None
    files = params.get("perceptual_weights")
    files = [files] if isinstance(files, str) else list(files or [])
    if not files:
        return (f"perceptual_weights: none given; {'/'.join(sorted(uses)).upper()} needs torchvision's VGG16 state "
                "dict "
                "(vgg16-397923af.pth) and the metric's own weights (DISTS_pytorch's weights.pt or lpips' vgg.pth)")
    absent = [str(f) for f in files if not Path(str(f)).is_file()]
    return f"perceptual_weights: {', '.join(absent)} do(es) not exist" if absent else None


def check_model_files(params: Mapping[str, Any]) -> None:
    """Raise ValueError naming every model file the (complete) DIFFGUARD parameters need and lack."""
    problems = [p for p in (missing_unet(params) if params.get("backend") == "pixel" else None,
                            missing_perceptual(params)) if p]
    if problems:
        raise ValueError("; ".join(problems) + " (docs/shiftedbronzes.md, 'DIFFGUARD inputs')")
