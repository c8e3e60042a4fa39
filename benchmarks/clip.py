"""Benchmark the CLIP detectors: MCM scoring images/s with cached vs uncached image features, LoCoOp training
steps/s on cached embeddings vs re-running the image tower each step, and a few-shot sweep's training features
(shots 1-16 x 3 seeds, 20 images a class) sliced from one pass vs embedded per subset. Ratios are against the baseline
measured in the same process. Writes benchmarks/clip.json (or --out).

    python -m benchmarks.clip                         # tiny CLIP (CPU-friendly)
    python -m benchmarks.clip --full-size --n-images 512 --batch-size 64 --classes 100   # ViT-B/16 sizes (GPU)
"""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

from benchmarks.cases.clip import run_benchmark
from pipelines.cli import README_SECTIONS, parser, run_main
from pipelines.io import atomic_write_json


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--full-size", action="store_true",
                   help="random weights with ViT-B/16 sizes instead of the tiny CLIP")
    p.add_argument("--n-images", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--classes", type=int, default=10)
    p.add_argument("--device", default=None)
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        result = (run_benchmark(tmp, args.full_size, args.n_images, args.batch_size, args.steps, args.classes,
                                args.device))
    print(f"| {result['model']} on {result['device']} | value |\n|---|---|")
    for section in ("scoring", "training", "fewshot_features"):
        for key, value in result[section].items():
            print(f"| {section}.{key} | {value:.2f} |")
    out = args.out
    runs = json.loads(out.read_text())["runs"] if out.is_file() else []
    runs = [r for r in runs if (r["model"], r["device"]) != (result["model"], result["device"])] + [result]
    atomic_write_json(out, {"benchmark": "clip", "runs": runs})


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
