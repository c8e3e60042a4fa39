"""What a training run will cost, told by its dry run: the hours of its data loading at the loader rate a benchmark
measured (images a second per core, one loader worker a core, the rate measured on images nearest in size to the
run's), the hours of the model's steps on the device the run will use (a GPU: the rate recorded for one; the CPU: one
training step of the model's architecture timed here, `cpu_rate`), and the disk its model folders and checkpoints
take.

Rates come from `benchmarks/` (the first that holds a per-core loader rate): `scale_data.json` (`loader_rates`,
`benchmarks/scale_data.py`), `decode.json` (the train stage at camera size, full decode and draft,
`benchmarks/decode.py`) and `train.json` (the loader with no workers, `benchmarks/train.py`). The loading time
assumes the rate scales with the workers (each worker on its own core); with no workers the main process loads on one.
"""
from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.progress import duration_text

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SOURCES = ("scale_data.json", "decode.json", "train.json")
RESNET50_BACKBONE = 23_508_032
"""Parameters of ResNet-50 without its classifier (torchvision's resnet50: 25,557,032 minus fc's 2,049,000)."""
RESNET50_FEATURES = 2048
PROBE_SIZE, PROBE_BATCH = 64, 4
"""The CPU probe's image side and batch (`cpu_rate`): a second or two for ResNet-50 on two cores."""
DEFAULT_IMAGE_SIZE = 224
"""The crop assumed when `image_size` is null: the default model's processor (microsoft/resnet-50) crops 224 px."""
WEIGHT_COPIES = 6
"""fp32 copies of the weights a run leaves: the last model folder, best/, checkpoint.safetensors (weights and AdamW's
two moments) and checkpoint.best.safetensors (`pipelines.training.classify`)."""


@dataclass(frozen=True)
class LoaderRate:
    """A measured training-loader rate: images a second on one core, the megapixels of the images it read, whether
    JPEGs were drafted (None: not recorded) and where it comes from."""

    images_per_s: float
    megapixels: float
    draft: bool | None
    source: str


@dataclass(frozen=True)
class TrainCost:
    """A run's estimate: samples loaded (epochs x (train + val rows)), the cores loading them, the rate used, the
    loading seconds, the model steps' rate, seconds and source on the run's device (None: no rate known) and the disk
    bytes (None: model size unknown)."""

    samples: int
    cores: int
    rate: LoaderRate | None
    loading_s: float | None
    steps_images_per_s: float | None
    steps_s: float | None
    steps_source: str | None
    disk_bytes: int | None


def _read(path: Path) -> dict[str, Any] | None:
    try:
        found = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return found if isinstance(found, dict) else None


def _positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and value > 0


def read_rates(folder: str | os.PathLike = BENCHMARKS) -> list[LoaderRate]:
    """Every per-core training-loader rate the benchmark records in `folder` hold (`SOURCES`, in that order)."""
    folder, rates = Path(folder), []
    record = _read(folder / "scale_data.json") or {}
    for entry in record.get("loader_rates") or []:
        if (isinstance(entry, dict) and _positive(entry.get("images_per_s_per_core"))
                and _positive(entry.get("megapixels"))):
            rates.append(LoaderRate(float(entry["images_per_s_per_core"]), float(entry["megapixels"]),
                                    entry.get("draft"), f"benchmarks/scale_data.json ({entry.get('what', 'loader')})"))
    record = _read(folder / "decode.json") or {}
    train, mp = (record.get("stages") or {}).get("train") or {}, (record.get("settings") or {}).get("megapixels")
    if _positive(mp) and record.get("workers", 0) == 0:
        for key, draft in (("ours_img_s", False), ("ours_draft_img_s", True)):
            if _positive(train.get(key)):
                rates.append(LoaderRate(float(train[key]), float(mp), draft,
                                        f"benchmarks/decode.json (train stage, {'draft' if draft else 'full decode'})"))
    record = _read(folder / "train.json") or {}
    side, settings = (record.get("settings") or {}).get("side"), record.get("settings") or {}
    if _positive(record.get("loader_images_per_s")) and _positive(side) and settings.get("workers", 0) == 0:
        rates.append(LoaderRate(float(record["loader_images_per_s"]), side * side / 1e6, None,
                                f"benchmarks/train.json (loader, {side} px images)"))
    return rates


def pick_rate(rates: Iterable[LoaderRate], megapixels: float | None, draft: bool) -> LoaderRate | None:
    """The rate measured on images nearest in size to `megapixels` (ratio, not difference), among those decoded as
    `draft` says (or not recorded; any when none matches); without a size, the slowest (the cautious choice)."""
    rates = list(rates)
    matching = [r for r in rates if r.draft in (draft, None)] or rates
    if not matching:
        return None
    if megapixels is None or megapixels <= 0:
        return min(matching, key=lambda r: r.images_per_s)
    return min(matching, key=lambda r: (abs(math.log(r.megapixels / megapixels)), r.images_per_s))


def image_megapixels(paths: Iterable[Any], limit: int = 16) -> float | None:
    """The mean megapixels of up to `limit` of `paths` (headers only; unreadable ones skipped; None: none read)."""
    from PIL import Image

    sizes = []
    for path in paths:
        if len(sizes) >= limit:
            break
        source = path if hasattr(path, "open") else Path(path)
        try:
            with source.open("rb") as fh, Image.open(fh) as img:
                sizes.append(img.size[0] * img.size[1] / 1e6)
        except Exception:  # a missing or broken image: the run records it; the estimate reads the others
            continue
    return sum(sizes) / len(sizes) if sizes else None


def gpu_rate(folder: str | os.PathLike = BENCHMARKS, image_size: int | None = None,
             precision: str | None = None) -> tuple[float | None, str | None]:
    """(images a second, where it comes from) of the model's training steps on a GPU as `scale_data.json` records
    it (`gpu`, or `gpu_fp32_protocol` for an fp32 run; each an assumption it names, unless measured), scaled by the
    pixels a sample from its `image_size` to the run's; (None, None) when none is recorded."""
    record = _read(Path(folder) / "scale_data.json") or {}
    gpu = (record.get("gpu_fp32_protocol") if precision == "fp32" else None) or record.get("gpu") or {}
    if not _positive(gpu.get("images_per_s")):
        return None, "no GPU rate recorded in benchmarks/scale_data.json"
    rate, source = float(gpu["images_per_s"]), str(gpu.get("source", "benchmarks/scale_data.json"))
    if _positive(gpu.get("image_size")) and image_size and image_size != gpu["image_size"]:
        rate *= (gpu["image_size"] / image_size) ** 2
        source += f"; scaled to {image_size} px by the pixels a sample"
    return rate, source


def weights_bytes(model: str, classes: int) -> int | None:
    """fp32 bytes of the trained model's weights: ResNet-50 (the default hub id, any id or file naming resnet-50 /
    resnet50) with a `classes`-way head; a local model folder or file: its weight files' size; else None."""
    path = Path(model)
    if path.is_file() and not model.lower().endswith(".pth"):
        return path.stat().st_size
    if path.is_dir():
        found = sum(p.stat().st_size for p in path.iterdir() if p.suffix in (".safetensors", ".bin") and p.is_file())
        return found or None
    if "resnet-50" in model.lower() or "resnet50" in model.lower():
        return 4 * (RESNET50_BACKBONE + RESNET50_FEATURES * classes + classes)
    return None


def estimate(*, train_rows: int, val_rows: int, epochs: int, workers: int, rate: LoaderRate | None,
             steps_images_per_s: float | None = None, steps_source: str | None = None,
             weights: int | None = None) -> TrainCost:
    """The arithmetic: epochs x (train + val rows) samples over `rate` x max(workers, 1) cores; the same samples over
    the model steps' rate; `WEIGHT_COPIES` x the weights' bytes on disk."""
    samples = epochs * (train_rows + val_rows)
    cores = max(int(workers), 1)
    loading = samples / (rate.images_per_s * cores) if rate is not None else None
    steps = samples / steps_images_per_s if steps_images_per_s else None
    disk = WEIGHT_COPIES * weights if weights is not None else None
    return TrainCost(samples, cores, rate, loading, steps_images_per_s, steps, steps_source, disk)


def cpu_rate(model: str, classes: int, image_size: int | None, *, probe_size: int = PROBE_SIZE,
             batch: int = PROBE_BATCH) -> tuple[float | None, str]:
    """(images a second, where it comes from) of the model's training steps on this machine's CPU: one AdamW step of
    the model's architecture (random weights, `classes` outputs; its config only, no weights loaded) on `batch`
    images of `probe_size` px, timed after one warm-up step, scaled to the run's `image_size` (None:
    `DEFAULT_IMAGE_SIZE`) by the pixels a sample (ResNet-50 at 64 and 112 px: the same FLOP rate within 5% here).
    (None, why) when the architecture cannot be built offline."""
    import time

    import torch
    from transformers import AutoConfig, AutoModelForImageClassification

    from pipelines.training.classify import config_source

    size = image_size or DEFAULT_IMAGE_SIZE
    try:
        config = AutoConfig.from_pretrained(config_source(model), num_labels=classes, local_files_only=True)
        net = AutoModelForImageClassification.from_config(config)
    except Exception as err:  # noqa: BLE001 - any failure only means no estimate; the run itself reports it
        return None, f"{model}'s architecture could not be built here ({type(err).__name__})"
    side = min(probe_size, size)
    x, y = torch.randn(batch, 3, side, side), torch.arange(batch) % classes
    optimizer = torch.optim.AdamW(net.parameters())
    seconds = 0.0
    for _ in range(2):  # the first step warms up the kernels; the second is timed
        start = time.perf_counter()
        loss = torch.nn.functional.cross_entropy(net(pixel_values=x).logits, y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seconds = time.perf_counter() - start
    rate = batch / max(seconds, 1e-9) * (side / size) ** 2
    return rate, (f"measured here: one training step of {batch} images at {side} px on the CPU, "
                  f"{torch.get_num_threads()} threads, scaled to {size} px by the pixels a sample")


def step_rate(config: Any, classes: int, folder: str | os.PathLike = BENCHMARKS) -> tuple[float | None, str | None]:
    """The model steps' (images a second, source) on the device the run will use: a GPU's recorded rate
    (`gpu_rate`), or the CPU's measured one (`cpu_rate`)."""
    from pipelines.runtime import resolve_device

    if resolve_device().type == "cuda":
        return gpu_rate(folder, config.image_size, config.precision)
    return cpu_rate(str(config.model), classes, config.image_size)


def describe(cost: TrainCost, workers: int) -> list[str]:
    """The estimate as the dry run prints it."""
    who = f"{workers} loader workers" if workers else "the main process (no loader workers)"
    if cost.rate is None:
        lines = [f"estimate: {cost.samples:,} images to load ({who}) at a rate not measured here: no per-core loader "
                 f"rate in benchmarks/ ({', '.join(SOURCES)}; run python -m benchmarks.scale_data)"]
    else:
        lines = [f"estimate: data loading {duration_text(cost.loading_s)} for {cost.samples:,} images (epochs x "
                 f"(train + val rows)) on {who}, {cost.cores} core(s) at {cost.rate.images_per_s:,.0f} images/s per "
                 f"core (measured on {cost.rate.megapixels:.2g} MP images: {cost.rate.source})"]
    if cost.steps_s is not None:
        value = cost.steps_images_per_s
        rate = f"{value:,.0f}" if value >= 100 else f"{value:.3g}"  # a GPU's thousands, a CPU's few
        lines.append(f"estimate: model steps {duration_text(cost.steps_s)} at {rate} images/s ({cost.steps_source}); "
                     "the run takes at least the longer of the two")
    else:
        lines.append(f"estimate: the model's own steps are not included ({cost.steps_source or 'no rate known'})")
    lines.append(f"estimate: disk {cost.disk_bytes / 1e9:.2f} GB (model folders and checkpoints, fp32)"
                 if cost.disk_bytes is not None else "estimate: disk of the model folders not known before the model "
                                                     "loads (a model of unknown size)")
    return lines


def training_cost(config: Any, plan: Any, folder: str | os.PathLike = BENCHMARKS) -> str:
    """The dry run's estimate lines for a `TrainConfig` and its `TrainingPlan` (`check_training`)."""
    train, val = plan.train, plan.val
    megapixels = image_megapixels(train.path(row) for row in train.rows[:: max(1, len(train.rows) // 16)])
    workers = config.workers()
    steps, source = step_rate(config, len(plan.class_names), folder)
    cost = estimate(train_rows=len(train), val_rows=0 if val is None else len(val), epochs=int(config.epochs),
                    workers=workers, rate=pick_rate(read_rates(folder), megapixels, bool(config.draft)),
                    steps_images_per_s=steps, steps_source=source,
                    weights=weights_bytes(str(config.model), len(plan.class_names)))
    return "\n".join(describe(cost, workers))
