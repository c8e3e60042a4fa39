"""The one prepared GPU benchmark: full-size architectures with random weights (nothing is downloaded).

Section "zest": SDXL base UNet + depth ControlNet + VAE + IP-Adapter (ViT-H encoder, image projection) + DPT-hybrid,
built from the real hub configs (tests/fixtures/hub, pipelines.tiny.zest_configs("full")) directly on the GPU in bf16, run through
`ZeSTPipeline.generate` at 1024 px, 30 steps. Reports images/s per batch size for each attention backend (SDPA,
xformers when importable), eager and torch.compile, with peak GPU memory, and the one-at-a-time loop (batch 1
repeated) as the ratio reference measured in the same process. Results go to benchmarks/gpu.json.

    python scripts/bench_gpu.py                          # everything, about 6-8 minutes on an H200
    python scripts/bench_gpu.py --quick                  # batch sizes 1 and 4, no compile: about 2 minutes
    python scripts/bench_gpu.py --sections zest --batch-sizes 1,8 --no-compile
    python scripts/bench_gpu.py --dry-run                # tiny models on the CPU: checks the script end to end
"""
from __future__ import annotations

import argparse
import importlib.util
import platform
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch
from PIL import Image

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


def _zest_cases(args: argparse.Namespace, size: str, device: torch.device, dtype: torch.dtype, backend: str,
                compiled: bool, inputs: tuple[list, list, list], call: dict[str, Any],
                baselines: dict[str, float]) -> list[dict[str, Any]]:
    """Build one random full-size ZeST for (backend, compiled) and time it; eager cases also time the loop."""
    from pipelines.tiny import random_zest_pipeline

    targets, materials, masks = inputs
    label = f"{backend}{'+compile' if compiled else ''}"
    warm_call = dict(call, num_inference_steps=min(call["num_inference_steps"], args.warmup_steps))
    started = time.perf_counter()
    zest = random_zest_pipeline(size, device, dtype, attention=backend, compile=compiled)
    build_s = time.perf_counter() - started
    cases: list[dict[str, Any]] = []
    if not compiled:
        # the reference: one image at a time, batch 1 repeated
        zest.generate(targets[:1], materials[:1], masks[:1], seeds=[0], **warm_call)
        _reset_peak(device)
        seconds = _timed(lambda: [zest.generate([targets[i]], [materials[i]], [masks[i]], seeds=[i], **call)
                                  for i in range(args.loop_images)], device)
        baselines[backend] = args.loop_images / seconds
        cases.append(dict(case=label, mode="loop", batch_size=1, images=args.loop_images, seconds=seconds,
                          images_per_s=baselines[backend], peak_gib=_peak_gib(device), build_s=build_s))
        print(f"[zest] {label:16s} loop of {args.loop_images}: {baselines[backend]:.3f} img/s", flush=True)
    for batch in (args.compile_batch_sizes if compiled else args.batch_sizes):
        batch_inputs = (targets[:batch], materials[:batch], masks[:batch])
        seeds = list(range(batch))
        # warm-up with few steps: the shapes (and so the compiled graphs) do not depend on the step count
        warm = _timed(lambda: zest.generate(*batch_inputs, seeds=seeds, **warm_call), device)
        _reset_peak(device)
        seconds = _timed(lambda: zest.generate(*batch_inputs, seeds=seeds, **call), device)
        cases.append(dict(case=label, mode="batched", batch_size=batch, images=batch, seconds=seconds,
                          images_per_s=batch / seconds, warmup_s=warm, peak_gib=_peak_gib(device), build_s=build_s))
        print(f"[zest] {label:16s} batch {batch}: {batch / seconds:.3f} img/s, "
              f"peak {cases[-1]['peak_gib'] or 0:.1f} GiB, warm-up {warm:.1f} s", flush=True)
    del zest
    return cases


def bench_zest(args: argparse.Namespace) -> dict[str, Any]:
    """ZeST images/s for each (attention, compile, batch size) case; ratios against the one-at-a-time loop."""
    from pipelines.runtime import xformers_available

    device = resolve_device(args.device)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    size = "tiny" if args.dry_run else "full"
    backends = ["sdpa"] + (["xformers"] if xformers_available() and not args.no_xformers else [])
    compile_modes = [False] + ([True] if args.compile else [])
    targets, materials, masks = _zest_inputs(max(args.batch_sizes + [args.loop_images]), args.image_size)
    call = dict(num_inference_steps=args.steps, resolution=args.resolution)
    cases: list[dict[str, Any]] = []
    baselines: dict[str, float] = {}
    for backend in backends:
        for compiled in compile_modes:
            if compiled and backend not in args.compile_backends:
                continue
            label = f"{backend}{'+compile' if compiled else ''}"
            try:
                cases += _zest_cases(args, size, device, dtype, backend, compiled, (targets, materials, masks), call,
                                     baselines)
            except Exception as err:  # one failing case (e.g. a compile error) must not lose the others
                cases.append(dict(case=label, error=f"{type(err).__name__}: {err}"))
                print(f"[zest] {label}: FAILED {type(err).__name__}: {err}", flush=True)
            _reset_peak(device)
    reference = baselines.get("sdpa")
    timed = [case for case in cases if "images_per_s" in case]
    for case in timed:
        case["speedup_vs_sdpa_loop"] = case["images_per_s"] / reference if reference else None
    print("\n| case | batch | img/s | x vs SDPA loop | peak GiB |\n|---|---|---|---|---|")
    for case in timed:
        peak = f"{case['peak_gib']:.1f}" if case["peak_gib"] is not None else "-"
        batch = "loop" if case["mode"] == "loop" else case["batch_size"]
        ratio = f"{case['speedup_vs_sdpa_loop']:.2f}" if case["speedup_vs_sdpa_loop"] else "-"
        print(f"| {case['case']} | {batch} | {case['images_per_s']:.3f} | {ratio} | {peak} |")
    return dict(model_size=size, dtype=str(dtype).removeprefix("torch."), resolution=args.resolution,
                steps=args.steps, backends=backends, reference="sdpa one-at-a-time loop", cases=cases)


def bench_diffguard(args: argparse.Namespace) -> dict[str, Any]:
    """DIFFGUARD on the full-size ADM 256 (pixel) and Stable Diffusion 1.5 (latent) with a ResNet-50, random weights:
    images/s per batch size against the batch-1 loop (the original design's limit under per-sample early stop)."""
    import detectors
    from detectors.generative.bench import (bench_early_stop_batching, bench_latent_batching, contrast_ramp_images,
                                            random_diffguard_models)

    device = resolve_device(args.device)
    dtype = torch.float32 if args.dry_run else torch.bfloat16
    size = "tiny" if args.dry_run else "full"
    unet, pipe, classifier = random_diffguard_models(size, device, dtype)
    steps = 10 if args.dry_run else 100
    common = dict(classifier=classifier, distance="ssim", early_stop_similarity=None, precision="fp32" if args.dry_run else "bf16")
    pixel = detectors.build("diffguard", unet=unet, steps=steps, max_inversion_steps=int(0.9 * steps),
                            early_stop_psnr=15.0, **common)
    side = int(unet.config.sample_size)
    images = contrast_ramp_images(max(args.batch_sizes), side)
    result = dict(model_size=size, dtype=str(dtype).removeprefix("torch."), pixel_steps=steps,
                  pixel=bench_early_stop_batching(pixel, images, args.batch_sizes, args.loop_images))
    del pixel, unet
    _reset_peak(device)
    latent = detectors.build("diffguard", backend="latent", pipeline=pipe, latent_steps=5 if args.dry_run else 25,
                             class_names=[f"class {i}" for i in range(classifier.num_classes)], **common)
    result["latent"] = bench_latent_batching(latent, images, args.batch_sizes, args.loop_images)
    result["peak_gib"] = _peak_gib(device)
    return result


SECTIONS: dict[str, Callable[[argparse.Namespace], dict[str, Any]]] = {
    "zest": bench_zest,
    "diffguard": bench_diffguard,
}


def _int_list(text: str) -> list[int]:
    return [int(part) for part in text.split(",") if part.strip()]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sections", default=",".join(SECTIONS), help=f"comma-separated subset of {list(SECTIONS)}")
    parser.add_argument("--batch-sizes", type=_int_list, default=[1, 2, 4, 8])
    parser.add_argument("--compile-batch-sizes", type=_int_list, default=[1, 4],
                        help="batch sizes timed with torch.compile (each new shape recompiles, so keep this short)")
    parser.add_argument("--compile-backends", type=lambda t: t.split(","), default=["sdpa"],
                        help="attention backends also timed with torch.compile")
    parser.add_argument("--warmup-steps", type=int, default=4)
    parser.add_argument("--no-compile", dest="compile", action="store_false", help="skip the torch.compile cases")
    parser.add_argument("--no-xformers", action="store_true", help="skip xformers even when importable")
    parser.add_argument("--loop-images", type=int, default=2, help="images in the one-at-a-time reference loop")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--resolution", type=int, default=1024)
    parser.add_argument("--image-size", type=int, default=768, help="side of the synthetic input images")
    parser.add_argument("--quick", action="store_true", help="batch sizes 1 and 4, no compile")
    parser.add_argument("--dry-run", action="store_true",
                        help="tiny models, fp32, 64 px, 3 steps, batch sizes 1,2, no compile: checks the script on CPU")
    parser.add_argument("--device", default=None)
    parser.add_argument("--out", default="benchmarks/gpu.json")
    args = parser.parse_args(argv)
    unknown = sorted(set(args.sections.split(",")) - set(SECTIONS))
    if unknown:
        parser.error(f"unknown section(s) {unknown}; available: {list(SECTIONS)}")
    if args.quick:
        args.batch_sizes, args.compile = [1, 4], False
    if args.dry_run:
        args.batch_sizes, args.compile, args.steps, args.resolution, args.image_size = [1, 2], False, 3, 64, 48
        args.out = str(Path(args.out).with_name(Path(args.out).stem + "_dry_run.json"))
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = resolve_device(args.device)
    if device.type != "cuda" and not args.dry_run:
        raise SystemExit("bench_gpu.py needs a CUDA device; use --dry-run to check it on the CPU with tiny models")
    result: dict[str, Any] = {
        "benchmark": "gpu", "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else platform.processor() or "cpu",
        "torch": torch.__version__, "dry_run": args.dry_run,
        "xformers": importlib.util.find_spec("xformers") is not None, "sections": {},
    }
    for name in args.sections.split(","):
        started = time.perf_counter()
        result["sections"][name] = SECTIONS[name](args)
        result["sections"][name]["section_s"] = time.perf_counter() - started
        atomic_write_json(args.out, result)  # keep partial results if a later section fails or times out
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
