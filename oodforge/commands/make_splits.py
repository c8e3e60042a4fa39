"""Build Open-Insects style geographic open-set splits: `oodforge make-splits --occurrences gbif.zip
--taxon-filter moths --id-species id.csv --image-root /data/images --out splits/` (a GBIF Darwin Core Archive, zip or
folder, or a CSV / TSV / Parquet table; or `--synthetic 100000` for a generated example).

Writes splits/<region>/metadata.jsonl (manifest rows: ID train/val/test, local / non-local / non-target OOD, auxiliary
train/val; file_name relative to --image-root; GBIF ids kept), splits/<region>/manifest_info.json and
splits/summary.{csv,md,json} (species and images per set and hop, rows dropped by reason, shortfalls).
Every option is checked (gen.insects.MakeSplitsConfig) before a table is read; bad arguments and tables print one line
and exit with status 2 (`--debug` shows the traceback).
"""
from __future__ import annotations

import argparse
import io
import re
import time
from pathlib import Path
from typing import Any

from gen.insects import REGIONS, MakeSplitsConfig, SplitConfig, make_splits, shortfall_lines, synthetic_occurrences
from gen.insects.cost import estimate, write_rate
from gen.insects.manifests import fetched_store
from oodforge.args import command_parser, key_help, load_config
from pipelines.cli import cli_value, pairs
from pipelines.curation.gbif import TableLimits

DOC = "docs/species.md"
"""Where the command's inputs are documented (named in its one-line errors)."""

NONE_IF_ZERO = ("aux_per_species", "aux_species", "id_val_cap")
RATES = Path(__file__).resolve().parents[2] / "benchmarks" / "splits.json"
"""Where the dry run's estimate takes the disk write rate from (`python -m benchmarks.splits` measures it)."""
LIMITS = ("max_rows", "max_member_bytes", "max_line_bytes", "max_kept_bytes")
SPLIT = ("non_local_box", "target_taxon", "non_local_cap", "aux_per_species", "aux_species", "min_images",
         "id_fractions", "id_val_cap", "allow_missing_id_species", "aux_val_size", "id_cap", "local_cap",
         "non_target_cap", "seed")
"""The `split.*` keys whose flag is `--` + the key with dashes."""
FLAGS: dict[str, str | tuple[str, ...]] = {
    "--occurrences": "occurrences", "--synthetic": "synthetic", "--id-species": "id_species",
    "--image-root": "image_root", "--out": "out", "--non-target": "non_target", "--check-files": "check_files",
    "--taxon-filter": "taxa.preset", "--include": "taxa.include", "--exclude": "taxa.exclude",
    "--box": "split.regions", "--pad": ("split.pad_lat", "split.pad_lon"),
    **{"--" + name.replace("_", "-"): "split." + name for name in SPLIT},
    **{"--" + name.replace("_", "-"): "limits." + name for name in LIMITS}}
"""The command's flags as shorthands of its config's keys (docs/cli.md); --store is the run's, not the config's."""


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__name__, __doc__, dry_run=True)
    p.add_argument("--occurrences",
                   help="GBIF Darwin Core Archive (zip or unpacked folder) or CSV/TSV/Parquet: species, "
                                         "genus, family, lat, lon, file_name [, split, taxon] (GBIF names mapped)")
    p.add_argument("--synthetic", metavar="N", help="generate an N-row synthetic table (written to OUT/synthetic/)")
    p.add_argument("--id-species", help="CSV/TSV/Parquet: region, species (required with --occurrences)")
    p.add_argument("--image-root", default=None,
                   help="folder the file_name paths are relative to (default: OUT/synthetic for --synthetic)")
    p.add_argument("--out", default=None, help="output folder")
    p.add_argument("--taxon-filter", default=None, metavar="NAME", help="a named taxon rule: moths (Open-Insects)")
    p.add_argument("--include", action="append", default=[], metavar="RANK=VALUE[,VALUE]",
                   help="keep only these taxa (repeatable)")
    p.add_argument("--exclude", action="append", default=[], metavar="RANK=VALUE[,VALUE]",
                   help="drop these taxa (repeatable)")
    p.add_argument("--check-files", action=argparse.BooleanOptionalAction, default=None,
                   help="drop rows whose image is not under --image-root (default: on for archives)")
    p.add_argument("--box", action="append", default=[], metavar="NAME=LAT_MIN,LAT_MAX,LON_MIN,LON_MAX",
                   help=f"add or replace a region box (built in: {', '.join(REGIONS)})")
    p.add_argument("--non-local-box", default=None,
                   help="box of the non-local OOD set (default: continental Australia)")
    p.add_argument("--pad", nargs=2, default=None, metavar=("LAT", "LON"),
                   help="padding of the local box in degrees (1 3)")
    p.add_argument("--non-target", default=None,
                   help="extra table or archive of non-target images (file_name [, lat, lon])")
    p.add_argument("--target-taxon", default=None,
                   help="value of the `taxon` column that is the target (others: non-target OOD)")
    p.add_argument("--non-local-cap", default=None, help=key_help(SplitConfig, "non_local_cap"))
    p.add_argument("--aux-per-species", default=None, help=key_help(SplitConfig, "aux_per_species", "0 = no cap"))
    p.add_argument("--aux-species", default=None,
                   help=key_help(SplitConfig, "aux_species", "0 = every one; per region: split.aux_species_by_region."
                                                             "REGION=N, default c-america 4000"))
    p.add_argument("--min-images", default=None, help=key_help(SplitConfig, "min_images"))
    p.add_argument("--id-fractions", nargs=3, default=None, metavar=("TRAIN", "VAL", "TEST"),
                   help="ID split per species, summing to 1 (default AMI-GBIF 0.7 0.1 0.2; test/val only for species "
                        "with >= 1/fraction images)")
    p.add_argument("--id-val-cap", default=None, help=key_help(SplitConfig, "id_val_cap", "0 = no cap; split."
                                                                "id_val_uncapped regions are left uncapped"))
    p.add_argument("--allow-missing-id-species", action="store_true", default=None,
                   help="warn instead of failing when an ID species is not in the occurrence table (or has too few "
                   "images)")
    for name in ("aux_val_size", "id_cap", "local_cap", "non_target_cap", "seed"):
        p.add_argument("--" + name.replace("_", "-"), default=None, help=key_help(SplitConfig, name))
    p.add_argument("--store", choices=("folder", "shards"), default="folder",
                   help="folder: rows point into --image-root (default); shards: the regions' images are packed once "
                        "into OUT/shards/ and every region's rows point there (docs/shards.md); an --image-root "
                        "holding fetch_images' shards/ is read from its shards either way")
    for key in LIMITS:
        p.add_argument("--" + key.replace("_", "-"), default=None, metavar="N",
                       help=f"TableLimits.{key} of the occurrence table or archive (default "
                       f"{getattr(TableLimits(), key):,}; "
                            "bytes may be written 16MiB, 2GiB)")
    return p


def options(args: argparse.Namespace) -> MakeSplitsConfig:
    """The typed config: the `--config` file, the `key=value` overrides, then the flags."""
    return load_config(MakeSplitsConfig, args, FLAGS, CONVERT)


UNITS = {"": 1, "b": 1, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40, "kb": 10**3, "mb": 10**6,
         "gb": 10**9, "tb": 10**12}


def byte_count(text: str) -> Any:
    """`16MiB` / `2 GB` / `1000` as a number (anything else is left for the config's type check to refuse)."""
    match = re.fullmatch(r"\s*([0-9][0-9_,]*)\s*([A-Za-z]*)\s*", text)
    if match and match.group(2).lower() in UNITS:
        return int(match.group(1).replace("_", "").replace(",", "")) * UNITS[match.group(2).lower()]
    return cli_value(text)


CONVERT = {**{"--" + name.replace("_", "-"): cli_value for name in SPLIT if name not in ("non_local_box",
                                                                                          "target_taxon")},
           **{"--" + name.replace("_", "-"): lambda text: cli_value(text) or None for name in NONE_IF_ZERO},
           **{"--" + name.replace("_", "-"): byte_count for name in LIMITS},
           "--synthetic": cli_value, "--pad": cli_value, "--box": lambda boxes: {**REGIONS, **pairs(boxes, "--box")}}
"""Flag value -> key value: numbers read as YAML (the config checks them), byte counts with units, 0 caps: none."""


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    opts, dry_run = options(args), args.dry_run
    out = Path(opts.out)
    occurrences, id_species, image_root, config, extra_bytes = _inputs(opts, dry_run)
    start, timings = time.perf_counter(), {}
    written, summary, record = make_splits(occurrences, id_species, out, image_root, config,
                                           non_target=opts.non_target, taxa=opts.taxa, check_files=opts.check_files,
                                           dry_run=dry_run, timings=timings, limits=opts.limits)
    _print_record(summary, record, written, dry_run)
    if dry_run:
        print(f"dry run: every check passed in {time.perf_counter() - start:.1f} s; nothing written")
        for line in estimate(timings, write_rate(RATES), extra_bytes):
            print(line)
        return 0
    _pack(image_root, args.store, written, out)
    print(f"done in {time.perf_counter() - start:.1f} s; summary in {out / 'summary.md'} and {out / 'summary.json'}")
    return 0


def _inputs(opts: MakeSplitsConfig, dry_run: bool) -> tuple[Any, Any, Path, SplitConfig, int]:
    """(occurrences, ID species, image root, split config, bytes written besides the splits): the given files, or a
    synthetic archive written under `out/synthetic` (measured in memory on a dry run; its target taxon "moth")."""
    config = opts.split
    if not opts.synthetic:
        return Path(opts.occurrences), Path(opts.id_species), Path(opts.image_root), config, 0
    out = Path(opts.out)
    extra_bytes = 0
    occ, ids = synthetic_occurrences(opts.synthetic, seed=config.seed)
    folder = out / "synthetic"
    if not dry_run:
        folder.mkdir(parents=True, exist_ok=True)
        occ.to_parquet(folder / "occurrences.parquet", index=False)
        ids.to_csv(folder / "id_species.csv", index=False)
    else:  # the bytes the run writes there, measured in memory
        sink = io.BytesIO()
        occ.to_parquet(sink, index=False)
        extra_bytes = sink.tell() + len(ids.to_csv(index=False).encode())
    if config.target_taxon is None:
        config = config.replace(target_taxon="moth")
    return occ, ids, Path(opts.image_root or folder), config, extra_bytes


def _print_record(summary: Any, record: dict[str, Any], written: dict[str, Path], dry_run: bool) -> None:
    """The summary table, the rows dropped, the shortfalls and each region's manifest (with missing ID species)."""
    print(summary.to_string(index=False))
    if record["dropped"]:
        print("rows dropped: " + ", ".join(f"{reason} {n}" for reason, n in record["dropped"].items()))
    for line in shortfall_lines(record):
        print(line)
    for region, folder in written.items():
        print(f"{'would write' if dry_run else 'wrote'} {folder}/metadata.jsonl ({region})")
        missing = record["missing_id_species"].get(region, [])
        if missing:
            print(f"  warning: {len(missing)} ID species of {region} not in the splits, e.g. {missing[:5]}")


def _pack(image_root: Path, store_kind: str | None, written: dict[str, Path], out: Path) -> None:
    """Packs the manifests' images into a shard store when asked (`--store shards`) unless the rows already point
    into one."""
    if (store := fetched_store(image_root)) is not None:
        print(f"rows point into the shard store {store} (fetch-images --store shards): no pack step")
    elif store_kind == "shards":
        from pipelines.shards import pack_manifests, pack_workers

        packed = pack_manifests(list(written.values()), out / "shards", workers=pack_workers())
        print(f"packed {len(packed.members)} images into {len(packed.written) + len(packed.kept)} shard(s) in "
              f"{packed.store} ({len(packed.missing)} missing)")
