"""Build Open-Insects style geographic open-set splits: `python scripts/make_splits.py --occurrences occ.parquet
--id-species id.csv --image-root /data/images --out splits/` (or `--synthetic 100000` for a generated example).

Writes splits/<region>/metadata.jsonl (manifest rows: ID train/val/test, local / non-local / non-target OOD, auxiliary
train/val; file_name relative to --image-root), splits/<region>/manifest_info.json, splits/summary.{csv,md}.
Bad arguments and tables print one line and exit with status 2 (`--debug` shows the traceback).
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

from gen.insects import AUSTRALIA, REGIONS, Box, SplitConfig, make_splits, synthetic_occurrences
from pipelines.cli import pairs, parser, run_main
from pipelines.errors import ConfigError


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = parser(__doc__)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--occurrences", type=Path, help="CSV/Parquet: species, genus, family, lat, lon, file_name [, split, taxon]")
    src.add_argument("--synthetic", type=int, metavar="N", help="generate an N-row synthetic table (written to OUT/synthetic/)")
    p.add_argument("--id-species", type=Path, help="CSV/Parquet: region, species (required with --occurrences)")
    p.add_argument("--image-root", type=Path, default=None, help="folder the file_name paths are relative to (default: OUT/synthetic for --synthetic)")
    p.add_argument("--out", type=Path, required=True, help="output folder")
    p.add_argument("--box", action="append", default=[], metavar="NAME=LAT_MIN,LAT_MAX,LON_MIN,LON_MAX",
                   help=f"add or replace a region box (built in: {', '.join(REGIONS)})")
    p.add_argument("--non-local-box", type=Box.parse, default=AUSTRALIA, help="box of the non-local OOD set (default: continental Australia)")
    p.add_argument("--pad", type=float, nargs=2, default=(1.0, 3.0), metavar=("LAT", "LON"), help="padding of the local box in degrees")
    p.add_argument("--non-target", type=Path, default=None, help="extra table of non-target images (file_name [, lat, lon])")
    p.add_argument("--target-taxon", default=None, help="value of the `taxon` column that is the target (others: non-target OOD)")
    p.add_argument("--non-local-cap", type=int, default=30, help="test images a non-local species (default 30)")
    p.add_argument("--aux-per-species", type=int, default=20, help="auxiliary train images a species (default 20; 0 = no cap)")
    p.add_argument("--aux-species", type=int, default=8000,
                   help="auxiliary species drawn among those with >= aux-per-species images (default 8000, Open-Insects; "
                        "0 = every auxiliary species)")
    p.add_argument("--aux-species-c-america", type=int, default=4000, help="the same for c-america (default 4000)")
    p.add_argument("--min-images", type=int, default=5, help="drop species with fewer images (default 5; 1 keeps all)")
    p.add_argument("--id-fractions", type=float, nargs=3, default=(0.7, 0.1, 0.2), metavar=("TRAIN", "VAL", "TEST"),
                   help="ID split per species (default AMI-GBIF 0.7 0.1 0.2; test/val only for species with >= 1/fraction images)")
    p.add_argument("--id-val-cap", type=int, default=10, help="ID val images a species at most (default 10; 0 = no cap; "
                   "c-america is left uncapped as in the reference code)")
    p.add_argument("--allow-missing-id-species", action="store_true",
                   help="warn instead of failing when an ID species is not in the occurrence table (or has too few images)")
    p.add_argument("--aux-val-size", type=int, default=None, help="auxiliary val images (default: as many as ID val)")
    p.add_argument("--id-cap", type=int, default=None, help="images an ID species at most (default: all)")
    p.add_argument("--local-cap", type=int, default=None, help="images a local OOD species at most (default: all)")
    p.add_argument("--non-target-cap", type=int, default=None, help="non-target test images at most (default: all)")
    p.add_argument("--seed", type=int, default=0)
    return p.parse_args(argv)


def split_config(args: argparse.Namespace) -> SplitConfig:
    """The SplitConfig of the command line (built-in region boxes plus `--box NAME=...`)."""
    regions = dict(REGIONS)
    for name, text in pairs(args.box, "--box").items():
        try:
            regions[name] = Box.parse(text)
        except ValueError as err:
            raise ConfigError(f"--box {name}: {err}") from None
    return SplitConfig(regions=regions, pad_lat=args.pad[0], pad_lon=args.pad[1], non_local_box=args.non_local_box,
                       non_local_cap=args.non_local_cap, aux_per_species=args.aux_per_species or None,
                       aux_val_size=args.aux_val_size, id_cap=args.id_cap, local_cap=args.local_cap,
                       non_target_cap=args.non_target_cap, target_taxon=args.target_taxon, seed=args.seed,
                       aux_species=args.aux_species or None,
                       aux_species_by_region={"c-america": args.aux_species_c_america or None},
                       min_images=args.min_images, id_fractions=tuple(args.id_fractions),
                       id_val_cap=args.id_val_cap or None, allow_missing_id_species=args.allow_missing_id_species)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    config = split_config(args)
    if args.synthetic:
        occ, ids = synthetic_occurrences(args.synthetic, seed=args.seed)
        folder = args.out / "synthetic"
        folder.mkdir(parents=True, exist_ok=True)
        occ.to_parquet(folder / "occurrences.parquet", index=False)
        ids.to_csv(folder / "id_species.csv", index=False)
        occurrences, id_species, image_root = occ, ids, args.image_root or folder
        config.target_taxon = config.target_taxon or "moth"
    else:
        if args.id_species is None or args.image_root is None:
            raise ConfigError("--occurrences needs --id-species and --image-root")
        occurrences, id_species, image_root = args.occurrences, args.id_species, args.image_root
    start = time.perf_counter()
    written, summary = make_splits(occurrences, id_species, args.out, image_root, config, non_target=args.non_target)
    print(summary.to_string(index=False))
    for region, folder in written.items():
        print(f"wrote {folder}/metadata.jsonl ({region})")
        missing = missing_id_species(folder)
        if missing:
            print(f"  warning: {len(missing)} ID species of {region} not in the splits, e.g. {missing[:5]}")
    print(f"done in {time.perf_counter() - start:.1f} s; summary in {args.out / 'summary.md'}")
    return 0


def missing_id_species(folder: Path) -> list[str]:
    return json.loads((folder / "manifest_info.json").read_text()).get("missing_id_species", [])


if __name__ == "__main__":
    sys.exit(run_main(main, doc="docs/species.md"))
