"""Benchmark the geographic split builder (gen.insects.build_splits) and the whole make_splits path.

1. In one process, on a synthetic occurrence table of `--rows` rows (species in the paper's proportion, 28,388 for
   2,912,168 images): the vectorised builder on the full table and on a `--subsample`-row random subsample, against a
   straightforward per-row Python loop (set membership by box tests and set lookups row by row, no sampling, so it
   does less work than the builder) and the same loop over `DataFrame.iterrows`, on the subsample, extrapolated
   linearly; the rate at which this machine writes manifest bytes to disk (`disk_write_mib_per_s`, the rate
   `make_splits --dry-run` estimates a run's writing with).
2. End to end in fresh processes: `make_splits` from a GBIF-shaped archive (`gen.insects.archive`) of `--rows / 2`
   and `--rows` images, Open-Insects' moth rule, to three regions' manifests: seconds of each stage (read, build,
   manifests) and the peak RSS the run adds to its imports (VmHWM), extrapolated to the paper's size along the line
   through the two runs.

Writes `benchmarks/splits.json`.

    python -m benchmarks.splits                                  # 300,000 rows, subsample 30,000
    python -m benchmarks.splits --rows 2912168 --subsample 100000  # the paper's size
"""
from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from gen.insects import SplitConfig, build_splits, read_id_species, synthetic_occurrences, write_splits
from gen.insects.archive import write_gbif_archive
from pipelines.cli import README_SECTIONS, parser, run_main
from pipelines.io import atomic_path, atomic_write_json

PAPER_ROWS, PAPER_SPECIES = 2_912_168, 28_388


def naive_assign(occ: pd.DataFrame, id_species: dict[str, list[str]], config: SplitConfig,
                 iterrows: bool = False) -> dict[str, list[str]]:
    """Baseline: each row's set and hop per region, computed row by row in Python (two passes over the rows), reading
    the rows as plain tuples (`tolist`) or, the way pandas code often does, with `DataFrame.iterrows`."""
    regions = {r: config.regions[r].padded(config.pad_lat, config.pad_lon) for r in id_species}
    columns = occ[["species", "genus", "family", "lat", "lon", "taxon"]]
    records = [tuple(row) for _, row in columns.iterrows()] if iterrows else columns.astype(object).to_numpy().tolist()
    local, australian, genus_of, family_of = _naive_first_pass(records, regions, id_species, config)
    excluded = set().union(*map(set, id_species.values()), *local.values())
    non_local = australian - excluded
    return {r: _naive_region(records, set(id_species[r]), local[r], non_local, genus_of, family_of, config)
            for r in regions}


def _naive_first_pass(records: list[tuple], regions: dict[str, Any], id_species: dict[str, list[str]],
                      config: SplitConfig) -> tuple[dict[str, set], set, dict[str, Any], dict[str, Any]]:
    """The first pass: each region's local species, the species seen in the non-local box, each species' genus and
    family."""
    nl = config.non_local_box
    local: dict[str, set] = {r: set() for r in regions}
    australian, genus_of, family_of = set(), {}, {}
    for species, genus, family, lat, lon, taxon in records:
        if taxon != config.target_taxon:
            continue
        genus_of[species], family_of[species] = genus, family
        for r, box in regions.items():
            if box.lat_min < lat < box.lat_max and box.lon_min < lon < box.lon_max and species not in id_species[r]:
                local[r].add(species)
        if nl.lat_min < lat < nl.lat_max and nl.lon_min < lon < nl.lon_max:
            australian.add(species)
    return local, australian, genus_of, family_of


def _naive_region(records: list[tuple], ids: set, local: set, non_local: set, genus_of: dict[str, Any],
                  family_of: dict[str, Any], config: SplitConfig) -> list[str]:
    """The second pass for one region: each row's `kind:hop`."""
    id_genera = {genus_of[s] for s in ids if s in genus_of}
    id_families = {family_of[s] for s in ids if s in family_of}
    ood_genera = {genus_of[s] for s in local | non_local}
    drop = ood_genera - id_genera
    assigned = []
    for species, genus, family, _lat, _lon, taxon in records:
        if taxon != config.target_taxon:
            kind = "non_target"
        elif species in ids:
            kind = "id"
        elif species in local:
            kind = "local"
        elif species in non_local:
            kind = "non_local"
        elif genus in drop:
            kind = "dropped"
        else:
            kind = "aux"
        hop = 0 if kind == "id" else 1 if genus in id_genera else 2 if family in id_families else 3
        assigned.append(f"{kind}:{hop}")
    return assigned


def _timed(fn: Any) -> tuple[Any, float]:
    start = time.perf_counter()
    value = fn()
    return value, time.perf_counter() - start


def species_for(rows: int) -> int:
    return max(20, round(rows * PAPER_SPECIES / PAPER_ROWS))


def disk_rate(data: bytes, folder: Path, repeat: int = 3) -> float:
    """MiB/s of writing `data` as make_splits writes a manifest (a temp file renamed), best of `repeat`."""
    best = float("inf")
    for i in range(repeat):
        start = time.perf_counter()
        with atomic_path(folder / f"rate{i}.jsonl") as tmp, open(tmp, "wb") as handle:
            for at in range(0, len(data), 1 << 22):
                handle.write(data[at:at + (1 << 22)])
        best = min(best, time.perf_counter() - start)
    return len(data) / 2**20 / best


def builder(rows: int, subsample: int, seed: int) -> dict[str, Any]:
    occ, ids_table = synthetic_occurrences(rows, n_species=species_for(rows), seed=seed)
    ids = read_id_species(ids_table)
    # the subsample drops some ID species below min_images: a shortfall there, not an error
    config = SplitConfig(target_taxon="moth", seed=seed, allow_missing_id_species=True)
    sub = (occ.iloc[np.sort(np.random.default_rng(seed).choice(len(occ), subsample, replace=False))]
           .reset_index(drop=True))

    _, naive_sub = _timed(lambda: naive_assign(sub, ids, config))
    _, iterrows_sub = _timed(lambda: naive_assign(sub, ids, config, iterrows=True))
    _, vec_sub = _timed(lambda: build_splits(sub, ids, config))
    splits, vec_full = _timed(lambda: build_splits(occ, ids, config))
    with tempfile.TemporaryDirectory() as tmp:
        _, write_full = _timed(lambda: write_splits(splits, Path(tmp) / "splits", image_root=tmp))
        data = b"".join((Path(tmp) / "splits" / r / "metadata.jsonl").read_bytes() for r in splits.regions)
        rate = disk_rate(data, Path(tmp))
    scale = rows / subsample
    return {
        "rows": rows, "species": species_for(rows), "subsample": subsample, "regions": len(ids),
        "rows_written": int(sum(len(f) for f in splits.regions.values())), "manifest_mib": round(len(data) / 2**20, 1),
        "naive_loop_subsample_s": naive_sub, "vectorised_subsample_s": vec_sub,
        "iterrows_loop_subsample_s": iterrows_sub,
        "naive_loop_full_extrapolated_s": naive_sub * scale, "iterrows_loop_full_extrapolated_s": iterrows_sub * scale,
        "vectorised_full_s": vec_full, "write_manifests_full_s": write_full,
        "speedup_full_vs_naive_extrapolated": naive_sub * scale / vec_full,
        "speedup_full_vs_iterrows_extrapolated": iterrows_sub * scale / vec_full,
        "speedup_subsample": naive_sub / vec_sub, "disk_write_mib_per_s": round(rate, 1),
    }


CHILD = """
import json, sys, time
from pathlib import Path
from gen.insects import SplitConfig, make_splits
from pipelines.curation.gbif import TaxonFilter
def kib(field):
    return next(int(l.split()[1]) for l in Path("/proc/self/status").read_text().splitlines() if l.startswith(field))
Path("/proc/self/clear_refs").write_text("5")
base, timings = kib("VmRSS:"), {}
archive, ids, out = sys.argv[1:4]
config = SplitConfig(allow_missing_id_species=True)  # the half-size table has fewer images of some ID species
make_splits(archive, ids, out, out, config, taxa=TaxonFilter(preset="moths"), check_files=False, timings=timings)
print(json.dumps({**timings, "import_rss_mib": base / 1024, "added_rss_mib": (kib("VmHWM:") - base) / 1024}))
"""


def end_to_end(rows: int, seed: int) -> dict[str, Any]:
    """make_splits from archives of rows/2 and rows images, each in a fresh process; the line through both."""
    sizes = (rows // 2, rows)
    runs = {}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                         os.environ.get("PYTHONPATH", "")])}
    with tempfile.TemporaryDirectory() as tmp:
        occ, ids = synthetic_occurrences(rows, n_species=species_for(rows), seed=seed)
        ids.to_csv(Path(tmp) / "ids.csv", index=False)
        for n in sizes:
            archive = write_gbif_archive(Path(tmp) / f"gbif{n}.zip", occ.iloc[:n], seed=seed)
            run = subprocess.run([sys.executable, "-c", CHILD, str(archive), str(Path(tmp) / "ids.csv"),
                                  str(Path(tmp) / f"out{n}")], capture_output=True, text=True, env=env)
            if run.returncode != 0:
                raise RuntimeError(f"make_splits on {n} rows failed: {run.stderr.strip()[-2000:]}")
            runs[n] = json.loads(run.stdout.strip().splitlines()[-1])
            archive.unlink()

    def line(key: str) -> float:
        half, full = runs[sizes[0]][key], runs[sizes[1]][key]
        return full + (full - half) / (sizes[1] - sizes[0]) * (PAPER_ROWS - rows)

    stages = ("read", "build", "manifests")
    at_paper = {f"{k}_s": round(line(k), 1) for k in stages}
    at_paper["peak_rss_mib"] = round(runs[rows]["import_rss_mib"] + line("added_rss_mib"), 0)
    return {"sizes": {str(n): {k: round(v, 2) if isinstance(v, float) else v for k, v in r.items()}
                      for n, r in runs.items()},
            "at_paper_size": {"rows": PAPER_ROWS, "species": PAPER_SPECIES, **at_paper,
                              "total_s": round(sum(at_paper[f"{k}_s"] for k in stages), 1)}}


def main(argv: list[str] | None = None) -> None:
    p = parser(__doc__)
    p.add_argument("--rows", type=int, default=300_000)
    p.add_argument("--subsample", type=int, default=30_000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    args = p.parse_args(argv)
    result = builder(args.rows, min(args.subsample, args.rows), args.seed)
    result["make_splits"] = end_to_end(args.rows, args.seed)
    result["machine"] = {"platform": platform.platform(), "python": platform.python_version(), "cpus": os.cpu_count(),
                         "load_average": [round(x, 2) for x in os.getloadavg()]}
    atomic_write_json(args.out, result)
    print("| measure | value |\n|---|---|")
    for key in ("rows", "species", "rows_written", "vectorised_full_s", "write_manifests_full_s",
                "naive_loop_full_extrapolated_s", "iterrows_loop_full_extrapolated_s",
                "speedup_full_vs_naive_extrapolated", "speedup_full_vs_iterrows_extrapolated", "speedup_subsample",
                "disk_write_mib_per_s"):
        value = result[key]
        print(f"| {key} | {value:.3g} |" if isinstance(value, float) else f"| {key} | {value} |")
    for n, run in result["make_splits"]["sizes"].items():
        print(f"| make_splits from a GBIF archive of {int(n):,} rows: read / build / manifests s, added peak RSS MiB | "
              f"{run['read']:.1f} / {run['build']:.1f} / {run['manifests']:.1f}, {run['added_rss_mib']:.0f} "
              f"(imports {run['import_rss_mib']:.0f}) |")
    at = result["make_splits"]["at_paper_size"]
    print(f"| at 2,912,168 rows / 28,388 species (extrapolated): read / build / manifests s, peak RSS MiB | "
          f"{at['read_s']:.0f} / {at['build_s']:.0f} / {at['manifests_s']:.0f}, {at['peak_rss_mib']:.0f} |")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    sys.exit(run_main(main, doc=README_SECTIONS["scripts"]))
