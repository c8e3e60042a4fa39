"""Generated image-folder trees and a tiny stand-in for `microsoft/resnet-50` in a fake offline hub cache."""
from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image

COLOURS = {"ant": (200, 40, 40), "bee": (40, 200, 40), "cat": (40, 40, 200)}
SNAPSHOT = "0123456789abcdef0123456789abcdef01234567"


def png(path: Path, colour: tuple[int, int, int], rng: np.random.Generator, size: tuple[int, int] = (40, 48)) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.clip(np.array(colour)[None, None] + rng.integers(-30, 30, (*size, 3)), 0, 255).astype(np.uint8)
    Image.fromarray(pixels).save(path)


def class_tree(root: Path, counts: dict[str, int], seed: int = 0) -> Path:
    """root/{split}/<class>/<i>.png with `counts[split]` images a class, coloured by class."""
    rng = np.random.default_rng(seed)
    for split, n in counts.items():
        for name, colour in COLOURS.items():
            for i in range(n):
                png(root / split / name / f"{i}.png", colour, rng)
    return root


def ood_tree(root: Path, sets: tuple[str, ...] = ("moths", "rocks"), n: int = 4, seed: int = 1) -> Path:
    rng = np.random.default_rng(seed)
    for k, name in enumerate(sets):
        for i in range(n):
            png(root / name / f"{i}.png", (120 + 40 * k, 120, 60), rng)
    return root


def fake_hub_cache(cache: Path, model_id: str = "microsoft/resnet-50") -> Path:
    """An offline hub cache (HF_HUB_CACHE) whose `model_id` is the tiny random-weight stand-in of pipelines.tiny."""
    from pipelines.tiny import save_tiny_model

    repo = cache / f"models--{model_id.replace('/', '--')}"
    save_tiny_model(repo / "snapshots" / SNAPSHOT, model_id)
    (repo / "refs").mkdir(parents=True, exist_ok=True)
    (repo / "refs" / "main").write_text(SNAPSHOT)
    return cache
