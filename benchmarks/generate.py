"""CPU benchmark of the generation job: batched `run_generation` vs a loop shaped like the original ZeST script.

The loop re-creates every input per item (reads both images, computes the mask and depth), encodes the prompt and the
exemplar on every call (stock diffusers pipeline with text encoders and `ip_adapter_image`) and generates one image
at a time. Both use the same tiny random-weight models, resolution, steps and items, in this one process; models are
loaded before timing and each variant is warmed up once; the variants run interleaved for `--repeats` rounds and the
fastest round counts (the machine may be shared). Prints images/s and peak extra memory (RSS above the level before
the run after returning freed heap to the OS, sampled every 2 ms) as ratios against the loop, and writes
benchmarks/generate.json.

    python -m benchmarks.generate [--items 16 --resolution 64 --steps 4 --batch-sizes 1 2 4 8]
"""
from __future__ import annotations

import argparse
import ctypes
import ctypes.util
import json
import os
import platform
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from PIL import Image

from gen.depth import DepthEstimator
from gen.job import GenerationConfig, load_plan, run_generation
from gen.masks import foreground_mask, grayscale_init
from gen.pairing import PlanItem
from gen.tiny_zest import save_tiny_zest
from gen.zest import NEGATIVE_PROMPT, PROMPT, ZeSTCall, ZeSTConfig, ZeSTPipeline
from pipelines.cli import README_SECTIONS, parser, run_main
from pipelines.data import load_image

PAGE = os.sysconf("SC_PAGE_SIZE")
LIBC = ctypes.CDLL(ctypes.util.find_library("c"))


class PeakRSS:
    """Peak resident memory above the level at entry, sampled from /proc/self/statm by a background thread."""

    def __init__(self, interval: float = 0.002):
        self.interval, self.peak, self._stop = interval, 0, threading.Event()

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as fh:
            return int(fh.read().split()[1]) * PAGE

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            time.sleep(self.interval)

    def __enter__(self) -> PeakRSS:
        if hasattr(LIBC, "malloc_trim"):
            LIBC.malloc_trim(0)  # glibc keeps freed heap; hand it back so the start level is the live size
        self.start = self.rss()
        self.peak = self.start
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())

    @property
    def extra_mb(self) -> float:
        return (self.peak - self.start) / 2**20


def write_inputs(folder: Path, n_targets: int, n_materials: int, size: int = 96) -> tuple[Path, Path]:
    """Synthetic targets (a bright disc on a gradient) and noise-texture materials as plain image folders."""
    rng = np.random.default_rng(0)
    y, x = np.mgrid[0:size, 0:size] / size
    targets, materials = folder / "targets", folder / "materials"
    targets.mkdir(parents=True), materials.mkdir(parents=True)
    for i in range(n_targets):
        disc = ((x - 0.5) ** 2 + (y - 0.5) ** 2 < 0.06 + 0.002 * i)[..., None]
        array = np.where(disc, np.array([220, 180, 90 + i]), np.stack([x, y, 1 - x], axis=-1) * 150).astype(np.uint8)
        Image.fromarray(array).save(targets / f"t{i:03d}.png")
    for i in range(n_materials):
        Image.fromarray(rng.integers(30, 230, (size, size, 3), dtype=np.uint8)).save(materials / f"m{i:03d}.png")
    return targets, materials


def stock_pipeline(models: ZeSTConfig):
    """The stock diffusers ZeST pipeline as the original script builds it (text encoders kept, IP-Adapter loaded)."""
    from diffusers import ControlNetModel, StableDiffusionXLControlNetInpaintPipeline

    controlnet = ControlNetModel.from_pretrained(models.controlnet)
    pipe = StableDiffusionXLControlNetInpaintPipeline.from_pretrained(models.base, controlnet=controlnet,
                                                                      add_watermarker=False)
    pipe.load_ip_adapter(models.ip_adapter, subfolder=models.ip_adapter_subfolder, weight_name=models.ip_adapter_weight,
                         image_encoder_folder=models.image_encoder)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def original_style_loop(pipe: Any, depth: DepthEstimator, items: list[PlanItem], out: Path, resolution: int,
                        steps: int) -> None:
    """One image per call; inputs rebuilt and the prompt and exemplar encoded on every call; seed 42 as in ZeST."""
    out.mkdir(parents=True, exist_ok=True)
    size = (resolution, resolution)
    zest = ZeSTCall()  # ZeST's call defaults
    for item in items:
        target, material = load_image(item.target), load_image(item.material)
        mask = foreground_mask(target)
        control = depth([target])[0].resize(size).convert("RGB")
        image = pipe(prompt=PROMPT, negative_prompt=NEGATIVE_PROMPT, image=grayscale_init(target, mask).resize(size),
                     mask_image=mask.resize(size), control_image=control, ip_adapter_image=material,
                     height=resolution, width=resolution, num_inference_steps=steps, strength=zest.strength,
                     guidance_scale=zest.guidance_scale,
                     controlnet_conditioning_scale=zest.controlnet_conditioning_scale,
                     generator=torch.Generator().manual_seed(42)).images[0]
        image.resize(target.size).save(out / Path(item.output).name)


def measure(variants: dict[str, Callable[[], None]], n_images: int, rounds: int) -> dict[str, dict[str, float]]:
    """Run the variants interleaved for `rounds` rounds: fastest images/s and largest peak extra memory of each."""
    results = {name: {"seconds": float("inf"), "peak_extra_mb": 0.0} for name in variants}
    for _ in range(rounds):
        for name, run in variants.items():
            with PeakRSS() as memory:
                start = time.perf_counter()
                run()
                seconds = time.perf_counter() - start
            result = results[name]
            result["seconds"] = min(result["seconds"], seconds)
            result["peak_extra_mb"] = max(result["peak_extra_mb"], memory.extra_mb)
    for result in results.values():
        result["images_per_s"] = n_images / result["seconds"]
    return results


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__)
    p.add_argument("--items", type=int, default=16, help="images generated per measurement")
    p.add_argument("--resolution", type=int, default=64)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--repeats", type=int, default=3, help="interleaved rounds; each variant's fastest counts")
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    with tempfile.TemporaryDirectory() as scratch:
        scratch = Path(scratch)
        models = save_tiny_zest(scratch / "models")
        targets, materials = write_inputs(scratch / "inputs", args.items, max(2, args.items // 4))
        base = {"task": "custom", "targets": str(targets), "materials": str(materials), "models": models.to_dict(),
                "resolution": args.resolution, "num_inference_steps": args.steps, "seed": 0, "precision": "fp32"}
        items = load_plan(GenerationConfig.from_dict({**base, "out": str(scratch / "plan")}))
        zest = ZeSTPipeline.from_config(models, device="cpu", dtype=torch.float32)
        stock = stock_pipeline(models)
        depth = DepthEstimator.from_pretrained(models.depth, device="cpu", dtype=torch.float32)
        runs = iter(range(10**6))

        def job(batch_size: int, limit: int | None = None) -> Callable[[], None]:
            def run() -> None:
                config = {**base, "batch_size": batch_size, "limit": limit, "out": str(scratch / f"job{next(runs)}")}
                run_generation(config, pipeline=zest)
            return run

        def loop(subset: list[PlanItem]) -> Callable[[], None]:
            return lambda: original_style_loop(stock, depth, subset, scratch / f"loop{next(runs)}", args.resolution,
                                               args.steps)

        loop(items[:1])(), job(1, limit=1)()  # warm-up
        variants = {"loop": loop(items), **{f"job{b}": job(b) for b in args.batch_sizes}}
        results = measure(variants, len(items), args.repeats)
    reference = results["loop"]
    rows = [{"variant": "original-style loop", "batch_size": 1, **reference}]
    rows += [{"variant": "batched job", "batch_size": b, **results[f"job{b}"]} for b in args.batch_sizes]
    for row in rows:
        row["speedup"] = row["images_per_s"] / reference["images_per_s"]
        row["memory_ratio"] = row["peak_extra_mb"] / max(reference["peak_extra_mb"], 1e-9)
    print(f"{'variant':<22}{'batch':>6}{'img/s':>9}{'speedup':>9}{'peak MB':>9}{'mem ratio':>10}")
    for row in rows:
        print(f"{row['variant']:<22}{row['batch_size']:>6}{row['images_per_s']:>9.2f}{row['speedup']:>9.2f}"
              f"{row['peak_extra_mb']:>9.1f}{row['memory_ratio']:>10.2f}")
    report = {"benchmark": "generate", "device": "cpu", "torch": torch.__version__, "threads": torch.get_num_threads(),
              "cpus": os.cpu_count(), "load_average": os.getloadavg(), "machine": platform.machine(),
              "items": args.items, "resolution": args.resolution, "steps": args.steps, "repeats": args.repeats,
              "rows": rows}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(report, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
