#!/usr/bin/env python
"""Benchmark the report against reading its inputs and computing its metrics, in the same process.

Two synthetic runs are written to a temporary folder as the runner writes them (results.csv, scores.parquet):
  paper  40 methods x 10 OOD sets x 20,000 samples per set (and 20,000 ID): the papers' scale, no image files;
  field  23 methods x 3 OOD sets and a field set, with manifests and JPEG images (the ID-looking sheets read them).
For each, the baseline is `pd.read_parquet(scores)` plus `detectors.metrics.evaluate` on every (method, set); the
report is timed twice: tables and index.html only (`--figures none`), and whole (PNG figures in worker processes).
Prints the ratios to the baseline and writes benchmarks/report.json.

    python scripts/bench_report.py                       # the sizes above
    python scripts/bench_report.py --methods 6 --sets 3 --samples 2000 --field-methods 4   # quick
"""
from __future__ import annotations

import argparse
import os
import platform
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from detectors.metrics import evaluate
from detectors.report import write_report
from detectors.tables import RESULT_COLUMNS
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


def field_run(folder: Path, methods: int, seed: int = 1) -> Path:
    """A species-style run: ID test, 3 OOD sets and a field set (known + novel species) with JPEG images."""
    from PIL import Image

    from pipelines.data import make_row, write_manifest

    rng = np.random.default_rng(seed)
    parts = {"id": [make_row(f"id/{i}.jpg", split="test", role="id", label=i % 10, species=f"sp{i % 10}", hop=0)
                    for i in range(300)],
             "ood": [make_row(f"{s}/{i}.jpg", split="test", role="ood", ood_set=s, species=f"{s}{i % 15}",
                              hop=1 + i % 3) for s in ("local", "non_local", "non_moth") for i in range(200)],
             "field": [make_row(f"k{i}.jpg", split="test", role="id", label=i % 10, species=f"sp{i % 10}")
                       for i in range(60)]
             + [make_row(f"n{i}.jpg", split="test", role="ood", ood_set="bci", species=f"novel{i % 20}")
                for i in range(120)]}
    for name, rows in parts.items():
        for i, row in enumerate(rows):
            path = folder / "data" / name / row["file_name"]
            path.parent.mkdir(parents=True, exist_ok=True)
            Image.fromarray(rng.integers(0, 255, (480, 640, 3), dtype=np.uint8)).save(path, quality=85)
        write_manifest(folder / "data" / name, rows)
    frames = []
    for m in range(methods):
        name = f"method{m:02d}"
        for role, rows, mean, manifest in (("id", parts["id"], 1.0, "id"), ("field_id", parts["field"][:60], 1.0, "field"),
                                           ("field_ood", parts["field"][60:], 0.0, "field")):
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


def _write(folder: Path, scores: pd.DataFrame) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    scores["score"] = scores["score"].astype(np.float32)
    scores.to_parquet(folder / "scores.parquet", index=False)
    _results(scores).to_csv(folder / "results.csv", index=False)
    return folder / "results.csv"


def baseline(results: Path) -> float:
    """Seconds to read the scores and compute every (method, set)'s metrics."""
    start = time.perf_counter()
    scores = pd.read_parquet(results.parent / "scores.parquet")
    for _, own in scores.groupby("method", sort=False):
        id_scores = own.loc[own["role"] == "id", "score"].to_numpy(np.float64)
        for _, part in own[own["role"] == "ood"].groupby("ood_set", sort=False):
            evaluate(id_scores, part["score"].to_numpy(np.float64))
    return time.perf_counter() - start


def timed_report(results: Path, out: Path, figures: str, workers: int | None) -> tuple[float, int]:
    start = time.perf_counter()
    written = write_report(results, out, scores=results.parent / "scores.parquet", figures=figures, workers=workers)
    return time.perf_counter() - start, len(written)


def bench(name: str, results: Path, workers: int | None) -> dict[str, Any]:
    base = baseline(results)
    tables, n_tables = timed_report(results, results.parent / "report_tables", "none", workers)
    whole, n_whole = timed_report(results, results.parent / "report", "png", workers)
    scores = pd.read_parquet(results.parent / "scores.parquet", columns=["method"])
    row = {"run": name, "score_rows": len(scores), "methods": int(scores["method"].nunique()),
           "baseline_s": round(base, 3), "tables_and_page_s": round(tables, 3), "report_s": round(whole, 3),
           "files": n_whole, "tables_ratio": round(tables / base, 2), "report_ratio": round(whole / base, 2)}
    print(f"{name:6s} {row['score_rows']:>10,d} rows  baseline {base:7.2f} s  tables+page {tables:7.2f} s "
          f"({row['tables_ratio']:.1f}x)  whole report {whole:7.2f} s ({row['report_ratio']:.1f}x, {n_whole} files)")
    return row


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--methods", type=int, default=40)
    p.add_argument("--sets", type=int, default=10)
    p.add_argument("--samples", type=int, default=20000)
    p.add_argument("--field-methods", type=int, default=23)
    p.add_argument("--workers", type=int, default=None, help="figure processes (default: the CPUs)")
    p.add_argument("--out", type=Path, default=Path("benchmarks/report.json"))
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        rows = [bench("paper", paper_run(Path(tmp) / "paper", args.methods, args.sets, args.samples), args.workers),
                bench("field", field_run(Path(tmp) / "field", args.field_methods), args.workers)]
    atomic_write_json(args.out, {"runs": rows, "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                                 "python": platform.python_version(),
                                 "sizes": {"methods": args.methods, "sets": args.sets, "samples": args.samples,
                                           "field_methods": args.field_methods}})
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
