"""The one prepared GPU benchmark: full-size architectures with random weights (nothing is downloaded).

Section "train": a full-size ResNet-50 trained with the recipe loop (bf16 autocast, channels-last, batch 256) and its
feature extraction, each against a minimal PyTorch loop in the same process (`benchmarks.cases.train`).
Section "zest": SDXL base UNet + depth ControlNet + VAE + IP-Adapter (ViT-H encoder, image projection) + DPT-hybrid,
built from the real hub configs (pipelines/hub_configs, pipelines.tiny.zest_configs("full")) directly on the GPU in bf16
(DPT in fp32), run through `ZeSTPipeline.generate` at 1024 px, 30 steps. Reports images/s per batch size for each
attention backend (SDPA, xformers when importable), eager and torch.compile, with peak GPU memory, and the
one-at-a-time loop (batch 1 repeated) as the ratio reference measured in the same process. Each compiled batch size
gets a fresh build, so every compilation sees one static shape. Results go to benchmarks/gpu.json, rewritten after
every case. A wall-clock budget (`--budget-s`, default 420 s) skips, and records as skipped, the cases that would
not fit.

    python -m benchmarks.gpu                          # everything that fits in 7 minutes (under 8 with start-up)
    python -m benchmarks.gpu --quick                  # batch sizes 1 and 4, no compile: about 2 minutes
    python -m benchmarks.gpu --sections zest --batch-sizes 1,8 --no-compile
    python -m benchmarks.gpu --dry-run                # tiny models on the CPU: checks the script end to end
    python -m benchmarks.gpu --plan                   # the cases the budget lets run, from its first guesses

Every section measures its core (ZeST's sdpa build, one-at-a-time loop and first batch sizes; both DIFFGUARD parts;
the training case): while a section runs, the budget holds back the first-guess time of the later sections' cores, so
ZeST's larger batch sizes, xformers and compiled cases take only what is left.
"""
from __future__ import annotations

import argparse
import importlib.util
import platform
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from pipelines.cli import README_SECTIONS, comma_list, int_list, parser, run_main
from pipelines.errors import ConfigError
from pipelines.io import atomic_write_json
from pipelines.runtime import resolve_device


def _synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)


def _peak_gib(device: torch.device) -> float | None:
    return torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None


def _timed(fn: Callable[[], Any], device: torch.device) -> float:
    """Wall seconds of one call, synchronised on the device."""
    _synchronize(device)
    start = time.perf_counter()
    fn()
    _synchronize(device)
    return time.perf_counter() - start


def _zest_inputs(n: int, size: int, seed: int = 0) -> tuple[list[Image.Image], list[Image.Image], list[Image.Image]]:
    """Smooth random targets and exemplars with a centred elliptical mask (given, so no mask model runs)."""
    rng = np.random.default_rng(seed)
    grid = np.linspace(0, 1, size)

    def smooth() -> Image.Image:
        a, b, c = rng.uniform(0.5, 4, 3)
        base = np.stack([np.sin(a * np.pi * grid)[:, None] * np.cos(b * np.pi * grid)[None, :] + c * k
                         for k in (0.1, 0.2, 0.3)], axis=-1)
        base = (base - base.min()) / (np.ptp(base) + 1e-9)
        return Image.fromarray((255 * base).astype(np.uint8), mode="RGB")

    yy, xx = np.mgrid[:size, :size]
    ellipse = ((xx - size / 2) / (size / 3)) ** 2 + ((yy - size / 2) / (size / 2.5)) ** 2 <= 1
    mask = Image.fromarray(np.where(ellipse, 255, 0).astype(np.uint8), mode="L")
    return [smooth() for _ in range(n)], [smooth() for _ in range(n)], [mask] * n


class Budget:
    """Wall-clock budget of the whole run: a case starts only when its estimated duration fits in what is left;
    otherwise it is recorded as skipped. Estimates come from finished cases of the same kind (scaled by batch size),
    else from `first_guess_s`."""

    def __init__(self, seconds: float | None, first_guess_s: dict[str, float]):
        self.seconds, self.first_guess_s = seconds, first_guess_s
        self.started = time.perf_counter()
        self.done: dict[str, tuple[float, int]] = {}  # kind -> (seconds, batch) of the last finished case
        self.held = 0.0  # seconds kept for the core cases of the sections still to run (`hold`)

    def elapsed(self) -> float:
        return time.perf_counter() - self.started

    def left(self) -> float:
        return float("inf") if self.seconds is None else self.seconds - self.elapsed() - self.held

    def hold(self, sections: list[str]) -> None:
        """Keep the estimated time of `sections`' core cases (`SECTION_CORE`) out of what the running section may
        spend, so every section measures its core (ZeST's extra batch sizes, xformers and compile come last)."""
        self.held = sum(self.estimate(kind) for name in sections for kind in SECTION_CORE.get(name, ()))

    def estimate(self, kind: str, batch: int = 1) -> float:
        if kind in self.done:
            seconds, done_batch = self.done[kind]
            return seconds * max(1.0, batch / done_batch)
        return self.first_guess_s.get(kind, 0.0)

    def allows(self, kind: str, batch: int = 1, then: tuple[str, int] | None = None) -> tuple[bool, str]:
        """Whether a case of `kind` fits (with `then`, the case that must follow it: a build and its first case)."""
        estimate, left = self.estimate(kind, batch) + (self.estimate(*then) if then else 0.0), self.left()
        held = f" ({self.held:.0f} s more held for the later sections)" if self.held else ""
        return estimate <= left, f"budget: estimated {estimate:.0f} s, {max(left, 0):.0f} s left{held}"

    def record(self, kind: str, seconds: float, batch: int = 1) -> None:
        self.done[kind] = (seconds, batch)


def _zest_case(zest: Any, label: str, batch: int, inputs: tuple[list, list, list], call: dict[str, Any],
               warm_call: dict[str, Any], device: torch.device, build_s: float) -> dict[str, Any]:
    """Warm up (few steps: same shapes, so the same compiled graphs) then time one batched call."""
    targets, materials, masks = inputs
    batch_inputs = (targets[:batch], materials[:batch], masks[:batch])
    seeds = list(range(batch))
    warm = _timed(lambda: zest.generate(*batch_inputs, seeds=seeds, **warm_call), device)
    _reset_peak(device)
    seconds = _timed(lambda: zest.generate(*batch_inputs, seeds=seeds, **call), device)
    case = dict(case=label, mode="batched", batch_size=batch, images=batch, seconds=seconds,
                images_per_s=batch / seconds, warmup_s=warm, peak_gib=_peak_gib(device), build_s=build_s)
    print(f"[zest] {label:16s} batch {batch}: {batch / seconds:.3f} img/s, peak {case['peak_gib'] or 0:.1f} GiB, "
          f"warm-up {warm:.1f} s, build {build_s:.1f} s", flush=True)
    return case


def _zest_runs(args: argparse.Namespace, backends: list[str]) -> list[tuple[str, bool, list[int]]]:
    """(backend, compiled, batch sizes per build) in run order: eager builds time every batch size (plus the loop);
    compiled builds are fresh per batch size, so each compiles one static shape."""
    runs = [(backend, False, list(args.batch_sizes)) for backend in backends]
    if args.compile:
        runs += [(backend, True, [batch]) for backend in backends if backend in args.compile_backends
                 for batch in args.compile_batch_sizes]
    return runs


def bench_zest(args: argparse.Namespace, budget: Budget, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """ZeST images/s for each (attention, compile, batch size) case; ratios against the one-at-a-time loop.
    `save(section)` is called after every case, so a run cut short keeps what it measured."""
    from gen.tiny_zest import random_zest_pipeline
    from pipelines.runtime import xformers_available

    device = resolve_device(args.device)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    size = "tiny" if args.dry_run else "full"
    backends = ["sdpa"] + (["xformers"] if xformers_available() and not args.no_xformers else [])
    inputs = _zest_inputs(max(args.batch_sizes + args.compile_batch_sizes + [args.loop_images]), args.image_size)
    call = dict(num_inference_steps=args.steps, resolution=args.resolution)
    warm_call = dict(call, num_inference_steps=min(args.steps, args.warmup_steps))
    section: dict[str, Any] = dict(model_size=size, dtype=str(dtype).removeprefix("torch."), resolution=args.resolution,
                                   steps=args.steps, backends=backends, reference="sdpa one-at-a-time loop", cases=[])
    cases: list[dict[str, Any]] = section["cases"]
    baselines: dict[str, float] = {}

    def add(case: dict[str, Any]) -> None:
        reference = baselines.get("sdpa")
        if "images_per_s" in case:
            case["speedup_vs_sdpa_loop"] = case["images_per_s"] / reference if reference else None
        cases.append(case)
        save(section)

    for backend, compiled, batches in _zest_runs(args, backends):
        label = f"{backend}{'+compile' if compiled else ''}"
        kind = "compile" if compiled else "eager"
        fits, why = budget.allows(f"{kind}-build", batches[0], then=(f"{kind}-case", batches[0]))
        if not fits:
            for batch in batches:
                add(dict(case=label, batch_size=batch, skipped=why))
            print(f"[zest] {label}: skipped ({why})", flush=True)
            continue
        try:
            started = time.perf_counter()
            zest = random_zest_pipeline(size, device, dtype, attention=backend, compile=compiled)
            build_s = time.perf_counter() - started
            if not compiled:  # the reference: one image at a time, batch 1 repeated
                case = _zest_loop(zest, label, inputs, call, warm_call, device, args.loop_images, build_s)
                baselines[backend] = case["images_per_s"]
                add(case)
            budget.record(f"{kind}-build", time.perf_counter() - started, batches[0])
            for batch in batches:
                fits, why = budget.allows(f"{kind}-case", batch)
                if not fits:
                    add(dict(case=label, batch_size=batch, skipped=why))
                    print(f"[zest] {label} batch {batch}: skipped ({why})", flush=True)
                    continue
                started = time.perf_counter()
                add(_zest_case(zest, label, batch, inputs, call, warm_call, device, build_s))
                budget.record(f"{kind}-case", time.perf_counter() - started, batch)
            del zest
        except Exception as err:  # one failing case (e.g. a compile error) must not lose the others
            add(dict(case=label, error=f"{type(err).__name__}: {err}"))
            print(f"[zest] {label}: FAILED {type(err).__name__}: {err}", flush=True)
        _reset_peak(device)
    _print_zest_table(cases)
    return section


def _zest_loop(zest: Any, label: str, inputs: tuple[list, list, list], call: dict[str, Any], warm_call: dict[str, Any],
               device: torch.device, loop_images: int, build_s: float) -> dict[str, Any]:
    """The reference case: `loop_images` images generated one at a time (batch 1 repeated) after one warm-up."""
    targets, materials, masks = inputs
    zest.generate(targets[:1], materials[:1], masks[:1], seeds=[0], **warm_call)
    _reset_peak(device)
    seconds = _timed(lambda: [zest.generate([targets[i]], [materials[i]], [masks[i]], seeds=[i], **call)
                              for i in range(loop_images)], device)
    print(f"[zest] {label:16s} loop of {loop_images}: {loop_images / seconds:.3f} img/s", flush=True)
    return dict(case=label, mode="loop", batch_size=1, images=loop_images, seconds=seconds,
                images_per_s=loop_images / seconds, peak_gib=_peak_gib(device), build_s=build_s)


def _print_zest_table(cases: list[dict[str, Any]]) -> None:
    print("\n| case | batch | img/s | x vs SDPA loop | peak GiB |\n|---|---|---|---|---|")
    for case in (c for c in cases if "images_per_s" in c):
        peak = f"{case['peak_gib']:.1f}" if case["peak_gib"] is not None else "-"
        batch = "loop" if case["mode"] == "loop" else case["batch_size"]
        ratio = f"{case['speedup_vs_sdpa_loop']:.2f}" if case.get("speedup_vs_sdpa_loop") else "-"
        print(f"| {case['case']} | {batch} | {case['images_per_s']:.3f} | {ratio} | {peak} |")


def bench_diffguard(args: argparse.Namespace, budget: Budget, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """DIFFGUARD on the full-size ADM 256 (pixel) and Stable Diffusion 1.5 (latent) with a ResNet-50, random weights:
    images/s per batch size against the batch-1 loop (the original design's limit under per-sample early stop).
    Its two parts are the cases (each saved when done, each skipped when the budget cannot hold it)."""
    import detectors
    from benchmarks.cases.diffguard import (
        bench_early_stop_batching,
        bench_latent_batching,
        contrast_ramp_images,
        random_diffguard_models,
    )

    device = resolve_device(args.device)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    size = "tiny" if args.dry_run else "full"
    result: dict[str, Any] = dict(model_size=size, dtype=str(dtype).removeprefix("torch."))
    fits, why = budget.allows("diffguard-pixel")
    if not fits:
        print(f"[diffguard] skipped ({why})", flush=True)
        return dict(result, skipped=why)
    started = time.perf_counter()
    unet, pipe, classifier = random_diffguard_models(size, device, dtype)
    steps = 10 if args.dry_run else 100
    common = dict(classifier=classifier, distance="ssim", early_stop_similarity=None)
    pixel = detectors.build("diffguard", unet=unet, steps=steps, max_inversion_steps=int(0.9 * steps),
                            early_stop_psnr=15.0,
                            precision="fp32" if args.dry_run else "fp16", **common)  # fp16: the official ADM precision
    side = int(unet.config.sample_size)
    images = contrast_ramp_images(max(args.batch_sizes), side)
    result.update(pixel_steps=steps, pixel=bench_early_stop_batching(pixel, images, args.batch_sizes, args.loop_images))
    budget.record("diffguard-pixel", time.perf_counter() - started)
    save(result)
    del pixel, unet
    _reset_peak(device)
    fits, why = budget.allows("diffguard-latent")
    if not fits:
        print(f"[diffguard] latent skipped ({why})", flush=True)
        return dict(result, latent={"skipped": why})
    started = time.perf_counter()
    latent = detectors.build("diffguard", backend="latent", pipeline=pipe, latent_steps=5 if args.dry_run else 25,
                             class_names=[f"class {i}" for i in range(classifier.num_classes)],
                             precision="fp32" if args.dry_run else "bf16", **common)
    result["latent"] = bench_latent_batching(latent, images, args.batch_sizes, args.loop_images)
    budget.record("diffguard-latent", time.perf_counter() - started)
    result["peak_gib"] = _peak_gib(device)
    return result


def bench_train(args: argparse.Namespace, budget: Budget, save: Callable[[dict[str, Any]], None]) -> dict[str, Any]:
    """ResNet-50 classifier training (full size, random weights, bf16 autocast, channels-last, batch 256, the recipe's
    random resized crop at 224) and feature extraction, each against a minimal hand-written PyTorch loop on the same
    model and synthetic JPEGs in this process (benchmarks.cases.train.measure); DataLoader workers decode."""
    import tempfile

    from benchmarks.cases.train import synthetic_manifest

    fits, why = budget.allows("train-resnet50")
    if not fits:
        print(f"[train] skipped ({why})", flush=True)
        return dict(skipped=why)
    from benchmarks.cases.train import measure

    device = resolve_device(args.device)
    size, batch = ("tiny", 8) if args.dry_run else ("full", args.train_batch_size)
    started = time.perf_counter()
    classifier = _resnet_classifier(size, 32 if args.dry_run else 224)
    with tempfile.TemporaryDirectory() as scratch:
        manifest = (synthetic_manifest(Path(scratch), batch * (2 if args.dry_run else args.train_steps),
                                       48 if args.dry_run else 256))
        numbers = measure(classifier, manifest, epochs=1, batch_size=batch,
                          num_workers=0 if args.dry_run else args.train_workers,
                          precision="fp32" if args.dry_run else "bf16", channels_last=device.type == "cuda",
                          device=device, repeats=1 if args.dry_run else 2)
    budget.record("train-resnet50", time.perf_counter() - started)
    numbers["peak_gib"] = _peak_gib(device)
    print(f"[train] ResNet-50 ({size}) batch {batch}: {numbers['train_images_per_s']:.1f} img/s "
          f"(x{numbers['train_ratio']:.2f} vs plain loop), features {numbers['feature_images_per_s']:.1f} img/s",
          flush=True)
    return dict(model=f"microsoft/resnet-50 ({size}, random weights)", batch_size=batch,
                dtype="fp32" if args.dry_run else "bf16", channels_last=device.type == "cuda", **numbers)


def _resnet_classifier(size: str, image_size: int) -> Any:
    """A random-weight ResNet-50 (real hub config, or the tiny stand-in) with 100 classes, processor at image_size."""
    import json
    import tempfile

    from transformers import AutoImageProcessor

    from pipelines.classifier import ImageClassifier
    from pipelines.tiny import RESNET_ID, build_model, full_config, tiny_config

    config = {k: v for k, v in (tiny_config if size == "tiny" else full_config)(RESNET_ID).items() if k != "num_labels"}
    config.update(id2label={str(i): f"c{i}" for i in range(100)}, label2id={f"c{i}": i for i in range(100)})
    torch.manual_seed(0)
    model = build_model(config)
    with tempfile.TemporaryDirectory() as scratch:
        processor = {**full_config(RESNET_ID, "preprocessor_config.json"), "size": {"shortest_edge": image_size}}
        (Path(scratch) / "preprocessor_config.json").write_text(json.dumps(processor))
        return ImageClassifier.from_model(model, AutoImageProcessor.from_pretrained(scratch), f"resnet-50-{size}")


DEFAULT_BUDGET_S = 420.0  # 7 minutes of cases; imports, CUDA start-up and the JSON writes fit in the eighth
# first guesses on one H200 (full size, bf16, 1024 px, 30 steps) before a case of the kind has run; from the published
# SDXL timings in REFERENCE.md scaled to an H200, plus ZeST's ControlNet; the compiled case includes the compilation
H200_FIRST_GUESS_S = {"eager-build": 40.0, "eager-case": 8.0, "compile-build": 20.0, "compile-case": 150.0,
                      "diffguard-pixel": 90.0, "diffguard-latent": 60.0, "train-resnet50": 120.0}

# what each section must measure at least: its reference and one comparison (checked by `plan` against the budget)
SECTION_CORE = {"zest": ("eager-build", "eager-case", "eager-case"),
                "diffguard": ("diffguard-pixel", "diffguard-latent"), "train": ("train-resnet50",)}


class _Planned(Budget):
    """A budget whose clock is the sum of the estimates of the cases planned so far (no case runs)."""

    def __init__(self, seconds: float | None, first_guess_s: dict[str, float]):
        super().__init__(seconds, first_guess_s)
        self.clock = 0.0

    def elapsed(self) -> float:
        return self.clock

    def take(self, kind: str, batch: int = 1, then: tuple[str, int] | None = None) -> tuple[bool, float]:
        fits, _ = self.allows(kind, batch, then)
        estimate = self.estimate(kind, batch)
        if fits:
            self.clock += estimate
            self.record(kind, estimate, batch)
        return fits, estimate


def plan(args: argparse.Namespace, backends: list[str] | None = None) -> list[dict[str, Any]]:
    """The cases a run with `args` would start on one H200, in order, from the first guesses and the same budget
    rules as the run (`Budget`, `hold`): each with its estimate and whether it fits."""
    budget = _Planned(args.budget_s, H200_FIRST_GUESS_S)
    rows: list[dict[str, Any]] = []

    def add(section: str, case: str, kind: str, batch: int = 1, then: tuple[str, int] | None = None) -> bool:
        fits, estimate = budget.take(kind, batch, then)
        rows.append(dict(section=section, case=case, batch_size=batch, estimate_s=round(estimate, 1), runs=fits))
        return fits

    for i, name in enumerate(args.sections):
        budget.hold(args.sections[i + 1:])
        if name == "zest":
            for backend, compiled, batches in _zest_runs(args, backends or ["sdpa"]):
                kind = "compile" if compiled else "eager"
                label = f"{backend}{'+compile' if compiled else ''}"
                if add(name, f"{label} build{'' if compiled else ' + one-at-a-time loop'}", f"{kind}-build",
                       batches[0], (f"{kind}-case", batches[0])):
                    for batch in batches:
                        add(name, label, f"{kind}-case", batch)
        elif name == "diffguard" and add(name, "pixel (ADM 256)", "diffguard-pixel"):
            add(name, "latent (SD 1.5)", "diffguard-latent")
        elif name == "train":
            add(name, "resnet-50 recipe loop", "train-resnet50")
    return rows


SECTIONS: dict[str, Callable[[argparse.Namespace, Budget, Callable[[dict[str, Any]], None]], dict[str, Any]]] = {
    "zest": bench_zest,
    "diffguard": bench_diffguard,
    "train": bench_train,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__, out=True)
    p.set_defaults(out=Path(__file__).with_suffix(".json"))
    p.add_argument("--sections", type=comma_list, default=list(SECTIONS),
                   help=f"comma-separated subset of {list(SECTIONS)}")
    p.add_argument("--batch-sizes", type=int_list, default=[1, 2, 4, 8])
    p.add_argument("--compile-batch-sizes", type=int_list, default=[1, 4],
                        help="batch sizes timed with torch.compile (each new shape recompiles, so keep this short)")
    p.add_argument("--compile-backends", type=comma_list, default=["sdpa"],
                        help="attention backends also timed with torch.compile")
    p.add_argument("--warmup-steps", type=int, default=4)
    p.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile cases")
    p.add_argument("--no-xformers", action="store_true", help="skip xformers even when importable")
    p.add_argument("--loop-images", type=int, default=2, help="images in the one-at-a-time reference loop")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--resolution", type=int, default=1024)
    p.add_argument("--image-size", type=int, default=768, help="side of the synthetic input images")
    p.add_argument("--quick", action="store_true", help="batch sizes 1 and 4, no compile")
    p.add_argument("--dry-run", action="store_true",
                        help="tiny models, fp32, 64 px, 3 steps, batch sizes 1,2, no compile: checks the script on CPU")
    p.add_argument("--budget-s", type=float, default=DEFAULT_BUDGET_S,
                        help="wall-clock budget of the whole run: a case that would not fit (estimated from the cases "
                             "already run, else from H200 first guesses) is recorded as skipped; default keeps a full "
                             "run under 8 minutes on one H200")
    p.add_argument("--no-budget", dest="budget_s", action="store_const", const=None, help="run every case")
    p.add_argument("--plan", action="store_true",
                   help="print the cases the budget lets run on one H200 (first guesses) and exit; no device needed")
    p.add_argument("--train-batch-size", type=int, default=256, help="ResNet-50 training case: global batch")
    p.add_argument("--train-steps", type=int, default=8, help="ResNet-50 training case: steps (images = steps x batch)")
    p.add_argument("--train-workers", type=int, default=8, help="ResNet-50 training case: DataLoader workers")
    p.add_argument("--device", default=None)
    args = p.parse_args(argv)
    unknown = sorted(set(args.sections) - set(SECTIONS))
    if unknown:
        p.error(f"unknown section(s) {unknown}; available: {list(SECTIONS)}")
    if args.quick:
        args.batch_sizes, args.compile = [1, 4], False
    if args.dry_run:
        args.batch_sizes, args.compile, args.steps, args.resolution, args.image_size = [1, 2], False, 3, 64, 48
        args.out = args.out.with_name(args.out.stem + "_dry_run.json")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.plan:
        rows = plan(args)
        for row in rows:
            print(f"{row['section']:<10} {row['case']:<40} batch {row['batch_size']:<3} {row['estimate_s']:>6.0f} s  "
                  f"{'runs' if row['runs'] else 'skipped'}")
        print(f"planned: {sum(r['estimate_s'] for r in rows if r['runs']):.0f} s of the {args.budget_s} s budget")
        return
    device = resolve_device(args.device)
    if device.type != "cuda" and not args.dry_run:
        raise ConfigError("benchmarks.gpu needs a CUDA device; use --dry-run to check it on the CPU with tiny models")
    result: dict[str, Any] = {
        "benchmark": "gpu", "created": datetime.now(UTC).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "dry_run": args.dry_run,
        "xformers": importlib.util.find_spec("xformers") is not None, "sections": {},
    }
    budget = Budget(args.budget_s, {} if args.dry_run else H200_FIRST_GUESS_S)
    result["budget_s"] = args.budget_s

    def saver(name: str) -> Callable[[dict[str, Any]], None]:
        def save(section: dict[str, Any]) -> None:  # after every case: a run cut short keeps what it measured
            result["sections"][name] = section
            result["elapsed_s"] = time.perf_counter() - budget.started
            atomic_write_json(args.out, result)
        return save

    for i, name in enumerate(args.sections):
        budget.hold(args.sections[i + 1:])
        started = time.perf_counter()
        section = SECTIONS[name](args, budget, saver(name))
        section["section_s"] = time.perf_counter() - started
        saver(name)(section)
    print(f"\nwrote {args.out} after {time.perf_counter() - budget.started:.0f} s "
          f"(budget {args.budget_s if args.budget_s is not None else 'none'} s)")


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
