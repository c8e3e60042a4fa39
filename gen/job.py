"""Sharded, batched, resumable ZeST generation under accelerate.

`run_generation(config)` plans the pairs (gen.jobplan on gen.pairing), splits the pending batches across processes,
seeds every item from its global index (so outputs do not depend on the process count), prepares each item alone
(load, size check, mask: any exception there is that item's failed record and the job goes on), writes each image
atomically and fsync'ed, then records it in an fsync'ed per-process ledger (gen.ledger). Each process marks its shard
finished with a file; the main process waits for all the marks (no collective timeout, so shards may finish hours
apart), merges the ledger into the output manifest (role "ood", group "hard", split "test", inherited labels,
provenance) and a contact sheet. A rerun with the same configuration resumes: finished items are skipped, failed ones
retried, so every planned item ends up exactly once.

Layout of `out/`: `metadata.jsonl` + `images/` (an ImageFolder manifest) and the hidden job folder `.job/` (job.json,
plan.json, ledger/, finished/, summary.json, contact_sheet.png), hidden so that `datasets` ImageFolder ignores it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import shutil
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import cv2
import yaml
from PIL import Image
from tqdm.auto import tqdm

from gen.jobplan import PLAN_CHANGES, JobPlan, build_plan, store_plan
from gen.ledger import DONE, FAILED, Ledger
from gen.pairing import TASKS, PlanItem, use_counts
from pipelines.data import ImageLoadError, list_images, load_image, make_row, write_manifest
from pipelines.io import atomic_path, atomic_save_image, atomic_write_json
from pipelines.masks import MASK_METHODS, MIN_SIDE, MaskError, foreground_mask, is_empty, load_mask, resolve_mask_method
from pipelines.runtime import ATTENTION_BACKENDS, PRECISIONS, item_seed, partial_state, resolve_dtype

JOB_FOLDER = ".job"
FINISHED_FOLDER = "finished"
PIPELINE_NAME = "zest"
CONTACT_SHEET_IMAGES = 16
NOT_DECISIVE = ("out", "limit", "batch_size", "attention", "compile", "plan_change")  # keys that never change an image
ITEM_ERRORS = (ValueError, OSError, IndexError, cv2.error)  # from a model call: blamed on the batch's items
WAIT_POLL_S = 2.0
WAIT_LOG_S = 600.0


@dataclass
class GenerationConfig:
    """Everything a generation job needs; see docs/generation.md for each key.

    `models`: None (the real hub models of ZeSTConfig's defaults), a ZeSTConfig mapping (any subset of its keys), or
    "tiny" (tiny random-weight models built once into `$OODFORGE_CACHE/tiny_zest`, default ~/.cache/oodforge).
    `name` is the output's `ood_set` (default: the task). `limit` keeps the first planned items (raise it later and
    rerun to extend the same job). `mask_method` makes the masks of targets without a given mask (auto = rembg when
    installed, else OpenCV with a warning). `attention` (auto/sdpa/xformers) and `compile` only change speed;
    `plan_change` (refuse/extend) says what a rerun does when the input folders changed (gen.jobplan). The pipeline
    call parameters default to ZeST's (REFERENCE.md).
    """

    task: str
    targets: str
    materials: str
    out: str
    models: Any = None
    name: str | None = None
    resolution: int = 1024
    num_inference_steps: int = 30
    batch_size: int = 1
    seed: int = 42
    precision: str = "auto"
    limit: int | None = None
    per_target: int = 1
    inherit: str | None = None
    masks: str | None = None
    mask_method: str = "auto"
    resize: str = "squash"
    composite: bool = False
    strength: float = 0.9999
    guidance_scale: float = 5.0
    controlnet_conditioning_scale: float = 0.9
    ip_adapter_scale: float = 1.0
    attention: str = "auto"
    compile: bool = False
    plan_change: str = "refuse"

    def __post_init__(self) -> None:
        if self.task not in TASKS:
            raise ValueError(f"config 'task' must be one of {TASKS}, got {self.task!r}")
        for key in ("targets", "materials", "out"):
            if not isinstance(getattr(self, key), (str, os.PathLike)) or not str(getattr(self, key)):
                raise ValueError(f"config {key!r} must be a folder path, got {getattr(self, key)!r}")
        for key in ("resolution", "num_inference_steps", "batch_size", "per_target"):
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"config {key!r} must be a positive integer, got {value!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int):
            raise ValueError(f"config 'seed' must be an integer, got {self.seed!r}")
        if self.limit is not None and (isinstance(self.limit, bool) or not isinstance(self.limit, int) or self.limit < 0):
            raise ValueError(f"config 'limit' must be a non-negative integer or null, got {self.limit!r}")
        if self.precision not in PRECISIONS:
            raise ValueError(f"config 'precision' must be one of {PRECISIONS}, got {self.precision!r}")
        if not (self.models is None or self.models == "tiny" or isinstance(self.models, dict)):
            raise ValueError(f"config 'models' must be null, 'tiny' or a mapping of ZeSTConfig keys, got {self.models!r}")
        for key in ("composite", "compile"):
            if not isinstance(getattr(self, key), bool):
                raise ValueError(f"config {key!r} must be true or false, got {getattr(self, key)!r}")
        for key, allowed in (("mask_method", MASK_METHODS), ("attention", ATTENTION_BACKENDS),
                             ("plan_change", PLAN_CHANGES)):
            if getattr(self, key) not in allowed:
                raise ValueError(f"config {key!r} must be one of {allowed}, got {getattr(self, key)!r}")
        for key in ("strength", "guidance_scale", "controlnet_conditioning_scale", "ip_adapter_scale"):
            if isinstance(getattr(self, key), bool) or not isinstance(getattr(self, key), (int, float)):
                raise ValueError(f"config {key!r} must be a number, got {getattr(self, key)!r}")

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GenerationConfig":
        """Build from a mapping; unknown keys raise a `ValueError` that lists them and the known ones."""
        if not isinstance(values, dict):
            raise ValueError(f"a generation config is a mapping, got {type(values).__name__}")
        unknown = sorted(set(values) - set(cls.keys()))
        if unknown:
            raise ValueError(f"unknown generation config keys {unknown}; known keys: {cls.keys()}")
        missing = [k for k in ("task", "targets", "materials", "out") if values.get(k) in (None, "")]
        if missing:
            raise ValueError(f"generation config is missing required keys {missing}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: Sequence[str] = ()) -> "GenerationConfig":
        """Read a YAML config and apply `key=value` overrides (values parsed as YAML; `models.depth=DIR` sets a
        nested key)."""
        path = Path(path)
        if not path.is_file():
            raise FileNotFoundError(f"generation config not found: {path}")
        values = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(values, dict):
            raise ValueError(f"{path}: a generation config is a YAML mapping")
        return cls.from_dict(apply_overrides(values, overrides))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys()}

    def call_params(self) -> dict[str, Any]:
        """The ZeSTPipeline call parameters (recorded in each output's provenance)."""
        return {
            "num_inference_steps": self.num_inference_steps, "strength": self.strength,
            "guidance_scale": self.guidance_scale, "controlnet_conditioning_scale": self.controlnet_conditioning_scale,
            "ip_adapter_scale": self.ip_adapter_scale, "resolution": self.resolution, "resize": self.resize,
            "composite": self.composite, "precision": self.precision, "mask_method": self.mask_method,
        }

    def decisive(self) -> dict[str, Any]:
        """The keys that decide the outputs (all but `NOT_DECISIVE`)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_DECISIVE}

    def fingerprint(self) -> str:
        """Hash of `decisive()`: a resumed job must match it."""
        return hashlib.sha256(json.dumps(self.decisive(), sort_keys=True, default=str).encode()).hexdigest()[:16]


def apply_overrides(values: dict[str, Any], overrides: Iterable[str]) -> dict[str, Any]:
    """Apply `key=value` strings (value parsed as YAML, dotted keys reach into mappings) to a copy of `values`."""
    values = json.loads(json.dumps(values))
    for text in overrides:
        if "=" not in text:
            raise ValueError(f"override {text!r} is not of the form key=value")
        key, raw = text.split("=", 1)
        parts = key.strip().split(".")
        node = values
        for part in parts[:-1]:
            if not isinstance(node.get(part), dict):
                node[part] = {}
            node = node[part]
        node[parts[-1]] = yaml.safe_load(raw) if raw.strip() else None
    return values


def tiny_models_folder() -> Path:
    """Where `models: tiny` builds its random-weight stand-ins once; the name carries the stand-ins' fingerprint (shrink
    table and real configs), so a folder built by other stand-in code is never reused."""
    from pipelines.tiny import standin_fingerprint

    cache = os.environ.get("OODFORGE_CACHE") or Path.home() / ".cache" / "oodforge"
    return Path(cache) / f"tiny_zest-{standin_fingerprint()}"


def resolve_models(models: Any, state: Any = None):
    """A `ZeSTConfig` from a config's `models` value; "tiny" builds the tiny models on the main process first."""
    from pipelines.zest import ZeSTConfig

    if models is None:
        return ZeSTConfig()
    if isinstance(models, dict):
        return ZeSTConfig.from_dict(models)
    if models != "tiny":
        raise ValueError(f"models must be null, 'tiny' or a ZeSTConfig mapping, got {models!r}")
    folder = tiny_models_folder()
    marker = folder / "zest_config.json"
    if state is not None and not state.is_main_process:
        state.wait_for_everyone()
    if not marker.is_file() and (state is None or state.is_main_process):
        from pipelines.tiny import save_tiny_zest

        atomic_write_json(marker, save_tiny_zest(folder).to_dict())
    if state is not None and state.is_main_process:
        state.wait_for_everyone()
    return ZeSTConfig.from_dict(json.loads(marker.read_text(encoding="utf-8")))


def build_pipeline(config: GenerationConfig, state: Any):
    """The ZeST pipeline on this process's device with the configured precision, attention backend and compile."""
    from pipelines.zest import ZeSTPipeline

    models = resolve_models(config.models, state)
    return ZeSTPipeline.from_config(models, device=state.device, dtype=resolve_dtype(config.precision, state.device),
                                    attention=config.attention, compile=config.compile)


def job_plan(config: GenerationConfig) -> JobPlan:
    """The job's plan: stored pairs when the inputs are unchanged, else refused or extended (gen.jobplan)."""
    return build_plan(config.task, config.targets, config.materials, Path(config.out) / JOB_FOLDER,
                      per_target=config.per_target, seed=config.seed, inherit=config.inherit, limit=config.limit,
                      plan_change=config.plan_change)


def load_plan(config: GenerationConfig) -> list[PlanItem]:
    """The items the job runs (after `limit`)."""
    return job_plan(config).items


def mask_index(folder: str | os.PathLike | None) -> dict[str, list[Path]] | None:
    """Mask files keyed by relative path without suffix (a target `a/b.jpg` uses mask `a/b.*`)."""
    if folder is None:
        return None
    root = Path(folder)
    index: dict[str, list[Path]] = {}
    for path in list_images(root):
        index.setdefault(path.relative_to(root).with_suffix("").as_posix(), []).append(path)
    return index


def remove_stale_temp_files(out: Path) -> int:
    """Delete temp files left by a killed writer (pipelines.io names them `.<name>.<random>.tmp<suffix>`)."""
    removed = 0
    for folder in (out, out / "images", out / JOB_FOLDER, out / JOB_FOLDER / "ledger"):
        if folder.is_dir():
            for path in folder.iterdir():
                if path.is_file() and path.name.startswith(".") and ".tmp" in path.name:
                    path.unlink()
                    removed += 1
    return removed


def check_output(config: GenerationConfig) -> None:
    """Refuse an `out` folder that holds a different job (every process checks, so all fail alike). A key missing
    from an older job.json counts as its default."""
    out = Path(config.out)
    job_file = out / JOB_FOLDER / "job.json"
    if not job_file.is_file():
        return
    previous = json.loads(job_file.read_text(encoding="utf-8"))
    if previous.get("fingerprint") == config.fingerprint():
        return
    defaults = {f.name: f.default for f in dataclasses.fields(GenerationConfig) if f.default is not dataclasses.MISSING}
    old = {**defaults, **previous.get("config", {})}
    new = config.decisive()
    changed = sorted(k for k in new if json.dumps(old.get(k), default=str) != json.dumps(new[k], default=str))
    if changed:
        raise ValueError(f"{out} holds a different generation job (changed keys: {changed}); use a new 'out' "
                         f"folder or restore the earlier settings to resume it")


def prepare_output(config: GenerationConfig, plan: JobPlan) -> None:
    """Main process: clear temp files and shard marks a killed run left behind, record the config and the plan."""
    out = Path(config.out)
    remove_stale_temp_files(out)
    shutil.rmtree(out / JOB_FOLDER / FINISHED_FOLDER, ignore_errors=True)
    store_plan(out / JOB_FOLDER, plan)
    atomic_write_json(out / JOB_FOLDER / "job.json",
                      {"fingerprint": config.fingerprint(), "config": config.to_dict(), "plan_hash": plan.plan_hash,
                       "plan_size": len(plan.pairs), "planned": len(plan.items)})


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


def contact_sheet(paths: Sequence[Path], destination: Path, thumb: int = 128, columns: int = 4) -> Path | None:
    """A grid of thumbnails of `paths` saved atomically as PNG; None when there is nothing to show."""
    if not paths:
        return None
    rows = (len(paths) + columns - 1) // columns
    sheet = Image.new("RGB", (min(columns, len(paths)) * thumb, rows * thumb), (255, 255, 255))
    for i, path in enumerate(paths):
        with Image.open(path) as img:
            small = img.convert("RGB")
            small.thumbnail((thumb, thumb))
        sheet.paste(small, ((i % columns) * thumb + (thumb - small.width) // 2, (i // columns) * thumb + (thumb - small.height) // 2))
    atomic_save_image(destination, sheet)
    return destination


def mark_finished(out: Path, rank: int, counts: dict[str, Any]) -> None:
    """This process's shard is done (a file, so the main process can wait for hours without a collective timeout)."""
    atomic_write_json(out / JOB_FOLDER / FINISHED_FOLDER / f"process-{rank:03d}.json", counts)


def wait_for_shards(out: Path, processes: int, poll_s: float = WAIT_POLL_S, timeout_s: float | None = None,
                    log_every_s: float = WAIT_LOG_S) -> list[dict[str, Any]]:
    """Main process: wait until every process marked its shard finished; returns their counts.

    Polls files instead of a collective barrier, whose default timeout (10 minutes under NCCL) would abort shards that
    finish far apart. No timeout by default: a crashed process ends the whole launch (torchrun / accelerate)."""
    folder = out / JOB_FOLDER / FINISHED_FOLDER
    started = last_log = time.monotonic()
    while True:
        marks = sorted(folder.glob("process-*.json")) if folder.is_dir() else []
        if len(marks) >= processes:
            return [json.loads(p.read_text(encoding="utf-8")) for p in marks]
        now = time.monotonic()
        if timeout_s is not None and now - started > timeout_s:
            raise TimeoutError(f"{len(marks)} of {processes} processes finished their shard after {timeout_s:.0f} s")
        if now - last_log >= log_every_s:
            done = {p.stem for p in marks}
            missing = [r for r in range(processes) if f"process-{r:03d}" not in done]
            print(f"[generate] waiting for process(es) {missing} to finish ({(now - started) / 3600:.1f} h so far)",
                  flush=True)
            last_log = now
        time.sleep(poll_s)


def finalize(config: GenerationConfig, plan: list[PlanItem], ledger: Ledger) -> dict[str, Any]:
    """Main process: merge the ledger, write the manifest (plan order) and the contact sheet; return the counts."""
    out = Path(config.out)
    records = ledger.merge()
    rows = [records[item.index]["row"] for item in plan if is_done(records.get(item.index), out)]
    write_manifest(out, rows)
    planned = {item.index for item in plan}
    failures = [{"index": i, "file": r.get("file"), "reason": r.get("reason"), "stage": r.get("stage")}
                for i, r in sorted(records.items()) if r.get("status") == FAILED and i in planned]
    sheet = contact_sheet([out / r["file_name"] for r in rows[:CONTACT_SHEET_IMAGES]], out / JOB_FOLDER / "contact_sheet.png")
    return {"manifest": str(out / "metadata.jsonl"), "contact_sheet": str(sheet) if sheet else None,
            "done": len(rows), "failed": failures}


def plan_summary(config: GenerationConfig, plan: list[PlanItem] | JobPlan) -> dict[str, Any]:
    """Counts for `--dry-run` and the job summary: items, distinct targets and materials, material use range."""
    items = plan.items if isinstance(plan, JobPlan) else plan
    counts = use_counts(items)
    done = Ledger(Path(config.out) / JOB_FOLDER / "ledger").records()
    finished = sum(is_done(done.get(item.index), Path(config.out)) for item in items)
    summary = {
        "task": config.task, "ood_set": config.name or config.task, "planned": len(items),
        "targets": len({item.target for item in items}), "materials": len(counts),
        "material_use": [min(counts.values()), max(counts.values())] if counts else [0, 0],
        "already_done": finished, "pending": len(items) - finished,
    }
    if isinstance(plan, JobPlan):
        summary.update(plan_hash=plan.plan_hash, extended=plan.extended, skipped_inputs=plan.skipped_inputs)
    return summary


def format_plan(plan: list[PlanItem], limit: int = 20) -> str:
    """Human-readable first `limit` plan lines: index, target <- material -> output."""
    lines = [f"{item.index:>7}  {item.target}  <-  {item.material}  ->  {item.output}" for item in plan[:limit]]
    if len(plan) > limit:
        lines.append(f"... and {len(plan) - limit} more")
    return "\n".join(lines)


def run_generation(config: GenerationConfig | dict[str, Any], *, pipeline: Any = None, state: Any = None,
                   dry_run: bool = False) -> dict[str, Any]:
    """Run (or resume) a generation job; returns a summary (complete on the main process, this shard's counts on
    the others, which return as soon as their shard is done).

    `pipeline` replaces the ZeST pipeline built from `config.models` (any callable with ZeSTPipeline's call signature
    and a `model_ids` dict); `state` replaces `pipelines.runtime.partial_state()`; `dry_run` only plans and counts.
    """
    config = config if isinstance(config, GenerationConfig) else GenerationConfig.from_dict(config)
    out = Path(config.out)
    check_output(config)
    plan = job_plan(config)
    if dry_run:
        return {"dry_run": True, **plan_summary(config, plan)}
    started = time.perf_counter()
    state = state or partial_state()
    if state.is_main_process:
        prepare_output(config, plan)
    state.wait_for_everyone()  # collectives only at the start (here and in building tiny models): none at the end
    ledger = Ledger(out / JOB_FOLDER / "ledger", rank=state.process_index)
    records = ledger.records()
    pending = [item for item in plan.items if not is_done(records.get(item.index), out)]
    batches = [pending[i:i + config.batch_size] for i in range(0, len(pending), config.batch_size)]
    masks = mask_index(config.masks)
    mask_method = resolve_mask_method(config.mask_method) if masks is None else "given"
    generated = failed = 0
    dtype = str(resolve_dtype(config.precision, getattr(state, "device", None))).removeprefix("torch.")
    if batches:
        pipe = pipeline if pipeline is not None else build_pipeline(config, state)
        dtype = str(getattr(pipe, "dtype", None) or dtype).removeprefix("torch.")
        with state.split_between_processes(batches) as mine:
            bar = tqdm(total=sum(len(b) for b in mine), desc=f"generate ({state.num_processes} process(es))",
                       unit="img", disable=not state.is_main_process)
            for batch in mine:
                done, bad = generate_batch(pipe, batch, config, ledger, masks, mask_method, dtype)
                generated, failed = generated + done, failed + bad
                bar.update(len(batch))
            bar.close()
    summary = {"process": state.process_index, "processes": state.num_processes, "planned": len(plan.items),
               "skipped": len(plan.items) - len(pending), "generated_here": generated, "failed_here": failed}
    mark_finished(out, state.process_index, summary)
    if not state.is_main_process:
        return summary
    shards = wait_for_shards(out, state.num_processes)
    summary.update(finalize(config, plan.items, ledger))
    summary.update(plan_hash=plan.plan_hash, extended=plan.extended, skipped_inputs=plan.skipped_inputs,
                   mask_method=mask_method, dtype=dtype, shards=shards)
    if config.mask_method == "auto" and mask_method == "opencv":
        summary["warnings"] = ["mask_method auto fell back to the OpenCV GrabCut masks: rembg is not installed"]
    summary["seconds"] = round(time.perf_counter() - started, 3)
    atomic_write_json(out / JOB_FOLDER / "summary.json", summary)
    return summary
