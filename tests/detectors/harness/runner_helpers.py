"""Helpers of the runner tests (imported by name: pytest puts this folder on sys.path)."""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image

from pipelines.data import make_row, write_manifest


def eval_config(digits: tuple[Path, Path, Path], out: Path, **extra: Any) -> dict[str, Any]:
    """A runner config on the digits data: ID digits 0-5, OOD digits 6-9 / sketch / texture."""
    id_dir, ood_dir, model = digits
    return {"model": str(model), "id": str(id_dir), "ood": [{"manifest": str(ood_dir)}], "out": str(out), **extra}


def evaluate_main():
    """The `oodforge evaluate` command module (its `main`)."""
    from oodforge.commands import evaluate

    return evaluate


def noise_image(path: Path, seed: int) -> None:
    """An 8 px random RGB image at `path` (folders made)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.fromarray(np.random.default_rng(seed).integers(0, 255, (8, 8, 3), dtype=np.uint8)).save(path)


def id_ood_manifests(root: Path) -> tuple[Path, Path]:
    """An ID manifest (train/val/test, 2 classes) and an OOD manifest (test sets near and far, val rows of set near,
    named like the test set as Open-Insects' local val and local test) under `root`."""
    id_rows, ood_rows = [], []
    for i in range(12):
        split = ("train", "val", "test")[i % 3]
        noise_image(root / "id" / f"{split}_{i}.png", i)
        id_rows.append(make_row(f"{split}_{i}.png", split=split, role="id", label=i % 2, class_name=f"c{i % 2}"))
    for i in range(8):
        name = ("near", "far")[i % 2]
        noise_image(root / "ood" / f"{name}_{i}.png", 100 + i)
        ood_rows.append(make_row(f"{name}_{i}.png", split="test", role="ood", ood_set=name, group=name))
    for i in range(3):
        noise_image(root / "ood" / f"val_near_{i}.png", 200 + i)
        ood_rows.append(make_row(f"val_near_{i}.png", split="val", role="ood", ood_set="near", group="near"))
    write_manifest(root / "id", id_rows)
    write_manifest(root / "ood", ood_rows)
    return root / "id", root / "ood"


def run_cache(plan: Any, role: str, name: str) -> tuple[Any, Any]:
    """(the feature cache a finished run of `plan` wrote for its split (`role`, `name`), that split). An oracle that
    scores these arrays sees the run's inputs bit for bit; re-extracted features agree only up to the kernels'
    batch-size and thread choices, which a trained head amplifies into flipped AUROC pairs."""
    from pipelines.features import FeatureCache

    [split] = [s for s in plan.splits if (s.role, s.name) == (role, name)]
    [path] = (plan.cache_dir).glob(f"{split.id}-*.safetensors")
    return FeatureCache.load(path), split
