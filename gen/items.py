"""One batch of a generation job: prepare each item alone (load, size check, mask), call the pipeline, write each
image atomically and fsync'ed, then its ledger record. Whatever one item's inputs raise is that item's failed record;
a model error is retried one item at a time to blame the right item."""
from __future__ import annotations

import os
import warnings
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import cv2
from PIL import Image

from gen.config import GenerationConfig
from gen.ledger import DONE, FAILED, Ledger
from gen.masks import MIN_SIDE, MaskError, MaskWarning, check_coverage, foreground_mask, is_empty, load_mask
from gen.pairing import PlanItem
from pipelines.data import ImageLoadError, list_images, load_image, make_row
from pipelines.io import atomic_path
from pipelines.store import image_path

PIPELINE_NAME = "zest"
ITEM_ERRORS = (ValueError, OSError, IndexError, cv2.error)  # from a model call: blamed on the batch's items


def mask_index(folder: str | os.PathLike | None) -> dict[str, list[Path]] | None:
    """Mask files keyed by relative path without suffix (a target `a/b.jpg` uses mask `a/b.*`)."""
    if folder is None:
        return None
    root = Path(folder)
    index: dict[str, list[Path]] = {}
    for path in list_images(root):
        index.setdefault(path.relative_to(root).with_suffix("").as_posix(), []).append(path)
    return index


def is_done(record: dict[str, Any] | None, out: Path) -> bool:
    return bool(record) and record.get("status") == DONE and (out / record["output"]).is_file()


@dataclass
class Prepared:
    """One item ready for the model: its images, its binary mask, where the mask came from, its foreground share and
    the mask warnings it raised (`gen.masks.MaskWarning`: kind, file, message)."""

    item: PlanItem
    target: Image.Image
    material: Image.Image
    mask: Image.Image
    mask_source: str  # "given", "rembg" or "opencv"
    mask_coverage: float = 1.0
    mask_warnings: list[dict[str, str]] = field(default_factory=list)


def output_row(prepared: Prepared, config: GenerationConfig, pipe: Any, dtype: str, batch_size: int) -> dict[str, Any]:
    """The manifest row of a generated image: OOD, hard, test split, inherited labels and provenance (model ids and
    revisions, the call parameters, the resolved dtype and attention backend, the mask's source and coverage, and the
    size of the pipeline call that made it)."""
    item = prepared.item
    params = {**config.call_params(), "dtype": dtype, "attention": getattr(pipe, "attention", config.attention),
              "compile": getattr(pipe, "compiled", config.compile), "mask": prepared.mask_source,
              "mask_coverage": round(prepared.mask_coverage, 4), "batch_size": batch_size}
    provenance = {
        "source_target": item.target,
        "source_material": item.material,
        "seed": config.item_seed(item.index),
        "pipeline": PIPELINE_NAME,
        "model_ids": dict(pipe.model_ids),
        "model_revisions": dict(getattr(pipe, "model_revisions", {}) or {}),
        "params": params,
        "created": datetime.now(UTC).isoformat(timespec="seconds"),
    }
    return make_row(item.output, split="test", role="ood", ood_set=config.name or config.task, group="hard",
                    **item.labels, provenance=provenance)


def check_size(image: Image.Image, path: str) -> Image.Image:
    if min(image.size) < MIN_SIDE:
        raise ImageLoadError(path,
                             f"image too small: {image.size[0]}x{image.size[1]} (each side needs >= {MIN_SIDE} px)")
    return image


def prepare_item(item: PlanItem, masks: dict[str, list[Path]] | None, mask_method: str) -> Prepared:
    """Load the target and material, check their size and make the target's binary mask (the given file, read by
    alpha when it has one that varies, else `mask_method`); raises naming the file when any of it fails or the mask
    is empty. Mask warnings (constant alpha, coverage >= 99% or <= 1%) are kept with the item."""
    target = check_size(load_image(image_path(item.target)), item.target)  # a file or a shard member's
                                                                           # "<shard>#<member>"
    material = check_size(load_image(image_path(item.material)), item.material)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", MaskWarning)
        mask, source, where = _item_mask(item, target, masks, mask_method)
        if is_empty(mask):
            raise MaskError(where, f"empty foreground mask ({source}): nothing to transfer the material onto")
        coverage = check_coverage(mask, where)
    notes = [{"kind": w.message.kind, "file": where, "message": str(w.message)}
             for w in caught if isinstance(w.message, MaskWarning)]
    for other in (w for w in caught if not isinstance(w.message, MaskWarning)):
        warnings.warn_explicit(other.message, other.category, other.filename, other.lineno)
    return Prepared(item, target, material, mask, source, coverage, notes)


def _item_mask(item: PlanItem, target: Image.Image, masks: dict[str, list[Path]] | None,
               mask_method: str) -> tuple[Image.Image, str, str]:
    """The target's mask, its source (`given` or the method) and the file it came from."""
    if masks is None:
        return foreground_mask(target, mask_method), mask_method, item.target
    key = Path(item.target_row["file_name"]).with_suffix("").as_posix()
    found = masks.get(key, [])
    if len(found) != 1:
        reason = "no mask named" if not found else f"{len(found)} masks ({', '.join(p.name for p in found)}) match"
        raise MaskError(item.target, f"{reason} {key}.* in the masks folder")
    return load_mask(found[0], target.size), "given", str(found[0])


def failure(item: PlanItem, err: BaseException, stage: str) -> dict[str, Any]:
    """A failed ledger record naming the file (the one the error names, else the target) and the reason."""
    path = getattr(err, "path", None)
    reason = getattr(err, "reason", None) or f"{type(err).__name__}: {err}".strip()
    return {"index": item.index, "status": FAILED, "output": item.output, "file": str(path or item.target),
            "reason": reason, "stage": stage}


def save_image_synced(path: Path, image: Image.Image) -> None:
    """Write a PNG atomically with its bytes fsync'ed before the rename (the folder is synced by the caller)."""
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as fh:
            image.save(fh, format="PNG")
            fh.flush()
            os.fsync(fh.fileno())


def sync_folder(folder: Path) -> None:
    """fsync a folder so the renames into it survive a power loss."""
    fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def call_pipeline(pipe: Any, ready: list[Prepared], config: GenerationConfig) -> list[Image.Image]:
    seeds = [config.item_seed(r.item.index) for r in ready]
    call = config.call().call_kwargs()
    call.pop("mask_method")  # the masks are made by then (prepare_item)
    return pipe([r.target for r in ready], [r.material for r in ready], masks=[r.mask for r in ready], seeds=seeds,
                **call)


def generate_batch(pipe: Any, batch: list[PlanItem], config: GenerationConfig, ledger: Ledger,
                   masks: dict[str, list[Path]] | None, mask_method: str, dtype: str) -> tuple[int, int]:
    """Prepare, generate, write and record one batch. Returns (done, failed).

    Any exception while preparing an item is its failed record. A model call raising one of `ITEM_ERRORS` is retried
    one item at a time and each item that still fails is recorded; other errors (out of memory, interrupts) stop
    the job, and a rerun resumes it.
    """
    out = Path(config.out)
    ready: list[Prepared] = []
    unprepared: list[dict[str, Any]] = []
    for item in batch:
        try:
            ready.append(prepare_item(item, masks, mask_method))
        except Exception as err:  # noqa: BLE001 - whatever one item's inputs raise is that item's failure
            unprepared.append(failure(item, err, "prepare"))
    if unprepared:
        ledger.append(*unprepared)
    generated, failed = _generate(pipe, ready, config)
    records = []
    for prepared, image, size in generated:
        save_image_synced(out / prepared.item.output, image)
        records.append({"index": prepared.item.index, "status": DONE, "output": prepared.item.output,
                        "row": output_row(prepared, config, pipe, dtype, size),
                        **({"mask_warnings": prepared.mask_warnings} if prepared.mask_warnings else {})})
    if generated:
        sync_folder((out / generated[0][0].item.output).parent)
    if records or failed:
        ledger.append(*records, *failed)  # after the synced images: a crash in between only means redoing this batch
    return len(records), len(unprepared) + len(failed)


def _generate(pipe: Any, ready: list[Prepared], config: GenerationConfig
              ) -> tuple[list[tuple[Prepared, Image.Image, int]], list[dict[str, Any]]]:
    """(prepared, image, size of the call that made it) per generated item, and the failed records: a call raising
    one of `ITEM_ERRORS` is retried one item at a time to find the item(s) to blame."""
    if not ready:
        return [], []
    try:
        return [(one, image, len(ready)) for one, image in zip(ready, call_pipeline(pipe, ready, config))], []
    except ITEM_ERRORS as err:
        if len(ready) == 1:
            return [], [failure(ready[0].item, err, "generate")]
        generated, failed = [], []
        for one in ready:
            try:
                generated.append((one, call_pipeline(pipe, [one], config)[0], 1))
            except ITEM_ERRORS as single:
                failed.append(failure(one.item, single, "generate"))
        return generated, failed
