"""Benchmark: reading a GBIF-shaped Darwin Core Archive (occurrence.txt with many columns + multimedia.txt, zipped)
into one row per image. Ours (`pipelines.curation.gbif.read_archive`: meta.xml through python-dwca-reader's descriptor,
only the needed columns, read straight from the zip member) against the reader's own path (`DwCAReader`: extract the
zip, `pd_read` every column of core and extension, then the same merge), each in a fresh process on the same
archive (seconds of the read itself, and the process's peak RSS).

    python scripts/bench_gbif.py [--rows 200000] [--filler 120]   -> benchmarks/gbif.json
"""
from __future__ import annotations

import argparse
import json
import platform
import sys
import subprocess
import tempfile
import time
import zipfile
from pathlib import Path

import numpy as np

from pipelines.curation.gbif import read_archive
from pipelines.io import atomic_write_json

DWC, GBIF, DC = "http://rs.tdwg.org/dwc/terms/", "http://rs.gbif.org/terms/1.0/", "http://purl.org/dc/terms/"


def build(path: Path, rows: int, filler: int, seed: int = 0) -> None:
    """An archive of `rows` occurrences (one image each) with `filler` extra text columns, as GBIF's ~250."""
    rng = np.random.default_rng(seed)
    occ_terms = [GBIF + "gbifID", DWC + "decimalLatitude", DWC + "decimalLongitude", DWC + "order", DWC + "family",
                 DWC + "genus", GBIF + "species", GBIF + "speciesKey", DWC + "taxonRank", DWC + "taxonomicStatus",
                 *(f"{DWC}filler{i}" for i in range(filler))]
    media_terms = [GBIF + "gbifID", DC + "type", DC + "format", DC + "identifier", DC + "creator"]

    def section(tag: str, row_type: str, location: str, id_tag: str, terms: list[str]) -> str:
        fields = "".join(f'<field index="{i}" term="{t}"/>' for i, t in enumerate(terms))
        return (f'<{tag} encoding="UTF-8" fieldsTerminatedBy="\\t" linesTerminatedBy="\\n" fieldsEnclosedBy="" '
                f'ignoreHeaderLines="1" rowType="{row_type}"><files><location>{location}</location></files>'
                f'<{id_tag} index="0"/>{fields}</{tag}>')

    meta = ('<archive xmlns="http://rs.tdwg.org/dwc/text/">' + section("core", DWC + "Occurrence", "occurrence.txt", "id", occ_terms)
            + section("extension", GBIF + "Multimedia", "multimedia.txt", "coreid", media_terms) + "</archive>")
    ids = np.arange(rows) + 10**9
    species = rng.integers(0, max(rows // 100, 1), rows)
    filler_text = "\t".join(f"value{i}" for i in range(filler))
    occ = ["\t".join(t.rsplit("/", 1)[-1] for t in occ_terms)]
    occ += [f"{g}\t{lat:.4f}\t{lon:.4f}\tLepidoptera\tFam{s % 97}\tGen{s % 997}\tGen{s % 997} sp{s}\t{s}\tSPECIES\tACCEPTED\t"
            f"{filler_text}" for g, s, lat, lon in zip(ids, species, rng.uniform(-60, 70, rows), rng.uniform(-180, 180, rows))]
    media = ["\t".join(t.rsplit("/", 1)[-1] for t in media_terms)]
    media += [f"{g}\tStillImage\timage/jpeg\thttps://img.example.org/{g}.jpg\tsomeone" for g in ids]
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as zf:
        zf.writestr("meta.xml", meta)
        zf.writestr("occurrence.txt", "\n".join(occ) + "\n")
        zf.writestr("multimedia.txt", "\n".join(media) + "\n")


def reader_baseline(path: Path):
    """python-dwca-reader's own path: extract, pd_read every column of both files, merge."""
    from dwca.read import DwCAReader

    with DwCAReader(str(path)) as archive:
        core = archive.pd_read("occurrence.txt", dtype=str)
        ext = archive.pd_read("multimedia.txt", dtype=str)
    return core.merge(ext.rename(columns={"coreid": "id"}), on="id", how="inner")


def child(kind: str, path: Path) -> None:
    """Run one reader and print {"seconds", "rows", "peak_rss_mib"} (a fresh process each, so peaks do not mix)."""
    import resource

    start = time.perf_counter()
    frame = read_archive(path) if kind == "ours" else reader_baseline(path)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"seconds": round(seconds, 2), "rows": len(frame), "peak_rss_mib": round(peak, 1)}))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--rows", type=int, default=200_000)
    p.add_argument("--filler", type=int, default=120)
    p.add_argument("--out", type=Path, default=Path("benchmarks/gbif.json"))
    p.add_argument("--child", nargs=2, metavar=("KIND", "ARCHIVE"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child(args.child[0], Path(args.child[1]))
        return 0
    runs = {}
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "gbif.zip"
        build(path, args.rows, args.filler)
        for kind in ("ours", "reader"):
            out = subprocess.run([sys.executable, __file__, "--child", kind, str(path)], check=True,
                                 capture_output=True, text=True).stdout
            runs[kind] = json.loads(out.strip().splitlines()[-1])
            assert runs[kind]["rows"] == args.rows
        size = path.stat().st_size
    result = {"rows": args.rows, "columns": args.filler + 10, "zip_mib": round(size / 2**20, 1),
              "ours": runs["ours"], "reader_pd_read": runs["reader"],
              "speedup": round(runs["reader"]["seconds"] / runs["ours"]["seconds"], 2),
              "python": sys.version.split()[0], "machine": platform.machine()}
    print(f"{'measure':<28}{'ours':>10}{'reader pd_read':>16}")
    print(f"{'seconds':<28}{runs['ours']['seconds']:>10.2f}{runs['reader']['seconds']:>16.2f}   ({result['speedup']}x)")
    print(f"{'peak RSS (MiB)':<28}{runs['ours']['peak_rss_mib']:>10}{runs['reader']['peak_rss_mib']:>16}")
    atomic_write_json(args.out, result)
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
