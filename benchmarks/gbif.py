"""Benchmark: reading a GBIF-shaped Darwin Core Archive (occurrence.txt with GBIF's column names and width +
multimedia.txt, zipped; `gen.insects.archive.write_gbif_archive`) into one row per image.

Three readers, each in a fresh process on the same archive, interleaved, best of `--repeat` (seconds of the read,
peak RSS of the process and the peak the read added to its imports):

- ours: `pipelines.curation.gbif.read_archive` (meta.xml as the DwC-A guide says, the kept columns only, streamed
  from the zip member through pyarrow in chunks of whole rows, Arrow-backed text);
- pandas: the plain pandas reader (`pd.read_csv(usecols=..., dtype=str)` straight from the zip member, then
  `DataFrame.merge`), the baseline;
- dwca-reader: python-dwca-reader's own path (`DwCAReader`: extract the zip, `pd_read` every column of core and
  extension, then the same merge).

The seconds and the peak are extrapolated to the paper's size (2,912,168 images, 28,388 species) along the line
through the runs at `--rows / 2` and `--rows` (the imports' RSS counted once); `--rows 2912168 --readers ours` measures
it directly (the baselines need several GiB).

    python -m benchmarks.gbif [--rows 200000] [--columns 130] [--repeat 2]   -> benchmarks/gbif.json
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from pipelines.io import atomic_write_json

PAPER_ROWS, PAPER_SPECIES = 2_912_168, 28_388
READERS = ("ours", "pandas", "dwca-reader")


def pandas_baseline(path: Path):
    """The plain pandas reader: usecols from the zip member (pandas' C parser, Python str objects), then merge."""
    import csv
    import io
    import zipfile

    import pandas as pd

    from pipelines.curation.gbif import KEEP

    def read(zf: zipfile.ZipFile, name: str, id_name: str) -> pd.DataFrame:
        with io.TextIOWrapper(zf.open(name), encoding="utf-8", newline="") as handle:
            header = handle.readline().rstrip("\n").split("\t")
            names = [id_name if i == 0 else h for i, h in enumerate(header)]
            handle.seek(0)
            frame = pd.read_csv(handle, sep="\t", quoting=csv.QUOTE_NONE, dtype=str, keep_default_na=False,
                                na_values=[""], skiprows=1, header=None, names=names,
                                usecols=lambda c: c in KEEP, low_memory=False)
        return frame.rename(columns={id_name: "gbifID"})

    with zipfile.ZipFile(path) as zf:
        core, ext = read(zf, "occurrence.txt", "id"), read(zf, "multimedia.txt", "coreid")
    core = core.drop(columns=[c for c in ext.columns if c in core.columns and c != "gbifID"])
    return core.merge(ext, on="gbifID", how="inner", validate="one_to_many")


def reader_baseline(path: Path):
    """python-dwca-reader's own path: extract, pd_read every column of both files, merge."""
    from dwca.read import DwCAReader

    with DwCAReader(str(path)) as archive:
        core = archive.pd_read("occurrence.txt", dtype=str)
        ext = archive.pd_read("multimedia.txt", dtype=str)
    return core.merge(ext.rename(columns={"coreid": "id"}), on="id", how="inner")


def status_kib(field: str) -> int:
    """A field of /proc/self/status in KiB (VmRSS: now, VmHWM: the peak of this address space; ru_maxrss would also
    count the parent's peak, inherited across exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise OSError(f"no {field} in /proc/self/status (Linux only)")


def child(kind: str, path: Path) -> None:
    """Run one reader; print {"seconds", "rows", "peak_rss_mib", "added_rss_mib", "import_rss_mib"}."""
    import pandas
    import pyarrow

    from pipelines.curation.gbif import read_archive

    assert pandas and pyarrow  # imported before the baseline RSS: every reader needs them

    Path("/proc/self/clear_refs").write_text("5")  # the peak starts from here
    base = status_kib("VmRSS")
    start = time.perf_counter()
    frame = {"ours": read_archive, "pandas": pandas_baseline, "dwca-reader": reader_baseline}[kind](path)
    seconds = time.perf_counter() - start
    peak = status_kib("VmHWM")
    print(json.dumps({"seconds": round(seconds, 2), "rows": len(frame), "peak_rss_mib": round(peak / 1024, 1),
                      "added_rss_mib": round((peak - base) / 1024, 1), "import_rss_mib": round(base / 1024, 1)}))


def extrapolate(half: dict, full: dict, rows: int) -> dict:
    """Peak RSS and seconds at the paper's size from the runs at rows/2 and rows: the line through both (what does not
    grow with the rows, buffers and imports, counted once)."""
    def line(key: str) -> float:
        slope = (full[key] - half[key]) / (rows - rows // 2)
        return full[key] + slope * (PAPER_ROWS - rows)
    return {"rows": PAPER_ROWS, "seconds": round(line("seconds"), 1),
            "peak_rss_mib": round(full["import_rss_mib"] + line("added_rss_mib"), 0)}


def _best(runs: dict, key: tuple, run: dict) -> None:
    best = runs.get(key)
    runs[key] = run if best is None else {**run, **{k: min(run[k], best[k]) for k in
                                                    ("seconds", "peak_rss_mib", "added_rss_mib")}}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000, help="images (one per occurrence); the paper: 2912168")
    p.add_argument("--columns", type=int, default=130, help="occurrence.txt columns (GBIF ships about 250)")
    p.add_argument("--repeat", type=int, default=2, help="interleaved rounds; the best of each reader is kept")
    p.add_argument("--readers", default=",".join(READERS), help="comma-separated subset of " + ", ".join(READERS))
    p.add_argument("--out", type=Path, default=Path(__file__).with_suffix(".json"))
    p.add_argument("--child", nargs=2, metavar=("KIND", "ARCHIVE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    from gen.insects import synthetic_occurrences
    from gen.insects.archive import write_gbif_archive

    readers = [r for r in args.readers.split(",") if r]
    unknown = sorted(set(readers) - set(READERS))
    if unknown:
        p.error(f"--readers: unknown {unknown}; choose from {', '.join(READERS)}")
    species = max(20, round(args.rows * PAPER_SPECIES / PAPER_ROWS))
    runs: dict[tuple, dict] = {}
    sizes = (args.rows // 2, args.rows)
    with tempfile.TemporaryDirectory() as tmp:
        start = time.perf_counter()
        occ, _ = synthetic_occurrences(args.rows, n_species=species, seed=0)
        paths = {n: write_gbif_archive(Path(tmp) / f"gbif{n}.zip", occ.iloc[:n], columns=args.columns) for n in sizes}
        del occ
        built = time.perf_counter() - start
        env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1]),
                                                             os.environ.get("PYTHONPATH", "")])}
        for _ in range(args.repeat):
            for n in sizes:
                for kind in readers:
                    out = subprocess.run([sys.executable, "-m", "benchmarks.gbif", "--child", kind, str(paths[n])],
                                         check=True, capture_output=True, text=True, env=env).stdout
                    run = json.loads(out.strip().splitlines()[-1])
                    assert run["rows"] == n, run
                    _best(runs, (kind, n), run)
        path = paths[args.rows]
        size, unpacked = path.stat().st_size, sum(i.file_size for i in __import__("zipfile").ZipFile(path).infolist())
    half = {kind: runs[(kind, sizes[0])] for kind in readers}
    runs = {kind: runs[(kind, sizes[1])] for kind in readers}
    result = {"rows": args.rows, "species": species, "columns": args.columns, "zip_mib": round(size / 2**20, 1),
              "unpacked_mib": round(unpacked / 2**20, 1), "build_archive_s": round(built, 1), "repeat": args.repeat,
              "readers": {kind: {**run, "at_half_rows": half[kind],
                                 "at_paper_size": extrapolate(half[kind], run, args.rows)}
                          for kind, run in runs.items()},
              "python": sys.version.split()[0], "machine": platform.machine(), "cpus": os.cpu_count(),
              "load_average": [round(x, 2) for x in os.getloadavg()]}
    if "ours" in runs:
        result["speedup"] = {k: round(r["seconds"] / runs["ours"]["seconds"], 2)
                             for k, r in runs.items() if k != "ours"}
        result["peak_ratio"] = {k: round(r["peak_rss_mib"] / runs["ours"]["peak_rss_mib"], 2)
                                for k, r in runs.items() if k != "ours"}
    print(f"{args.rows:,} images, {species:,} species, {args.columns} columns ({result['unpacked_mib']:,} MiB "
          "unpacked)")
    print(f"{'reader':<14}{'seconds':>10}{'peak RSS MiB':>14}{'added MiB':>12}{'s @2.9M':>10}{'peak MiB @2.9M':>16}")
    for kind, run in result["readers"].items():
        at = run["at_paper_size"]
        print(f"{kind:<14}{run['seconds']:>10.2f}{run['peak_rss_mib']:>14.0f}{run['added_rss_mib']:>12.0f}"
              f"{at['seconds']:>10.0f}{at['peak_rss_mib']:>16.0f}")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
