"""Import the Open-Insect benchmark as its authors released it: `oodforge import-open-insect SOURCE --region
c-america --out splits` (then configs/species_c-america.yaml runs on splits/c-america unchanged).

SOURCE: a folder in the reference download.py's layout (images/ + metadata/<region>/<split>.txt), the Hugging Face
dataset id yuyan-chen/open-insect (read with `datasets`, its offline cache honoured), or a local copy of that dataset
repository (its CSV / Parquet / Arrow tables). Writes OUT/<region>/metadata.jsonl + manifest_info.json as
make-splits does (every released row in its released split: ID train/val/test, local / non-local / non-moth OOD
test, train_aux as the auxiliary rows, val_ood as the OOD validation rows), class_names.json from `--category-map`
(RolnickLab/Open-Insect data/<region>_category_map.json), missing.csv (rows whose image is not there, left out) and
OUT/summary.{json,csv,md}. `--bci` imports the BCI field set instead, to OUT/field_bci/. Images not on disk are
fetched from their URLs into OUT/images/ (fetch-images: resumable, resized as download.py --resize_size 224).
`--dry-run` reads and checks every row and prints the counts per split and set (the paper's Table 1); nothing is
fetched or written. A bad list line (a path leaving the image root, a label outside the category map) is one line
naming the file and line, exit status 2.
"""
from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

from oodforge.args import command_parser, key_help, load_config, parse
from pipelines.cli import cli_value
from pipelines.curation.open_insect_import import OpenInsectImport, import_open_insect

DOC = "docs/species.md"
"""Where the command's inputs are documented (named in its one-line errors)."""

NUMBERS = ("rate", "timeout", "retries")
FLAGS = {"SOURCE": "source", "--out": "out", "--region": "region", "--bci": "bci", "--category-map": "category_map",
         "--workers": "workers", **{"--" + name: name for name in NUMBERS}}
"""The command's flags as shorthands of its config's keys (docs/cli.md)."""
SHOWN = 10
"""Missing images listed on the terminal (all of them are in missing.csv)."""


def build_parser() -> argparse.ArgumentParser:
    p = command_parser(__name__, __doc__, dry_run=True)
    p.add_argument("source", nargs="?", default=None, help=OpenInsectImport.doc("source"))
    p.add_argument("--region", default=None, choices=["ne-america", "w-europe", "c-america"],
                   help="the region's splits to import (with --bci: c-america)")
    p.add_argument("--out", default=None, help="output folder (OUT/<region>/, OUT/field_bci/, OUT/images/)")
    p.add_argument("--bci", action="store_true", default=None, help=OpenInsectImport.doc("bci"))
    p.add_argument("--category-map", default=None, metavar="FILE", help=OpenInsectImport.doc("category_map"))
    p.add_argument("--workers", type=int, default=None, help=key_help(OpenInsectImport, "workers"))
    for name in NUMBERS:
        p.add_argument("--" + name, default=None, help=key_help(OpenInsectImport, name))
    return p


OVERRIDE = re.compile(r"[A-Za-z_][\w.-]*=.*")


def config_of(args: argparse.Namespace) -> OpenInsectImport:
    """The typed config: the `--config` file and `key=value` overrides, the flags over them; a fault names the flag.
    A first `key=value` where SOURCE would be (SOURCE given by the config file) is an override."""
    if args.source is not None and OVERRIDE.fullmatch(args.source) and not Path(args.source).exists():
        args.overrides, args.source = [args.source, *(args.overrides or [])], None
    return load_config(OpenInsectImport, args, FLAGS, {"--" + name: cli_value for name in NUMBERS})


def main(argv: list[str] | None = None) -> int:
    args = parse(build_parser(), argv, intermixed=True)
    cfg = config_of(args)
    done = import_open_insect(cfg, dry_run=args.dry_run)
    print(done.table.to_string(index=False))
    if done.absent:
        print(f"warning: the source holds no {', '.join(done.absent)} (not imported)")
    if len(done.missing):
        where = "would be left out" if args.dry_run else f"left out, listed in {done.folder / 'missing.csv'}"
        print(f"{len(done.missing)} image(s) missing, {where}:")
        for row in done.missing.head(SHOWN).itertuples(index=False):
            print(f"  {row.release_split}: {row.image_path}: {row.reason}")
    if done.fetch is not None:
        plan = done.fetch
        print(f"fetch: {plan['planned']} URLs, {plan['already_fetched']} already fetched, {plan['to_fetch']} to fetch "
              f"from {plan['hosts']} host(s); {plan['estimate']['text']}")
    if args.dry_run:
        print(f"dry run: every row checked; would write {done.folder}/metadata.jsonl; nothing fetched or written")
        return 0
    print(f"wrote {done.folder}/metadata.jsonl ({int(done.table['images'].sum())} images)")
    if done.throttled is not None:
        print(f"warning: {done.throttled}", file=sys.stderr)
        raise done.throttled
    return 0
