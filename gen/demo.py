"""Demo stage of generation: a few target and material images, one ZeST job with tiny random-weight models.

Targets are object photos and materials are textures from scikit-image's bundled sample data (no download); without
scikit-image, synthetic images stand in. The tiny models make noise-like images: the demo shows the plumbing
(pairing, label inheritance, manifest, provenance, contact sheet), not the visual result of real ZeST.
"""
from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from gen.job import GenerationConfig, run_generation
from pipelines.io import atomic_save_image

TARGETS = ("coffee", "rocket", "chelsea", "astronaut")
MATERIALS = ("brick", "grass", "gravel")
INPUT_SIZE = 96


def _skimage_images(names: tuple[str, ...]) -> dict[str, np.ndarray] | None:
    try:
        from skimage import data
    except ImportError:
        return None
    return {name: getattr(data, name)() for name in names}


def _synthetic_images(names: tuple[str, ...], seed: int) -> dict[str, np.ndarray]:
    """Stand-ins: a bright disc on a gradient (targets) or a seeded noise texture (materials)."""
    rng = np.random.default_rng(seed)
    y, x = np.mgrid[0:INPUT_SIZE, 0:INPUT_SIZE] / INPUT_SIZE
    images = {}
    for i, name in enumerate(names):
        if seed == 0:
            disc = ((x - 0.5) ** 2 + (y - 0.5) ** 2 < 0.08 + 0.03 * i)[..., None]
            background = np.stack([x, y, 1 - x], axis=-1) * 160
            images[name] = np.where(disc, np.array([230, 200 - 50 * i, 120]), background).astype(np.uint8)
        else:
            images[name] = rng.integers(40, 220, (INPUT_SIZE, INPUT_SIZE, 3), dtype=np.uint8)
    return images


def _write(images: dict[str, np.ndarray], path_of: Callable[[str], Path]) -> None:
    for name, array in images.items():
        image = Image.fromarray(array).convert("RGB")
        image.thumbnail((INPUT_SIZE, INPUT_SIZE))
        atomic_save_image(path_of(name), image)


def generation_demo(out_dir: str | os.PathLike, batch_size: int = 4) -> dict[str, Any]:
    """Write demo inputs under `out_dir/inputs`, run a tiny-model ZeST job (64 px, 2 steps) into `out_dir/generated`.

    Each target gets one texture exemplar (balanced over the textures); a material's subfolder name becomes its
    `category`, which the outputs inherit. Returns the manifest path, the contact sheet path and the job summary.
    """
    out_dir = Path(out_dir)
    targets, materials = out_dir / "inputs" / "targets", out_dir / "inputs" / "materials"
    _write(_skimage_images(TARGETS) or _synthetic_images(TARGETS, seed=0), lambda n: targets / f"{n}.png")
    _write(_skimage_images(MATERIALS) or _synthetic_images(MATERIALS, seed=1), lambda n: materials / n / f"{n}.png")
    config = GenerationConfig.from_dict(dict(
        task="custom", name="demo_transfer", targets=str(targets), materials=str(materials),
        out=str(out_dir / "generated"), models="tiny", resolution=64, num_inference_steps=2, batch_size=batch_size,
        seed=0, precision="fp32"))
    summary = run_generation(config)
    return {"manifest": summary["manifest"], "contact_sheet": summary["contact_sheet"], "summary": summary}
