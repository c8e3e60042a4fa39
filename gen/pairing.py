"""Who is transferred onto whom: generation plans for material transfer, with label inheritance.

A plan is a list of `PlanItem`s (target image, material exemplar, the labels the output inherits, the output's file
name), deterministic for a seed. Tasks (REFERENCE.md "ShiftedBronzes data generation"):

- `transferred_container`: bronze exemplars (materials) onto container photos (targets); every container is used once
  and the exemplars are spread evenly over them (use counts differ by at most one); outputs inherit the bronze's labels.
- `transferred_bronze`: container exemplars onto bronze targets; every container is used once as the exemplar and the
  bronze targets are spread evenly over them (51,023 outputs on 2,861 bronzes in the paper, 17-18 per bronze); outputs
  inherit the container's labels (its category).
- `custom`: any material folder onto any target set, `per_target` distinct exemplars per target.
"""
from __future__ import annotations

import os
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.data import METADATA, REQUIRED, Manifest, open_image_source
from pipelines.errors import ConfigError

TASKS = ("transferred_container", "transferred_bronze", "custom")
INHERIT = ("material", "target", "none")
COVER = ("targets", "materials")  # which side is used exactly (per_target) once; the other is dealt balanced
OUTPUT_FOLDER = "images"
NOT_INHERITED = frozenset(REQUIRED) | {"provenance"}


@dataclass
class PlanItem:
    """One planned output: `index` is its global position in the plan (seeds derive from it)."""

    index: int
    target: str
    material: str
    target_row: dict[str, Any]
    material_row: dict[str, Any]
    labels: dict[str, Any]
    output: str

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_source(folder: str | os.PathLike, what: str) -> Manifest:
    """A manifest folder, or a plain image folder read as one (a first-level subfolder name becomes `category`; its
    rows carry no class label, so nothing but `category` is inherited from them)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"{what} folder not found: {root}")
    source = open_image_source(root, role="ood", ood_set=root.name)
    if not (root / METADATA).is_file():
        for row in source.rows:
            parts = Path(row["file_name"]).parts
            if len(parts) > 1:
                row["category"] = parts[0]
    if not source.rows:
        raise ConfigError(f"{what} folder {root} holds no images")
    return source


def inherited_labels(row: dict[str, Any]) -> dict[str, Any]:
    """The labels an output takes from a source row: its free metadata, plus `source_label` for an ID row's class."""
    labels = {k: v for k, v in row.items() if k not in NOT_INHERITED}
    if row.get("role") == "id" and isinstance(row.get("label"), int) and row["label"] >= 0:
        labels["source_label"] = row["label"]
    return labels


def balanced_pairs(n_targets: int, n_materials: int, per_target: int, seed: int) -> np.ndarray:
    """(target, material) index pairs [n_targets * per_target, 2] in dealing order: targets in a seeded random order,
    each dealt its next `per_target` materials round-robin from a seeded random order. Every prefix is balanced (use
    counts differ by at most one) and a target's exemplars are distinct when `per_target <= n_materials`."""
    if n_targets < 0 or n_materials <= 0:
        raise ConfigError(f"need at least one material (got {n_materials}) and a non-negative target count")
    if per_target < 1:
        raise ConfigError(f"per_target must be >= 1, got {per_target}")
    if per_target > n_materials:
        raise ConfigError(f"per_target={per_target} exceeds the {n_materials} available material images")
    rng = np.random.default_rng(seed)
    target_order = rng.permutation(n_targets)
    material_order = rng.permutation(n_materials)
    deal = np.arange(n_targets * per_target)
    return np.stack([target_order[deal // per_target], material_order[deal % n_materials]], axis=1)


def output_name(index: int, target_row: dict[str, Any], material_row: dict[str, Any]) -> str:
    """`images/<index>_<target stem>__<material stem>.png`, unique through the index."""
    def stem(row: dict[str, Any]) -> str:
        return re.sub(r"[^A-Za-z0-9._-]+", "-", Path(row["file_name"]).stem)[:40]

    return f"{OUTPUT_FOLDER}/{index:07d}_{stem(target_row)}__{stem(material_row)}.png"


def make_plan(targets: Manifest, materials: Manifest, *, per_target: int = 1, seed: int = 0, inherit: str = "material",
              limit: int | None = None, cover: str = "targets") -> list[PlanItem]:
    """Pair every target with `per_target` balanced material exemplars, in dealing order (see `balanced_pairs`).

    `cover="materials"` swaps the roles: every material is used once and the targets are dealt balanced over them
    (a target's exemplars are distinct); `per_target` must then be 1. `inherit` picks whose labels the output carries
    (`material`, `target` or `none`); `limit` keeps the first items, a seeded random subset of the covered side with
    balanced use of the other.
    """
    if inherit not in INHERIT:
        raise ConfigError(f"inherit must be one of {INHERIT}, got {inherit!r}")
    if cover not in COVER:
        raise ConfigError(f"cover must be one of {COVER}, got {cover!r}")
    if limit is not None and limit < 0:
        raise ConfigError(f"limit must be >= 0 or null, got {limit}")
    if cover == "targets":
        pairs = balanced_pairs(len(targets), len(materials), per_target, seed)
    elif per_target != 1:
        raise ConfigError(f"cover='materials' uses every material once; per_target must be 1, got {per_target}")
    elif not len(targets):
        raise ConfigError("cover='materials' needs at least one target image")
    else:
        pairs = balanced_pairs(len(materials), len(targets), 1, seed)[:, ::-1]
    if limit is not None:
        pairs = pairs[:limit]
    items: list[PlanItem] = []
    for index, (t, m) in enumerate(pairs.tolist()):
        target_row, material_row = targets.rows[t], materials.rows[m]
        source = {"material": material_row, "target": target_row, "none": {}}[inherit]
        items.append(PlanItem(
            index=index,
            target=str(targets.path(target_row)),
            material=str(materials.path(material_row)),
            target_row=target_row,
            material_row=material_row,
            labels=inherited_labels(source),
            output=output_name(index, target_row, material_row),
        ))
    return items


def plan_task(task: str, targets: Manifest, materials: Manifest, *, per_target: int = 1, seed: int = 0,
              inherit: str | None = None, limit: int | None = None) -> list[PlanItem]:
    """The plan of a named task. The two ShiftedBronzes tasks inherit the material's labels: `transferred_container`
    covers the targets (each container once, bronze exemplars balanced), `transferred_bronze` covers the materials
    (each container exemplar once, bronze targets balanced). `custom` honours `per_target` and `inherit` (default
    `material`) and covers the targets."""
    if task not in TASKS:
        raise ConfigError(f"task must be one of {TASKS}, got {task!r}")
    if task != "custom":
        if per_target != 1:
            raise ConfigError(f"task {task!r} pairs each image once (per_target=1); use task 'custom' for "
                              f"per_target={per_target}")
        if inherit not in (None, "material"):
            raise ConfigError(f"task {task!r} inherits the material's labels; use task 'custom' for "
                              f"inherit={inherit!r}")
    return make_plan(targets, materials, per_target=per_target, seed=seed, inherit=inherit or "material", limit=limit,
                     cover=covered_side(task))


def covered_side(task: str) -> str:
    """The side a task uses exactly once: `materials` for `transferred_bronze` (each container once), else `targets`."""
    return "materials" if task == "transferred_bronze" else "targets"


def use_counts(plan: list[PlanItem]) -> dict[str, int]:
    """How many outputs use each material exemplar (materials never used are absent)."""
    counts: dict[str, int] = {}
    for item in plan:
        counts[item.material] = counts.get(item.material, 0) + 1
    return counts
