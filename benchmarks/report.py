#!/usr/bin/env python
"""Benchmark the report against reading its inputs and computing its metrics, in the same process.

Synthetic runs are written to a temporary folder as the runner writes them (results.csv, scores.parquet):
  paper  40 methods x 10 OOD sets x 20,000 samples per set (and 20,000 ID): the papers' scale, no image files;
  field  23 methods x 3 OOD sets and a field set, with manifests and JPEG images (the ID-looking sheets read them);
  small  26 methods x 3 OOD sets of 300 images and 500 ID (the demo's size), with manifests and small PNGs.
For each, the baseline is `pd.read_parquet(scores)` plus `detectors.metrics.evaluate` on every (method, set); the
report is timed twice: tables and index.html only (`--figures none`), and whole (PNG figures, in worker processes when
that pays). Imports (matplotlib, PIL) are done before anything is timed. Each is run `--repeat` times interleaved
(baseline, tables, whole, baseline, ...) and the best of each kept, so that the ratios survive a loaded machine.
Prints the ratios to the baseline and writes benchmarks/report.json.

    python -m benchmarks.report                       # the sizes above
    python -m benchmarks.report --methods 6 --sets 3 --samples 2000 --field-methods 4 --small-methods 6   # quick
"""
from __future__ import annotations

import argparse
import os
import platform
import resource
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors.harness.report import write_report
from detectors.harness.results import RESULT_COLUMNS
from detectors.metrics import evaluate
from pipelines.io import atomic_write_json

FAMILIES = ("posthoc", "clip", "generative")


def _results(scores: pd.DataFrame) -> pd.DataFrame:
    rows = []
    for method, own in scores.groupby("method", sort=False):
        id_scores = own.loc[own["role"] == "id", "score"].to_numpy()
        for ood_set, part in own[own["role"] == "ood"].groupby("ood_set", sort=False):
            rows.append({"method": method, "family": own["family"].iloc[0], "ood_set": ood_set,
                         "group": part["group"].iloc[0], **evaluate(id_scores, part["score"].to_numpy()),
                         "n_id": len(id_scores), "n_ood": len(part), "seconds": 1.0})
    return pd.DataFrame(rows).reindex(columns=[c for c in RESULT_COLUMNS if c in rows[0]])


def paper_run(folder: Path, methods: int, sets: int, samples: int, seed: int = 0) -> Path:
    """results.csv and scores.parquet of `methods` x `sets` x `samples` (float32 scores, as the runner stores)."""
    rng = np.random.default_rng(seed)
    frames = []
    for m in range(methods):
        name, family = f"method{m:02d}", FAMILIES[m % len(FAMILIES)]
        frames.append(pd.DataFrame({"method": name, "family": family, "role": "id", "ood_set": "id", "group": "id",
                                    "index": np.arange(samples), "score": rng.normal(1.0, 1.0, samples)}))
        for s in range(sets):
            group = "hard" if s < sets // 2 else "easy"
            frames.append(pd.DataFrame({"method": name, "family": family, "role": "ood", "ood_set": f"set{s}",
                                        "group": group, "index": np.arange(samples),
                                        "score": rng.normal(0.2 * (s % 4), 1.0, samples)}))
    return _write(folder, pd.concat(frames, ignore_index=True))


def field_run(folder: Path, methods: int, seed: int = 1, ood: int = 200, id_rows: int = 300, size=(480, 640),
              field: bool = True, suffix: str = "jpg") -> Path:
    """A species-style run: ID test, 3 OOD sets and (with `field`) a field set (known + novel species), with images
    of `size` pixels (`photo`)."""
    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(seed)
    parts = {"id": [make_row(f"id/{i}.{suffix}", split="test", role="id", label=i % 10, species=f"sp{i % 10}", hop=0)
                    for i in range(id_rows)],
             "ood": [make_row(f"{s}/{i}.{suffix}", split="test", role="ood", ood_set=s, species=f"{s}{i % 15}",
                              hop=1 + i % 3) for s in ("local", "non_local", "non_moth") for i in range(ood)],
             "field": [make_row(f"k{i}.{suffix}", split="test", role="id", label=i % 10, species=f"sp{i % 10}")
                       for i in range(60)]
             + [make_row(f"n{i}.{suffix}", split="test", role="ood", ood_set="bci", species=f"novel{i % 20}")
                for i in range(120)]}
    if not field:
        del parts["field"]
    for name, rows in parts.items():
        for row in rows:
            path = folder / "data" / name / row["file_name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            photo(rng, size).save(path)
        write_manifest(folder / "data" / name, rows)
    frames = []
    for m in range(methods):
        name = f"method{m:02d}"
        roles = [("id", parts["id"], 1.0, "id")]
        if field:
            roles += [("field_id", parts["field"][:60], 1.0, "field"), ("field_ood", parts["field"][60:], 0.0, "field")]
        for role, rows, mean, manifest in roles:
            frames.append(pd.DataFrame({"method": name, "family": "posthoc", "role": role,
                                        "ood_set": "bci" if role.startswith("field") else "id", "group": role,
                                        "index": np.arange(len(rows)), "score": rng.normal(mean, 1.0, len(rows)),
                                        "file_name": [r["file_name"] for r in rows],
                                        "manifest": str(folder / "data" / manifest)}))
        for s in ("local", "non_local", "non_moth"):
            rows = [r for r in parts["ood"] if r["ood_set"] == s]
            frames.append(pd.DataFrame({"method": name, "family": "posthoc", "role": "ood", "ood_set": s, "group": "",
                                        "index": np.arange(len(rows)), "score": rng.normal(0.0, 1.0, len(rows)),
                                        "file_name": [r["file_name"] for r in rows],
                                        "manifest": str(folder / "data" / "ood")}))
    return _write(folder, pd.concat(frames, ignore_index=True))


def photo(rng: np.random.Generator, size: tuple[int, int]) -> Any:
    """A photograph-like image of `size` (h, w): smooth colour regions and mild sensor noise (JPEGs of pure noise would
    decode several times slower than real photos)."""
    from PIL import Image

    coarse = Image.fromarray(rng.integers(0, 255, (6, 8, 3), dtype=np.uint8)).resize(size[::-1], Image.BILINEAR)
    pixels = np.asarray(coarse, dtype=np.int16) + rng.integers(-8, 9, (*size, 3), dtype=np.int16)
    return Image.fromarray(pixels.clip(0, 255).astype(np.uint8))


def small_run(folder: Path, methods: int) -> Path:
    """The demo's size: `methods` post-hoc methods, 500 ID and 3 x 300 OOD images (32 px PNGs), no field set."""
    return field_run(folder, methods, seed=2, ood=300, id_rows=500, size=(32, 32), field=False, suffix="png")


def _write(folder: Path, scores: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    scores["score"] = scores["score"].astype(np.float32)
    scores.to_parquet(folder / "scores.parquet", index=False)
    _results(scores).to_csv(folder / "results.csv", index=False)
    return folder / "results.csv"


def _cpu() -> float:
    """CPU seconds of this process and of its finished children (the figure workers)."""
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return time.process_time() + children.ru_utime + children.ru_stime


def _timed(call) -> tuple[float, float, Any]:
    """(wall seconds, CPU seconds, result) of `call()`."""
    wall, cpu = time.perf_counter(), _cpu()
    result = call()
    return time.perf_counter() - wall, _cpu() - cpu, result


def _baseline(results: Path) -> None:
    scores = pd.read_parquet(results.parent / "scores.parquet")
    for _, own in scores.groupby("method", sort=False):
        id_scores = own.loc[own["role"] == "id", "score"].to_numpy(np.float64)
        for _, part in own[own["role"] == "ood"].groupby("ood_set", sort=False):
            evaluate(id_scores, part["score"].to_numpy(np.float64))


def baseline(results: Path) -> float:
    """Seconds to read the scores and compute every (method, set)'s metrics."""
    return _timed(lambda: _baseline(results))[0]


def bench(name: str, results: Path, workers: int | None, repeat: int) -> dict[str, Any]:
    """Best of `repeat` interleaved runs of the baseline, the tables and page, the whole report: wall seconds (the
    goal's measure) and CPU seconds (this process and its figure workers: what a loaded machine does not distort)."""
    runs: dict[str, list[tuple[float, float]]] = {"baseline": [], "tables": [], "whole": []}
    n_whole = 0
    for _ in range(repeat):
        runs["baseline"].append(_timed(lambda: _baseline(results))[:2])
        runs["tables"].append(_timed(lambda: write_report(results, results.parent / "report_tables",
                                                          scores=results.parent / "scores.parquet", figures="none",
                                                          workers=workers))[:2])
        wall, cpu, written = _timed(lambda: write_report(results, results.parent / "report",
                                                         scores=results.parent / "scores.parquet", figures="png",
                                                         workers=workers))
        runs["whole"].append((wall, cpu))
        n_whole = len(written)
    (b, bc), (t, tc), (w, wc) = ((min(x[0] for x in v), min(x[1] for x in v)) for v in runs.values())
    scores = pd.read_parquet(results.parent / "scores.parquet", columns=["method"])
    row = {"run": name, "score_rows": len(scores), "methods": int(scores["method"].nunique()),
           "baseline_s": round(b, 3), "tables_and_page_s": round(t, 3), "report_s": round(w, 3),
           "files": n_whole, "figures": sum(1 for p in (results.parent / "report").iterdir()
                                            if p.suffix in (".png", ".jpg")),
           "tables_ratio": round(t / b, 2), "report_ratio": round(w / b, 2),
           "baseline_cpu_s": round(bc, 3), "report_cpu_s": round(wc, 3), "report_cpu_ratio": round(wc / bc, 2),
           "tables_cpu_ratio": round(tc / bc, 2), "repeat": repeat}
    print(f"{name:6s} {row['score_rows']:>10,d} rows  baseline {b:6.2f} s  tables+page {t:6.2f} s "
          f"({row['tables_ratio']:.1f}x)  whole report {w:6.2f} s ({row['report_ratio']:.1f}x; CPU "
          f"{row['report_cpu_ratio']:.1f}x; {n_whole} files, {row['figures']} figures)")
    return row


def _warm_imports() -> None:
    """Imports apart: what the report imports lazily (matplotlib's Agg canvas, PIL's codecs) loaded before timing."""
    import importlib

    for name in ("matplotlib.backends.backend_agg", "matplotlib.figure", "matplotlib.collections", "PIL.Image",
                 "PIL.ImageDraw", "PIL.PngImagePlugin", "PIL.JpegImagePlugin"):
        importlib.import_module(name)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", type=int, default=40)
    p.add_argument("--sets", type=int, default=10)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--field-methods", type=int, default=23)
    p.add_argument("--small-methods", type=int, default=26)
    p.add_argument("--repeat", type=int, default=3, help="interleaved runs of each; the best is kept (default 3)")
    p.add_argument("--runs", default="small,field,paper", help="comma-separated runs (default small,field,paper)")
    p.add_argument("--workers", type=int, default=None, help="figure processes (default: the CPUs)")
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    _warm_imports()
    makers = {"small": lambda f: small_run(f, args.small_methods), "field": lambda f: field_run(f, args.field_methods),
              "paper": lambda f: paper_run(f, args.methods, args.sets, args.samples)}
    chosen = [r for r in args.runs.split(",") if r]
    unknown = sorted(set(chosen) - set(makers))
    if unknown:
        p.error(f"--runs: unknown {unknown}; choose from {list(makers)}")
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench(name, makers[name](Path(tmp) / name), args.workers, args.repeat) for name in chosen]
    atomic_write_json(args.out, {"runs": rows, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                                 "python": platform.python_version(), "goal": "report_ratio <= 10 for small runs",
                                 "sizes": {"methods": args.methods, "sets": args.sets, "samples": args.samples,
                                           "field_methods": args.field_methods, "small_methods": args.small_methods}})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
