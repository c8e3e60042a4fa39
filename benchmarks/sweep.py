#!/usr/bin/env python
"""An image-level validation sweep (ODIN's OpenOOD grid, 8 points) with and without the pixel memo, in the same
process on the same model and images: `python -m benchmarks.sweep` -> benchmarks/sweep.json.

    nice python -m benchmarks.sweep                                   # CPU: tiny ResNet-50 stand-in
    python -m benchmarks.sweep --size full --images 1024 --side 512   # on a GPU, where decoding dominates

Without the memo every grid point decodes and resizes the ID and OOD validation images again; with it
(`sweep_pixel_mb`, `detectors.posthoc.pixels.pixel_memo`) they are preprocessed once. Reports seconds of each sweep
(best of the interleaved repeats), their ratio (goal > 1), the memo's hits and whether both chose the same point.
"""
from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

from pipelines.cli import parser, run_main


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True)
    p.add_argument("--size", choices=("tiny", "full"), default="tiny", help="ResNet-50 stand-in size (random weights)")
    p.add_argument("--images", type=int, default=64, help="images in each of ID val and OOD val")
    p.add_argument("--side", type=int, default=256, help="side of the synthetic JPEG images")
    p.add_argument("--image-size", type=int, default=64, help="model input size")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--repeats", type=int, default=2, help="interleaved runs of each sweep; the best time counts")
    args = p.parse_args(argv)
    out = Path(args.out or Path(__file__).with_suffix(".json"))
    from benchmarks.cases.train import synthetic_manifest
    from benchmarks.train import _classifier, write_result
    from detectors import build
    from detectors.base import ImageSet
    from detectors.harness.selection import select
    from detectors.posthoc.pixels import pixel_memo
    from pipelines.runtime import resolve_device

    device = resolve_device()
    classifier = _classifier(args.size, args.image_size).to(device).eval()
    make = lambda params: build("odin", classifier=classifier, batch_size=args.batch_size, **params)  # noqa: E731
    times: dict[str, list[float]] = {"plain": [], "memo": []}
    chosen, hits = {}, 0
    with tempfile.TemporaryDirectory() as scratch:
        id_val = ImageSet(manifest=synthetic_manifest(Path(scratch) / "id", args.images, args.side, seed=1))
        ood_val = ImageSet(manifest=synthetic_manifest(Path(scratch) / "ood", args.images, args.side, seed=2))
        for _ in range(args.repeats):
            for name, megabytes in (("plain", 0), ("memo", 4096)):
                start = time.perf_counter()
                with pixel_memo(megabytes) as memo:
                    _, params, _ = select("odin", id_val, ood_val, make=make)
                    hits = memo.hits if memo is not None else hits
                times[name].append(time.perf_counter() - start)
                chosen[name] = params
    best = {name: min(values) for name, values in times.items()}
    numbers = {"plain_s": best["plain"], "memo_s": best["memo"], "ratio": best["plain"] / best["memo"],
               "memo_hits": hits, "same_choice": chosen["plain"] == chosen["memo"], "chosen": chosen["memo"]}
    write_result(out, "sweep", device, args, numbers)
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="README.md, section 'Commands'"))
