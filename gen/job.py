"""Sharded, batched, resumable ZeST generation under accelerate.

`run_generation(config)` plans the pairs (gen.jobplan on gen.pairing), splits the pending batches across processes
(gen.shards), seeds every item from its global index (so outputs do not depend on the process count), prepares each
item alone (gen.items: load, size check, mask; any exception there is that item's failed record and the job goes on),
writes each image atomically and fsync'ed, then records it in an fsync'ed per-process ledger (gen.ledger). Each
process marks its shard finished with a file; the main process waits for all the marks, merges the ledger into the
output manifest (role "ood", group "hard", split "test", inherited labels, provenance) and a contact sheet
(gen.sheet). A rerun with the same configuration (gen.config) resumes: finished items are skipped, failed ones
retried, so every planned item ends up exactly once.

Layout of `out/`: `metadata.jsonl` + `images/` (an ImageFolder manifest) and the hidden job folder `.job/` (job.json,
plan.json, ledger/, finished/, summary.json, contact_sheet.png), hidden so that `datasets` ImageFolder ignores it.
"""
from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path
from typing import Any

from gen.config import JOB_FOLDER, NOT_DECISIVE, GenerationConfig
from gen.items import (
    ITEM_ERRORS,
    PIPELINE_NAME,
    Prepared,
    check_size,
    failure,
    generate_batch,
    is_done,
    mask_index,
    output_row,
    prepare_item,
)
from gen.jobplan import JobPlan, build_plan, store_plan
from gen.ledger import FAILED, Ledger
from gen.masks import MaskModelError, open_rembg, resolve_mask_method
from gen.pairing import PlanItem, use_counts
from gen.shards import FINISHED_FOLDER, heartbeat, mark_finished, pending_batches, wait_for_shards
from gen.sheet import CONTACT_SHEET_IMAGES, contact_sheet
from gen.zest import ZeSTConfig
from pipelines.collectives import main_decides, share
from pipelines.data import write_manifest
from pipelines.errors import ConfigError
from pipelines.io import atomic_write_json, remove_orphan_temps
from pipelines.locks import output_lock
from pipelines.progress import progress
from pipelines.rankfiles import check_shared
from pipelines.runtime import partial_state, resolve_dtype

SHOWN_FILES = 5  # example files per summary warning

__all__ = [  # the job's API, including the names re-exported from gen.config, gen.items, gen.shards and gen.sheet
    "CONTACT_SHEET_IMAGES", "FINISHED_FOLDER", "ITEM_ERRORS", "JOB_FOLDER", "NOT_DECISIVE", "PIPELINE_NAME",
    "GenerationConfig", "Prepared", "build_pipeline", "check_job", "check_output", "check_size", "contact_sheet",
    "failure", "finalize", "format_plan", "generate_batch", "is_done", "job_plan", "job_started", "load_plan",
    "mark_finished",
    "mask_index", "output_row", "plan_summary", "prepare_item", "prepare_output", "remove_stale_temp_files",
    "resolve_models", "run_generation", "tiny_models_folder", "wait_for_shards",
]


def tiny_models_folder() -> Path:
    """Where `models: tiny` builds its random-weight stand-ins once; the name carries the stand-ins' fingerprint (shrink
    table and real configs), so a folder built by other stand-in code is never reused."""
    from pipelines.tiny import standin_fingerprint

    cache = os.environ.get("OODFORGE_CACHE") or Path.home() / ".cache" / "oodforge"
    return Path(cache) / f"tiny_zest-{standin_fingerprint()}"


def _build_tiny(folder: Path) -> None:
    """Write the tiny ZeST models into `folder`, their config (`zest_config.json`) last."""
    from gen.tiny_zest import save_tiny_zest

    atomic_write_json(folder / "zest_config.json", save_tiny_zest(folder).to_dict())


def resolve_models(models: ZeSTConfig | str | None, state: Any = None) -> ZeSTConfig:
    """The `ZeSTConfig` of a config's typed `models` value; "tiny" builds the tiny models first, on each node's local
    main process (their cache folder, `tiny_models_folder`, may be local to the node)."""
    if models is None:
        return ZeSTConfig()
    if isinstance(models, ZeSTConfig):
        return models
    folder = tiny_models_folder()
    marker = folder / "zest_config.json"
    builds = state is None or getattr(state, "is_local_main_process", state.is_main_process)  # one per node
    if not builds:
        state.wait_for_everyone()
    if not marker.is_file() and builds:
        if state is None or state.is_main_process:
            _build_tiny(folder)
        else:  # transformers' save_pretrained writes weights on global rank 0 only: a process of its own builds them
            import multiprocessing

            child = multiprocessing.get_context("spawn").Process(target=_build_tiny, args=(folder,))
            child.start()
            child.join()
            if child.exitcode != 0 or not marker.is_file():
                raise RuntimeError(f"building the tiny models in {folder} failed (exit {child.exitcode})")
    if state is not None and builds:
        state.wait_for_everyone()
    return ZeSTConfig.from_dict(json.loads(marker.read_text(encoding="utf-8")))


def build_pipeline(config: GenerationConfig, state: Any):
    """The ZeST pipeline on this process's device with the configured precision, attention backend and compile."""
    from gen.zest import ZeSTPipeline

    models = resolve_models(config.models, state)
    return ZeSTPipeline.from_config(models, device=state.device, dtype=resolve_dtype(config.precision, state.device),
                                    attention=config.attention, compile=config.compile)


def job_plan(config: GenerationConfig) -> JobPlan:
    """The job's plan: stored pairs when the inputs are unchanged, else refused or extended (gen.jobplan); a job
    folder whose job never finished an item is planned afresh."""
    out = Path(config.out)
    return build_plan(config.task, config.targets, config.materials, out / JOB_FOLDER,
                      per_target=config.per_target, seed=config.seed, inherit=config.inherit, limit=config.limit,
                      plan_change=config.plan_change, stored_plan=job_started(out))


def job_started(out: Path) -> bool:
    """True when the job in `out` finished at least one item (its image is there): only then is its config and plan
    binding on a rerun. A job refused or failed at start-up, or whose every item failed, left nothing to keep."""
    records = Ledger(out / JOB_FOLDER / "ledger").records()
    return any(is_done(record, out) for record in records.values())


def check_job(config: GenerationConfig) -> JobPlan:
    """Every start-up check of a run, shared by `--dry-run`: the `out` folder holds no other job, the plan (inputs
    read, stored plan honoured or refused) and an automatic mask method that can run. Returns the plan."""
    check_output(config)
    plan = job_plan(config)
    if config.masks is None and plan.items:
        try:
            resolve_mask_method(config.mask_method)
        except ImportError as err:
            raise MaskModelError(f"mask_method: {err}") from err
    return plan


def load_plan(config: GenerationConfig) -> list[PlanItem]:
    """The items the job runs (after `limit`)."""
    return job_plan(config).items


def remove_stale_temp_files(out: Path) -> int:
    """Delete temp files left by a killed writer (`pipelines.io.remove_orphan_temps`) in the job's folders."""
    folders = (out, out / "images", out / JOB_FOLDER, out / JOB_FOLDER / "ledger")
    return sum(remove_orphan_temps(folder, recursive=False) for folder in folders)


def check_output(config: GenerationConfig) -> None:
    """Refuse an `out` folder that holds a different job (every process checks, so all fail alike). A key missing
    from an older job.json counts as its default."""
    out = Path(config.out)
    job_file = out / JOB_FOLDER / "job.json"
    if not job_file.is_file() or not job_started(out):
        return
    previous = json.loads(job_file.read_text(encoding="utf-8"))
    if previous.get("fingerprint") == config.fingerprint():
        return
    old = {**GenerationConfig.defaults(), **previous.get("config", {})}
    try:  # an earlier job.json may hold a shorter form (a `models` subset): compare typed values
        old = GenerationConfig.from_dict(old).to_dict()
    except ConfigError:
        pass
    new = config.decisive()
    changed = sorted(k for k in new if json.dumps(old.get(k), default=str) != json.dumps(new[k], default=str))
    if changed:
        raise ConfigError(f"{out} holds a different generation job (changed keys: {changed}); use a new 'out' "
                          f"folder or restore the earlier settings to resume it")


def prepare_output(config: GenerationConfig, plan: JobPlan) -> None:
    """Main process: clear temp files and shard marks a killed run left behind, record the config and the plan."""
    out = Path(config.out)
    remove_stale_temp_files(out)
    shutil.rmtree(out / JOB_FOLDER / FINISHED_FOLDER, ignore_errors=True)
    if not job_started(out):  # failed records of a job that kept nothing (say, refused at start-up) are not this job's
        shutil.rmtree(out / JOB_FOLDER / "ledger", ignore_errors=True)
    store_plan(out / JOB_FOLDER, plan)
    atomic_write_json(out / JOB_FOLDER / "job.json",
                      {"fingerprint": config.fingerprint(), "config": config.to_dict(), "plan_hash": plan.plan_hash,
                       "plan_size": len(plan.pairs), "planned": len(plan.items)})


def finalize(config: GenerationConfig, plan: list[PlanItem], ledger: Ledger) -> dict[str, Any]:
    """Main process: merge the ledger, write the manifest (plan order) and the contact sheet; return the counts."""
    out = Path(config.out)
    records = ledger.merge()
    done = [records[item.index] for item in plan if is_done(records.get(item.index), out)]
    rows = [record["row"] for record in done]
    write_manifest(out, rows)
    planned = {item.index for item in plan}
    failures = [{"index": i, "file": r.get("file"), "reason": r.get("reason"), "stage": r.get("stage")}
                for i, r in sorted(records.items()) if r.get("status") == FAILED and i in planned]
    sheet = contact_sheet(rows[:CONTACT_SHEET_IMAGES], out, out / JOB_FOLDER / "contact_sheet.png")
    return {"manifest": str(out / "metadata.jsonl"), "contact_sheet": str(sheet) if sheet else None,
            "done": len(rows), "failed": failures, "mask_warnings": mask_warning_counts(done)}


MASK_WARNING_TEXT = {
    "constant_alpha": "given mask(s) have a constant alpha channel and were read by luminance",
    "coverage_full": "mask(s) cover >= 99% of their image (likely the whole image, not an object)",
    "coverage_tiny": "mask(s) cover <= 1% of their image (likely stray pixels, not an object)",
}


def mask_warning_counts(done: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per mask warning kind over the finished items: how many, and the first files (`examples`)."""
    counts: dict[str, dict[str, Any]] = {}
    for record in done:
        for note in record.get("mask_warnings", []):
            entry = counts.setdefault(note["kind"], {"count": 0, "examples": []})
            entry["count"] += 1
            if len(entry["examples"]) < SHOWN_FILES:
                entry["examples"].append(note["file"])
    return counts


def job_warnings(config: GenerationConfig, mask_method: str, mask_warnings: dict[str, dict[str, Any]]) -> list[str]:
    """The summary's warning lines: the automatic mask fallback, then one line per mask warning kind."""
    lines = []
    if config.mask_method == "auto" and mask_method == "opencv":
        lines.append("mask_method auto fell back to the OpenCV GrabCut masks: rembg is not installed")
    for kind, entry in mask_warnings.items():
        lines.append(f"{entry['count']} {MASK_WARNING_TEXT.get(kind, kind)}, e.g. {', '.join(entry['examples'])}")
    return lines


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
        if plan.warnings:
            summary["warnings"] = plan.warnings
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
    plan = check_job(config)
    if dry_run:
        return {"dry_run": True, **plan_summary(config, plan)}
    state = state or partial_state()
    with output_lock(out, "generate", state.is_main_process):  # one writer per output folder
        return _run_generation(config, plan, state, pipeline)


def _run_generation(config: GenerationConfig, plan: JobPlan, state: Any, pipeline: Any) -> dict[str, Any]:
    """`run_generation` past its checks, with the output folder locked."""
    out = Path(config.out)
    started = time.perf_counter()
    check_shared({"out": out})  # the ledger, the shard marks and the images: one folder for every process
    if state.is_main_process:
        prepare_output(config, plan)
    state.wait_for_everyone()  # collectives only at the start (here and in building tiny models): none at the end
    ledger = Ledger(out / JOB_FOLDER / "ledger", rank=state.process_index)
    summary = {"process": state.process_index, "processes": state.num_processes, "planned": len(plan.items)}
    with heartbeat(out, state.process_index):  # the main process's wait tells a stopped process from a slow one
        mask_method, dtype, counts = run_shard(config, plan.items, ledger, state, pipeline)
    summary.update(counts)
    mark_finished(out, state.process_index, summary)
    if not state.is_main_process:
        return summary
    shards = wait_for_shards(out, state.num_processes)
    summary.update(finalize(config, plan.items, ledger))
    summary.update(plan_hash=plan.plan_hash, extended=plan.extended, skipped_inputs=plan.skipped_inputs,
                   mask_method=mask_method, dtype=dtype, shards=shards)
    warnings = plan.warnings + job_warnings(config, mask_method, summary["mask_warnings"])
    if warnings:
        summary["warnings"] = warnings
    summary["seconds"] = round(time.perf_counter() - started, 3)
    atomic_write_json(out / JOB_FOLDER / "summary.json", summary)
    return summary


def run_shard(config: GenerationConfig, plan: list[PlanItem], ledger: Ledger, state: Any,
              pipeline: Any = None) -> tuple[str, str, dict[str, int]]:
    """This process's share of the pending batches (gen.shards): the mask method is started first (an unusable
    rembg stops the job here, once), the pipeline built only when there is work. Returns (mask method, dtype,
    counts)."""
    out = Path(config.out)
    # the main process alone reads the ledger; every rank deals the same pending batches from its answer
    records = ledger.records() if state.is_main_process else {}
    done = set(main_decides(lambda: [item.index for item in plan if is_done(records.get(item.index), out)],
                            "the generation ledger check"))
    pending = [item for item in plan if item.index not in done]
    batches = pending_batches(pending, config.batch_size)
    masks = mask_index(config.masks)
    mask_method = "given" if masks is not None else start_mask_method(config.mask_method, bool(batches))
    dtype = str(resolve_dtype(config.precision, getattr(state, "device", None))).removeprefix("torch.")
    generated = failed = 0
    if batches:
        pipe = pipeline if pipeline is not None else build_pipeline(config, state)
        dtype = str(getattr(pipe, "dtype", None) or dtype).removeprefix("torch.")
        mine = [batches[i] for i in share(len(batches), state.process_index, state.num_processes)]
        bar = progress(total=sum(len(b) for b in mine), desc=f"generate ({state.num_processes} process(es))",
                       unit="img", disable=not state.is_main_process)
        for batch in mine:
            done, bad = generate_batch(pipe, batch, config, ledger, masks, mask_method, dtype)
            generated, failed = generated + done, failed + bad
            bar.set_postfix(done=generated, failed=failed)
            bar.update(len(batch))
        bar.close()
    return mask_method, dtype, {"skipped": len(plan) - len(pending), "generated_here": generated,
                                "failed_here": failed}


def start_mask_method(method: str, needed: bool) -> str:
    """The automatic mask method that will run (`resolve_mask_method`); when masks are `needed` and it is rembg, its
    session is created now, so that a missing package or model stops the job once (`MaskModelError`)."""
    try:
        resolved = resolve_mask_method(method)
    except ImportError as err:
        if needed:
            raise MaskModelError(str(err)) from err
        return method
    if needed and resolved == "rembg":
        open_rembg()
    return resolved
