"""Benchmark the geographic split builder (gen.insects.build_splits) on a synthetic occurrence table.

Times the vectorised builder on the full table (default 3 million rows) and on a 30k-row random subsample, and a
straightforward per-row Python loop (set membership by box tests and set lookups row by row, no sampling, so it does
less work than the builder) on the same subsample, extrapolated linearly to the full table. Also times writing the
manifests and reports peak memory (tracemalloc peak during the build, which sees numpy/pandas buffers, and the
process's peak RSS). Writes `benchmarks/splits.json`.

    python scripts/bench_splits.py                 # 3,000,000 rows
    python scripts/bench_splits.py --rows 300000 --subsample 30000
"""
from __future__ import annotations

import os
import platform
import resource
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gen.insects import SplitConfig, build_splits, read_id_species, synthetic_occurrences, write_splits
from pipelines.cli import README_SECTIONS, parser, run_main
from pipelines.io import atomic_write_json


def naive_assign(occ: pd.DataFrame, id_species: dict[str, list[str]], config: SplitConfig, iterrows: bool = False) -> dict[str, list[str]]:
    """Baseline: each row's set and hop per region, computed row by row in Python (two passes over the rows), reading
    the rows as plain tuples (`tolist`) or, the way pandas code often does, with `DataFrame.iterrows`."""
    regions = {r: config.regions[r].padded(config.pad_lat, config.pad_lon) for r in id_species}
    nl = config.non_local_box
    local: dict[str, set] = {r: set() for r in regions}
    australian, genus_of, family_of = set(), {}, {}
    columns = occ[["species", "genus", "family", "lat", "lon", "taxon"]]
    records = [tuple(row) for _, row in columns.iterrows()] if iterrows else columns.astype(object).to_numpy().tolist()
    for species, genus, family, lat, lon, taxon in records:
        if taxon != config.target_taxon:
            continue
        genus_of[species], family_of[species] = genus, family
        for r, box in regions.items():
            if box.lat_min < lat < box.lat_max and box.lon_min < lon < box.lon_max and species not in id_species[r]:
                local[r].add(species)
        if nl.lat_min < lat < nl.lat_max and nl.lon_min < lon < nl.lon_max:
            australian.add(species)
    excluded = set().union(*map(set, id_species.values()), *local.values())
    non_local = australian - excluded
    out: dict[str, list[str]] = {}
    for r in regions:
        ids = set(id_species[r])
        id_genera = {genus_of[s] for s in ids if s in genus_of}
        id_families = {family_of[s] for s in ids if s in family_of}
        ood_genera = {genus_of[s] for s in local[r] | non_local}
        drop = ood_genera - id_genera
        assigned = []
        for species, genus, family, lat, lon, taxon in records:
            if taxon != config.target_taxon:
                kind = "non_target"
            elif species in ids:
                kind = "id"
            elif species in local[r]:
                kind = "local"
            elif species in non_local:
                kind = "non_local"
            elif genus in drop:
                kind = "dropped"
            else:
                kind = "aux"
            hop = 0 if kind == "id" else 1 if genus in id_genera else 2 if family in id_families else 3
            assigned.append(f"{kind}:{hop}")
        out[r] = assigned
    return out


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def run(rows: int, subsample: int, seed: int) -> dict[str, Any]:
    occ, ids_table = synthetic_occurrences(rows, seed=seed)
    ids = read_id_species(ids_table)
    config = SplitConfig(target_taxon="moth", seed=seed)
    sub = occ.iloc[np.sort(np.random.default_rng(seed).choice(len(occ), subsample, replace=False))].reset_index(drop=True)

    _, naive_sub = _timed(lambda: naive_assign(sub, ids, config))
    _, iterrows_sub = _timed(lambda: naive_assign(sub, ids, config, iterrows=True))
    _, vec_sub = _timed(lambda: build_splits(sub, ids, config))
    splits, vec_full = _timed(lambda: build_splits(occ, ids, config))
    with tempfile.TemporaryDirectory() as tmp:
        _, write_full = _timed(lambda: write_splits(splits, Path(tmp) / "splits", image_root=tmp))
    tracemalloc.start()
    build_splits(occ, ids, config)
    _, traced_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    scale = rows / subsample
    return {
        "rows": rows, "subsample": subsample, "regions": len(ids),
        "rows_written": int(sum(len(f) for f in splits.regions.values())),
        "naive_loop_subsample_s": naive_sub, "vectorised_subsample_s": vec_sub,
        "iterrows_loop_subsample_s": iterrows_sub,
        "naive_loop_full_extrapolated_s": naive_sub * scale, "iterrows_loop_full_extrapolated_s": iterrows_sub * scale,
        "vectorised_full_s": vec_full,
        "write_manifests_full_s": write_full,
        "speedup_full_vs_naive_extrapolated": naive_sub * scale / vec_full,
        "speedup_full_vs_iterrows_extrapolated": iterrows_sub * scale / vec_full,
        "speedup_subsample": naive_sub / vec_sub,
        "build_traced_peak_mib": traced_peak / 2**20,
        "process_peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "machine": {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count()},
    }


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=3_000_000)
    p.add_argument("--subsample", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("benchmarks/splits.json"))
    args = p.parse_args(argv)
    result = run(args.rows, args.subsample, args.seed)
    atomic_write_json(args.out, result)
    print("| measure | value |\n|---|---|")
    for key in ("rows", "rows_written", "vectorised_full_s", "write_manifests_full_s", "naive_loop_full_extrapolated_s",
                "iterrows_loop_full_extrapolated_s", "speedup_full_vs_naive_extrapolated",
                "speedup_full_vs_iterrows_extrapolated", "speedup_subsample", "build_traced_peak_mib", "process_peak_rss_mib"):
        value = result[key]
        print(f"| {key} | {value:.3g} |" if isinstance(value, float) else f"| {key} | {value} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
