"""One batch of a generation job: prepare each item alone (load, size check, mask), call the pipeline, write each
image atomically and fsync'ed, then its ledger record. Whatever one item's inputs raise is that item's failed record;
a model error is retried one item at a time to blame the right item."""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import cv2
from PIL import Image

from gen.config import GenerationConfig
from gen.ledger import DONE, FAILED, Ledger
from gen.pairing import PlanItem
from pipelines.data import ImageLoadError, list_images, load_image, make_row
from pipelines.io import atomic_path
from pipelines.masks import MIN_SIDE, MaskError, foreground_mask, is_empty, load_mask
from pipelines.runtime import item_seed

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


def output_row(item: PlanItem, config: GenerationConfig, seed: int, pipe: Any, dtype: str,
               mask_source: str) -> dict[str, Any]:
    """The manifest row of a generated image: OOD, hard, test split, inherited labels and provenance (model ids and
    revisions, the call parameters, the resolved dtype and attention backend, where the mask came from)."""
    params = {**config.call_params(), "dtype": dtype, "attention": getattr(pipe, "attention", config.attention),
              "compile": getattr(pipe, "compiled", config.compile), "mask": mask_source}
    provenance = {
        "source_target": item.target,
        "source_material": item.material,
        "seed": seed,
        "pipeline": PIPELINE_NAME,
        "model_ids": dict(pipe.model_ids),
        "model_revisions": dict(getattr(pipe, "model_revisions", {}) or {}),
        "params": params,
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return make_row(item.output, split="test", role="ood", ood_set=config.name or config.task, group="hard",
                    **item.labels, provenance=provenance)


@dataclass
class Prepared:
    """One item ready for the model: its images, its binary mask and where the mask came from."""

    item: PlanItem
    target: Image.Image
    material: Image.Image
    mask: Image.Image
    mask_source: str  # "given", "rembg" or "opencv"


def check_size(image: Image.Image, path: str) -> Image.Image:
    if min(image.size) < MIN_SIDE:
        raise ImageLoadError(path, f"image too small: {image.size[0]}x{image.size[1]} (each side needs >= {MIN_SIDE} px)")
    return image


def prepare_item(item: PlanItem, masks: dict[str, list[Path]] | None, mask_method: str) -> Prepared:
    """Load the target and material, check their size and make the target's binary mask (the given file, read by
    alpha when it has one, else `mask_method`); raises naming the file when any of it fails or the mask is empty."""
    target = check_size(load_image(item.target), item.target)
    material = check_size(load_image(item.material), item.material)
    if masks is None:
        mask, source, where = foreground_mask(target, mask_method), mask_method, item.target
    else:
        key = Path(item.target_row["file_name"]).with_suffix("").as_posix()
        found = masks.get(key, [])
        if len(found) != 1:
            reason = "no mask named" if not found else f"{len(found)} masks ({', '.join(p.name for p in found)}) match"
            raise MaskError(item.target, f"{reason} {key}.* in the masks folder")
        mask, source, where = load_mask(found[0], target.size), "given", str(found[0])
    if is_empty(mask):
        raise MaskError(where, f"empty foreground mask ({source}): nothing to transfer the material onto")
    return Prepared(item, target, material, mask, source)


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
    seeds = [item_seed(config.seed, r.item.index) for r in ready]
    return pipe(
        [r.target for r in ready], [r.material for r in ready], masks=[r.mask for r in ready], seeds=seeds,
        num_inference_steps=config.num_inference_steps, strength=config.strength, guidance_scale=config.guidance_scale,
        controlnet_conditioning_scale=config.controlnet_conditioning_scale, ip_adapter_scale=config.ip_adapter_scale,
        resolution=config.resolution, resize=config.resize, composite=config.composite,
    )


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
    generated: list[tuple[Prepared, Image.Image]] = []
    failed: list[dict[str, Any]] = []
    if ready:
        try:
            generated = list(zip(ready, call_pipeline(pipe, ready, config)))
        except ITEM_ERRORS as err:
            if len(ready) == 1:
                failed.append(failure(ready[0].item, err, "generate"))
            else:
                for one in ready:  # find the item(s) to blame
                    try:
                        generated.append((one, call_pipeline(pipe, [one], config)[0]))
                    except ITEM_ERRORS as single:
                        failed.append(failure(one.item, single, "generate"))
    records = []
    for prepared, image in generated:
        seed = item_seed(config.seed, prepared.item.index)
        save_image_synced(out / prepared.item.output, image)
        records.append({"index": prepared.item.index, "status": DONE, "output": prepared.item.output,
                        "row": output_row(prepared.item, config, seed, pipe, dtype, prepared.mask_source)})
    if generated:
        sync_folder((out / generated[0][0].item.output).parent)
    if records or failed:
        ledger.append(*records, *failed)  # after the synced images: a crash in between only means redoing this batch
    return len(records), len(unprepared) + len(failed)


