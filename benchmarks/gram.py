"""Benchmark GRAM's feature step (detectors.posthoc.gram.gram_vector) against OpenOOD's form of the same numbers.

On random ReLU-like feature maps of a ResNet-50's four stage outputs (default batch 8 at 224 px: [8, 256, 56, 56],
[8, 512, 28, 28], [8, 1024, 14, 14], [8, 2048, 7, 7]) and powers 1..5, times the row sums computed as F^p (F^p summed
over channels) against OpenOOD's full Gram matrix (F^p)(F^p)^T summed over one axis, both in float64, and reports the
ratio and the largest relative difference. Also times scoring (deviation from the min/max of each row's predicted class)
as the detector does it (`class_deviations`: row blocks, class by class within a block) against gathering every row's
bounds into [N, F] arrays first. Writes `benchmarks/gram.json`.

    python -m benchmarks.gram
    python -m benchmarks.gram --batch 2 --repeats 1
"""
from __future__ import annotations

import platform
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch

from detectors.posthoc.gram import class_deviations, gram_deviation, gram_vector
from pipelines.cli import README_SECTIONS, parser, run_main
from pipelines.io import atomic_write_json

STAGES = ((256, 56), (512, 28), (1024, 14), (2048, 7))


def openood_gram(feature_map: torch.Tensor, power: int) -> torch.Tensor:
    """OpenOOD's G_p: the full Gram matrix, summed over its last axis, signed p-th root."""
    t = feature_map.to(torch.float64) ** power
    t = t.reshape(t.shape[0], t.shape[1], -1)
    rows = torch.matmul(t, t.transpose(1, 2)).sum(dim=2)
    return rows.sign() * rows.abs() ** (1.0 / power)


def best_time(fn: Callable[[], Any], repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--rows", type=int, default=5000, help="scored rows for the deviation timing")
    p.add_argument("--classes", type=int, default=100)
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    torch.manual_seed(0)
    maps = [torch.relu(torch.randn(args.batch, c, s, s)) for c, s in STAGES]
    powers = range(1, 6)
    ours = lambda: [gram_vector(m, p) for m in maps for p in powers]  # noqa: E731
    theirs = lambda: [openood_gram(m, p) for m in maps for p in powers]  # noqa: E731
    diff = max(float(((a - b).abs() / b.abs().clamp_min(1e-300)).max()) for a, b in zip(ours(), theirs()))
    t_ours, t_theirs = best_time(ours, args.repeats), best_time(theirs, args.repeats)

    rng = np.random.default_rng(0)
    width = sum(c for c, _ in STAGES) * len(powers)
    mins = rng.normal(size=(args.classes, width))
    maxs = mins + rng.uniform(0.5, 2.0, size=mins.shape)
    x = rng.normal(size=(args.rows, width))
    pred = rng.integers(0, args.classes, args.rows)

    ones = np.ones((width, 1))

    def blocked() -> np.ndarray:
        return class_deviations(mins, maxs, x, pred, ones)[:, 0]

    def gathered() -> np.ndarray:
        return gram_deviation(mins[pred], maxs[pred], x).sum(axis=1)

    assert np.allclose(blocked(), gathered())
    t_blocked, t_gathered = best_time(blocked, args.repeats), best_time(gathered, args.repeats)
    result = {
        "machine": {"platform": platform.platform(), "torch_threads": torch.get_num_threads()},
        "features": {"batch": args.batch, "stages": [list(s) for s in STAGES], "powers": list(powers),
                     "row_sums_s": t_ours, "full_gram_s": t_theirs, "speedup": t_theirs / t_ours, "max_rel_diff": diff},
        "scoring": {"rows": args.rows, "classes": args.classes, "entries": width, "blocked_s": t_blocked,
                    "gathered_s": t_gathered, "speedup": t_gathered / t_blocked},
    }
    atomic_write_json(args.out, result)
    print(f"Gram features, batch {args.batch}, ResNet-50 stages, powers 1-5: row sums {t_ours:.3f} s, full Gram "
          f"{t_theirs:.3f} s -> {t_theirs / t_ours:.1f}x (max relative difference {diff:.1e})")
    print(f"Scoring {args.rows} rows x {width} entries, {args.classes} classes: blocked per class {t_blocked:.3f} s, "
          f"gathered bounds {t_gathered:.3f} s -> {t_gathered / t_blocked:.2f}x")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
