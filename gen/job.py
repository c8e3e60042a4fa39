"""Sharded, batched, resumable ZeST generation under accelerate.

`run_generation(config)` plans the pairs (gen.pairing), splits the pending batches across processes, seeds every item
from its global index (so outputs do not depend on the process count), writes each image atomically, records done and
failed items in an fsync'ed per-process ledger (gen.ledger) and, on the main process, merges the ledger into the output
manifest (role "ood", group "hard", split "test", inherited labels, provenance) and a contact sheet. A rerun with the
same configuration resumes: finished items are skipped, so every planned item ends up exactly once.

Layout of `out/`: `metadata.jsonl` + `images/` (an ImageFolder manifest) and the hidden job folder `.job/` (job.json,
ledger/, summary.json, contact_sheet.png), hidden so that `datasets` ImageFolder ignores it.
"""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Sequence

import yaml
from PIL import Image
from tqdm.auto import tqdm

from gen.ledger import DONE, FAILED, Ledger
from gen.pairing import TASKS, PlanItem, load_source, plan_task, use_counts
from pipelines.data import ImageLoadError, list_images, load_image, make_row, write_manifest
from pipelines.io import atomic_save_image, atomic_write_json
from pipelines.runtime import PRECISIONS, item_seed, partial_state, resolve_dtype

JOB_FOLDER = ".job"
PIPELINE_NAME = "zest"
CONTACT_SHEET_IMAGES = 16


@dataclass
class GenerationConfig:
    """Everything a generation job needs; see docs/generation.md for each key.

    `models`: None (the real hub models of ZeSTConfig's defaults), a ZeSTConfig mapping (any subset of its keys), or
    "tiny" (tiny random-weight models built once into `$OODFORGE_CACHE/tiny_zest`, default ~/.cache/oodforge).
    `name` is the output's `ood_set` (default: the task). `limit` keeps the first planned items (raise it later and
    rerun to extend the same job). The pipeline call parameters default to ZeST's (REFERENCE.md).
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
    resize: str = "squash"
    composite: bool = False
    strength: float = 0.9999
    guidance_scale: float = 5.0
    controlnet_conditioning_scale: float = 0.9
    ip_adapter_scale: float = 1.0

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
        if not isinstance(self.composite, bool):
            raise ValueError(f"config 'composite' must be true or false, got {self.composite!r}")
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
            "composite": self.composite, "precision": self.precision,
        }

    def fingerprint(self) -> str:
        """Hash of what decides the outputs (not `out`, `limit` or `batch_size`): a resumed job must match it."""
        decisive = {k: v for k, v in self.to_dict().items() if k not in ("out", "limit", "batch_size")}
        return hashlib.sha256(json.dumps(decisive, sort_keys=True, default=str).encode()).hexdigest()[:16]


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
    """Where `models: tiny` builds its random-weight stand-ins once."""
    cache = os.environ.get("OODFORGE_CACHE") or Path.home() / ".cache" / "oodforge"
    return Path(cache) / "tiny_zest"


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
    """The ZeST pipeline on this process's device with the configured precision."""
    from pipelines.zest import ZeSTPipeline

    models = resolve_models(config.models, state)
    return ZeSTPipeline.from_config(models, device=state.device, dtype=resolve_dtype(config.precision, state.device))


def load_plan(config: GenerationConfig) -> list[PlanItem]:
    """Read the target and material folders and plan the pairs."""
    targets = load_source(config.targets, "targets")
    materials = load_source(config.materials, "materials")
    return plan_task(config.task, targets, materials, per_target=config.per_target, seed=config.seed,
                     inherit=config.inherit, limit=config.limit)


def mask_index(folder: str | os.PathLike | None) -> dict[str, Path] | None:
    """Mask files keyed by relative path without suffix (a target `a/b.jpg` uses mask `a/b.*`)."""
    if folder is None:
        return None
    root = Path(folder)
    return {p.relative_to(root).with_suffix("").as_posix(): p for p in list_images(root)}


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
    """Refuse an `out` folder that holds a different job (every process checks, so all fail alike)."""
    out = Path(config.out)
    job_file = out / JOB_FOLDER / "job.json"
    if not job_file.is_file():
        return
    previous = json.loads(job_file.read_text(encoding="utf-8"))
    if previous.get("fingerprint") != config.fingerprint():
        old, new = previous.get("config", {}), config.to_dict()
        changed = sorted(k for k in new if k not in ("out", "limit", "batch_size")
                         and json.dumps(old.get(k), default=str) != json.dumps(new[k], default=str))
        raise ValueError(f"{out} holds a different generation job (changed keys: {changed}); use a new 'out' "
                         f"folder or restore the earlier settings to resume it")


def prepare_output(config: GenerationConfig, plan_size: int) -> None:
    """Main process: clear temp files a killed run left behind and record this job's configuration."""
    out = Path(config.out)
    remove_stale_temp_files(out)
    atomic_write_json(out / JOB_FOLDER / "job.json",
                      {"fingerprint": config.fingerprint(), "config": config.to_dict(), "planned": plan_size})


def is_done(record: dict[str, Any] | None, out: Path) -> bool:
    return bool(record) and record.get("status") == DONE and (out / record["output"]).is_file()


def output_row(item: PlanItem, config: GenerationConfig, seed: int, model_ids: dict[str, str]) -> dict[str, Any]:
    """The manifest row of a generated image: OOD, hard, test split, inherited labels and provenance."""
    provenance = {
        "source_target": item.target,
        "source_material": item.material,
        "seed": seed,
        "pipeline": PIPELINE_NAME,
        "model_ids": dict(model_ids),
        "params": config.call_params(),
        "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    return make_row(item.output, split="test", role="ood", ood_set=config.name or config.task, group="hard",
                    **item.labels, provenance=provenance)


def load_inputs(item: PlanItem, masks: dict[str, Path] | None) -> tuple[Image.Image, Image.Image, Image.Image | None]:
    """The target, the material and (with a mask folder) the target's mask; raises `ImageLoadError` naming the file."""
    target = load_image(item.target)
    material = load_image(item.material)
    if masks is None:
        return target, material, None
    key = Path(item.target_row["file_name"]).with_suffix("").as_posix()
    if key not in masks:
        raise ImageLoadError(item.target, f"no mask named {key}.* in the masks folder")
    return target, material, load_image(masks[key]).convert("L")


def generate_batch(pipe: Any, batch: list[PlanItem], config: GenerationConfig, ledger: Ledger,
                   masks: dict[str, Path] | None) -> tuple[int, int]:
    """Load, generate, write and record one batch; unreadable inputs are recorded as failed. Returns (done, failed)."""
    out = Path(config.out)
    ready: list[tuple[PlanItem, Image.Image, Image.Image, Image.Image | None]] = []
    failed = 0
    for item in batch:
        try:
            ready.append((item, *load_inputs(item, masks)))
        except ImageLoadError as err:
            ledger.append({"index": item.index, "status": FAILED, "output": item.output, "file": err.path,
                           "reason": err.reason})
            failed += 1
    if not ready:
        return 0, failed
    seeds = [item_seed(config.seed, item.index) for item, *_ in ready]
    images = pipe(
        [r[1] for r in ready], [r[2] for r in ready], masks=None if masks is None else [r[3] for r in ready],
        seeds=seeds, num_inference_steps=config.num_inference_steps, strength=config.strength,
        guidance_scale=config.guidance_scale, controlnet_conditioning_scale=config.controlnet_conditioning_scale,
        ip_adapter_scale=config.ip_adapter_scale, resolution=config.resolution, resize=config.resize,
        composite=config.composite,
    )
    records = []
    for (item, *_), seed, image in zip(ready, seeds, images):
        atomic_save_image(out / item.output, image)
        records.append({"index": item.index, "status": DONE, "output": item.output,
                        "row": output_row(item, config, seed, pipe.model_ids)})
    ledger.append(*records)  # after the images: a crash in between only means redoing this batch
    return len(ready), failed


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


def finalize(config: GenerationConfig, plan: list[PlanItem], ledger: Ledger) -> dict[str, Any]:
    """Main process: merge the ledger, write the manifest (plan order) and the contact sheet; return the counts."""
    out = Path(config.out)
    records = ledger.merge()
    rows = [records[item.index]["row"] for item in plan if is_done(records.get(item.index), out)]
    write_manifest(out, rows)
    failures = [{"index": i, "file": r.get("file"), "reason": r.get("reason")}
                for i, r in sorted(records.items()) if r.get("status") == FAILED and i < len(plan)]
    sheet = contact_sheet([out / r["file_name"] for r in rows[:CONTACT_SHEET_IMAGES]], out / JOB_FOLDER / "contact_sheet.png")
    return {"manifest": str(out / "metadata.jsonl"), "contact_sheet": str(sheet) if sheet else None,
            "done": len(rows), "failed": failures}


def plan_summary(config: GenerationConfig, plan: list[PlanItem]) -> dict[str, Any]:
    """Counts for `--dry-run` and the job summary: items, distinct targets and materials, material use range."""
    counts = use_counts(plan)
    done = Ledger(Path(config.out) / JOB_FOLDER / "ledger").records()
    finished = sum(is_done(done.get(item.index), Path(config.out)) for item in plan)
    return {
        "task": config.task, "ood_set": config.name or config.task, "planned": len(plan),
        "targets": len({item.target for item in plan}), "materials": len(counts),
        "material_use": [min(counts.values()), max(counts.values())] if counts else [0, 0],
        "already_done": finished, "pending": len(plan) - finished,
    }


def format_plan(plan: list[PlanItem], limit: int = 20) -> str:
    """Human-readable first `limit` plan lines: index, target <- material -> output."""
    lines = [f"{item.index:>7}  {item.target}  <-  {item.material}  ->  {item.output}" for item in plan[:limit]]
    if len(plan) > limit:
        lines.append(f"... and {len(plan) - limit} more")
    return "\n".join(lines)


def run_generation(config: GenerationConfig | dict[str, Any], *, pipeline: Any = None, state: Any = None,
                   dry_run: bool = False) -> dict[str, Any]:
    """Run (or resume) a generation job; returns a summary (complete on the main process).

    `pipeline` replaces the ZeST pipeline built from `config.models` (any callable with ZeSTPipeline's call signature
    and a `model_ids` dict); `state` replaces `pipelines.runtime.partial_state()`; `dry_run` only plans and counts.
    """
    config = config if isinstance(config, GenerationConfig) else GenerationConfig.from_dict(config)
    plan = load_plan(config)
    if dry_run:
        return {"dry_run": True, **plan_summary(config, plan)}
    started = time.perf_counter()
    state = state or partial_state()
    out = Path(config.out)
    check_output(config)
    if state.is_main_process:
        prepare_output(config, len(plan))
    state.wait_for_everyone()
    ledger = Ledger(out / JOB_FOLDER / "ledger", rank=state.process_index)
    records = ledger.records()
    pending = [item for item in plan if not is_done(records.get(item.index), out)]
    batches = [pending[i:i + config.batch_size] for i in range(0, len(pending), config.batch_size)]
    masks = mask_index(config.masks)
    generated = failed = 0
    if batches:
        pipe = pipeline if pipeline is not None else build_pipeline(config, state)
        with state.split_between_processes(batches) as mine:
            bar = tqdm(total=sum(len(b) for b in mine), desc=f"generate ({state.num_processes} process(es))",
                       unit="img", disable=not state.is_main_process)
            for batch in mine:
                done, bad = generate_batch(pipe, batch, config, ledger, masks)
                generated, failed = generated + done, failed + bad
                bar.update(len(batch))
            bar.close()
    state.wait_for_everyone()
    summary = {"process": state.process_index, "processes": state.num_processes, "planned": len(plan),
               "skipped": len(plan) - len(pending), "generated_here": generated, "failed_here": failed}
    if state.is_main_process:
        summary.update(finalize(config, plan, ledger))
        summary["seconds"] = round(time.perf_counter() - started, 3)
        atomic_write_json(out / JOB_FOLDER / "summary.json", summary)
    state.wait_for_everyone()
    return summary
