"""The plan of a generation job, kept stable across reruns.

A job's items are indexed (the index names the output and seeds it), so a rerun must never give an index to another
(target, material) pair. The first run stores the full plan (no `limit`) in `out/.job/plan.json`: the input lists and
the (target, material) pairs, with a hash of the pairs (`plan_hash`, also in job.json). A rerun whose inputs are
unchanged uses the stored pairs. When a target or material was added or removed, the job is refused with the changes
named (`plan_change: refuse`, the default), or extended (`plan_change: extend`): every stored item keeps its index and
pair (an item whose input is gone fails with "file not found"), and the inputs added on the side the task covers
once (the targets; the materials for `transferred_bronze`) are planned among themselves over the other side's current
inputs and appended after the stored items.

An input is a `pipelines.sources.Source`: a folder (a manifest or plain images: every row) or a mapping `{manifest: DIR,
split: test, sets: [...]}` that keeps the rows of one split (`split: null` or `all`: every split, the default of a
generation input) and, optionally, of the named `ood_set`s, so that train and val images cannot become generated test
data. Inputs are read leniently: a manifest line that breaks
the schema, or repeats a file name, is skipped and reported (file, line, field, reason) instead of stopping the job.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from gen.pairing import PlanItem, covered_side, inherited_labels, load_source, output_name, plan_task
from pipelines.data import METADATA, Manifest, ManifestError, _image_root, make_row, manifest_lines
from pipelines.errors import ConfigError, UserInputError
from pipelines.io import atomic_write_json
from pipelines.sources import Source

PLAN_FILE = "plan.json"
SHOWN_NAMES = 5


class PlanChangedError(UserInputError):
    """The inputs of a job changed since its plan was stored; the message names what was added and removed."""


@dataclass
class JobPlan:
    """The items to run (after `limit`), the full pair list to store, and the input lines that were skipped."""

    items: list[PlanItem]
    pairs: list[tuple[str, str]]
    targets: list[str]
    materials: list[str]
    skipped_inputs: list[dict[str, Any]] = field(default_factory=list)
    extended: int = 0  # items appended to the stored plan by this run
    warnings: list[str] = field(default_factory=list)  # inputs read whole although they hold train / val rows

    @property
    def plan_hash(self) -> str:
        return plan_hash(self.pairs)

    def to_json(self) -> dict[str, Any]:
        return {"plan_hash": self.plan_hash, "targets": self.targets, "materials": self.materials,
                "pairs": [list(pair) for pair in self.pairs]}


def plan_hash(pairs: list[tuple[str, str]]) -> str:
    """sha256 (16 hex) of the ordered (target file_name, material file_name) pairs."""
    text = "\n".join(f"{target}\t{material}" for target, material in pairs)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def read_source(spec: Source, what: str) -> tuple[Manifest, list[dict[str, Any]]]:
    """The rows of an input kept by its split (`split: null`: every split) and sets, and the manifest lines skipped
    as bad."""
    manifest, skipped = _read_folder(spec.manifest, what)
    split = spec.read_split(None)
    if split is None and spec.sets is None:
        return manifest, skipped
    kept = manifest.select(**({} if split is None else {"split": split}),
                           **({} if spec.sets is None else {"ood_set": list(spec.sets)}))
    if not kept.rows:
        wanted = " and ".join(([f"split {split!r}"] if split else [])
                              + ([f"ood_set in {list(spec.sets)}"] if spec.sets else []))
        there = ", ".join(sorted(manifest.ood_sets())) or "none"
        raise ConfigError(f"{what}: no row of {spec.manifest} with {wanted} (sets there: {there}; splits there: "
                          f"{', '.join(sorted({row['split'] for row in manifest.rows}))})")
    return kept, skipped


def _read_folder(folder: str | os.PathLike, what: str) -> tuple[Manifest, list[dict[str, Any]]]:
    """`gen.pairing.load_source`, except that a manifest's bad or duplicate lines are skipped and returned as records
    `{"file", "line", "field", "reason"}`."""
    root = Path(folder)
    try:
        return load_source(root, what), []
    except ManifestError:
        pass
    meta = root / METADATA
    rows: list[dict[str, Any]] = []
    skipped: list[dict[str, Any]] = []
    for _, row in manifest_lines(meta):
        if isinstance(row, ManifestError):
            skipped.append({"file": row.file, "line": row.line, "field": row.field, "reason": str(row)})
        else:
            rows.append(row)
    if not rows:
        raise ConfigError(f"{what} manifest {meta} holds no valid line ({len(skipped)} skipped)")
    return Manifest(_image_root(root), rows), skipped


def items_from_pairs(pairs: list[tuple[str, str]], targets: Manifest, materials: Manifest, inherit: str,
                     start: int = 0) -> list[PlanItem]:
    """Plan items for stored pairs (indices from `start`); an input absent from the manifests keeps its path and no
    labels."""
    target_rows = {row["file_name"]: row for row in targets.rows}
    material_rows = {row["file_name"]: row for row in materials.rows}
    items = []
    for offset, (target_name, material_name) in enumerate(pairs):
        index = start + offset
        present = target_name in target_rows and material_name in material_rows
        target_row = target_rows.get(target_name) or make_row(target_name, role="ood", ood_set="removed")
        material_row = material_rows.get(material_name) or make_row(material_name, role="ood", ood_set="removed")
        source = {"material": material_row, "target": target_row, "none": {}}[inherit]
        labels = inherited_labels(source) if present else {}
        items.append(PlanItem(index=index, target=str(targets.path(target_row)),
                              material=str(materials.path(material_row)),
                              target_row=target_row, material_row=material_row, labels=labels,
                              output=output_name(index, target_row, material_row)))
    return items


def _names(rows: list[dict[str, Any]]) -> list[str]:
    return [row["file_name"] for row in rows]


def _describe(kind: str, before: list[str], now: list[str]) -> list[str]:
    old, new = set(before), set(now)
    lines = []
    for verb, names in (("added", [n for n in now if n not in old]), ("removed", [n for n in before if n not in new])):
        if names:
            shown = (", ".join(names[:SHOWN_NAMES])
                     + (f", ... ({len(names)} in all)" if len(names) > SHOWN_NAMES else ""))
            lines.append(f"{kind} {verb}: {shown}")
    if not lines and before != now:
        lines.append(f"{kind}: the same files in a different order")
    return lines


def read_stored(job_folder: Path) -> dict[str, Any] | None:
    path = job_folder / PLAN_FILE
    if not path.is_file():
        return None
    stored = json.loads(path.read_text(encoding="utf-8"))
    stored["pairs"] = [tuple(pair) for pair in stored["pairs"]]
    if plan_hash(stored["pairs"]) != stored.get("plan_hash"):
        raise ConfigError(f"{path}: its pairs do not match its plan_hash (the file was edited); restore it or use a "
                          f"new 'out' folder")
    return stored


def build_plan(task: str, targets_source: Source, materials_source: Source, job_folder: Path, *,
               per_target: int = 1, seed: int = 0, inherit: str | None = None, limit: int | None = None,
               plan_change: str = "refuse", stored_plan: bool = True) -> JobPlan:
    """The job's plan: the stored one when the inputs are unchanged, else refused or extended (module docstring).
    `stored_plan=False` plans afresh, ignoring a stored plan (a job that never finished an item)."""
    targets, skipped_targets = read_source(targets_source, "targets")
    materials, skipped_materials = read_source(materials_source, "materials")
    target_names, material_names = _names(targets.rows), _names(materials.rows)
    stored = read_stored(job_folder) if stored_plan else None
    extended = 0
    if stored is None:
        items = plan_task(task, targets, materials, per_target=per_target, seed=seed, inherit=inherit)
        pairs = [(item.target_row["file_name"], item.material_row["file_name"]) for item in items]
    else:
        pairs = list(stored["pairs"])
        items = items_from_pairs(pairs, targets, materials, inherit or "material")
        if stored["targets"] != target_names or stored["materials"] != material_names:
            if plan_change == "refuse":
                raise PlanChangedError(_refusal(job_folder, stored, target_names, material_names))
            new = _extension(task, stored, targets, materials, per_target=per_target, seed=seed + len(pairs),
                             inherit=inherit, start=len(pairs))
            items += new
            pairs += [(item.target_row["file_name"], item.material_row["file_name"]) for item in new]
            extended = len(new)
    if limit is not None:
        items = items[:limit]
    warnings = [line for source, manifest, what in ((targets_source, targets, "targets"),
                                                    (materials_source, materials, "materials"))
                if (line := mixed_splits_warning(source, manifest, what))]
    return JobPlan(items, pairs, target_names, material_names, skipped_targets + skipped_materials, extended, warnings)


def mixed_splits_warning(spec: Source, manifest: Manifest, what: str) -> str | None:
    """A warning when an input read whole (no split, no sets) holds train or val rows (all of them are used then)."""
    if spec.read_split(None) is not None or spec.sets is not None:
        return None
    other = sum(row["split"] != "test" for row in manifest.rows)
    if not other:
        return None
    return (f"{what}: {spec.manifest} holds {other} train/val row(s) of {len(manifest.rows)}, all used; write "
            f"{{manifest: {spec.manifest}, split: test}} to use its test rows only")


def _refusal(job_folder: Path, stored: dict[str, Any], target_names: list[str], material_names: list[str]) -> str:
    changes = _describe("targets", stored["targets"], target_names) + _describe("materials", stored["materials"],
                                                                               material_names)
    return (f"the inputs of the job in {job_folder.parent} changed since its plan was made ({'; '.join(changes)}). "
            f"Rerunning would give planned indices to other pairs. Restore the inputs, set plan_change=extend to "
            f"keep every planned item and append the added inputs, or use a new 'out' folder")


def _extension(task: str, stored: dict[str, Any], targets: Manifest, materials: Manifest, *, per_target: int,
               seed: int, inherit: str | None, start: int) -> list[PlanItem]:
    """Items for the inputs added on the covered side (`gen.pairing.covered_side`), indexed from `start`: added
    targets over the current materials, or (`transferred_bronze`) added materials over the current targets."""
    if covered_side(task) == "targets":
        planned = {target for target, _ in stored["pairs"]} | set(stored["targets"])
        targets = Manifest(targets.root, [row for row in targets.rows if row["file_name"] not in planned])
        if not targets.rows:
            return []
    else:
        planned = {material for _, material in stored["pairs"]} | set(stored["materials"])
        materials = Manifest(materials.root, [row for row in materials.rows if row["file_name"] not in planned])
        if not materials.rows:
            return []
    new = plan_task(task, targets, materials, per_target=per_target, seed=seed, inherit=inherit)
    return [replace(item, index=start + i, output=output_name(start + i, item.target_row, item.material_row))
            for i, item in enumerate(new)]


def store_plan(job_folder: Path, plan: JobPlan) -> None:
    """Write `plan.json` atomically (main process, before any item runs)."""
    atomic_write_json(job_folder / PLAN_FILE, plan.to_json())
