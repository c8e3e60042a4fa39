"""Download the images of a GBIF archive or an occurrence table, resumably: `oodforge fetch-images
--occurrences gbif.zip --taxon-filter moths --out data/moths` (then `oodforge make-splits --occurrences
data/moths/images.csv --image-root data/moths ...`).

Writes OUT/images/... (one file per URL, atomically; with --store shards OUT/shards/, tar shards), OUT/images.csv (the
fetched rows with file_name), OUT/failures.csv (every URL that failed, with its reason), OUT/fetch_summary.json; with
`--filter-model DIR --drop-class NAME` the classifier's dropped rows go to OUT/filtered.csv. Rerun the same command
after an interruption (kill -9 included): it fetches only what is missing; a second fetch on the same --out is refused
while one runs. Images are resized on fetch (--resize reference: as Open-Insect's download.py, the shorter side to 224,
JPEG quality 75; keep_ratio: img2dataset's, 512 at most; none keeps the originals; --keep-originals keeps both).
Each host's request rate adapts: unthrottled until it answers 429/503, then paced below what it allowed, paused for
its Retry-After, probed upwards again; a host that answers only 429/503 is given up (its URLs recorded as transient
failures, exit 2 once the rest is written). `--dry-run` reads and filters the input, counts what is already fetched
and what is left, prints the estimated time and disk (from this --out's ledger, else benchmarks/fetch.json), checks
the filter classifier, and requests nothing. Bad options print one line and exit 2 (`--debug` shows the traceback).
"""
from __future__ import annotations

import json
import sys

from oodforge.args import command_parser, key_help, load_config
from pipelines.cli import cli_value, flag_error
from pipelines.curation.fetch import FetchConfig, fetch_images, fetch_plan, filter_classes
from pipelines.errors import ConfigError

DOC = "docs/species.md"
"""Where the command's inputs are documented (named in its one-line errors)."""

NUMBERS = ("per_species", "workers", "rate", "timeout", "retries", "backoff", "retry_after_max", "give_up_after",
           "short_side", "quality", "max_pixels", "min_bytes", "min_side", "max_bytes", "samples_per_shard",
           "shard_bytes")
FLAGS: dict[str, str] = {
    "--occurrences": "occurrences", "--out": "out", "--taxon-filter": "taxa.preset", "--include": "taxa.include",
    "--exclude": "taxa.exclude", "--resize": "resize", "--store": "store", "--keep-originals": "keep_originals",
    "--thumbnail-pattern": "thumbnail_pattern", "--retry-failed": "retry_failed",
    **{"--" + name.replace("_", "-"): name for name in NUMBERS}}
"""The command's flags as shorthands of its config's keys (docs/cli.md); --filter-model and --drop-class are the
run's, not the config's."""
CONVERT = {**{"--" + name.replace("_", "-"): cli_value for name in NUMBERS},
           "--per-species": lambda text: cli_value(text) or None, "--thumbnail-pattern": lambda text: text or None}
"""Flag value -> key value: numbers read as YAML (the config checks them); 0 per species and '' patterns: none."""


def build_parser():
    p = command_parser(__name__, __doc__, dry_run=True)
    p.add_argument("--occurrences", default=None, help=FetchConfig.doc("occurrences"))
    p.add_argument("--out", default=None, help="output folder")
    p.add_argument("--taxon-filter", default=None, metavar="NAME", help="a named taxon rule: moths (Open-Insects)")
    p.add_argument("--include", action="append", default=[], metavar="RANK=VALUE[,VALUE]", help="fetch only these taxa")
    p.add_argument("--exclude", action="append", default=[], metavar="RANK=VALUE[,VALUE]", help="skip these taxa")
    p.add_argument("--per-species", default=None, help=key_help(FetchConfig, "per_species", "0 = no cap"))
    p.add_argument("--workers", type=int, default=None, help=key_help(FetchConfig, "workers"))
    p.add_argument("--rate", default=None, help=key_help(FetchConfig, "rate"))
    for name in ("timeout", "retries", "backoff", "retry_after_max", "give_up_after"):
        p.add_argument("--" + name.replace("_", "-"), default=None, help=key_help(FetchConfig, name))
    p.add_argument("--resize", default=None, choices=["reference", "keep_ratio", "none"],
                   help="resize on fetch: reference (Open-Insect's download.py: shorter side 224, JPEG quality 75; the "
                        "default), keep_ratio (img2dataset's: shorter side 512 at most, quality 95), none (originals)")
    p.add_argument("--short-side", default=None, help=key_help(FetchConfig, "short_side"))
    p.add_argument("--quality", default=None, help=key_help(FetchConfig, "quality"))
    p.add_argument("--store", default=None, choices=["folder", "shards"], help="folder: one file per image (default); "
                   "shards: tar shards in OUT/shards/ (pack-shards' format; make-splits reads them; docs/shards.md)")
    p.add_argument("--samples-per-shard", default=None, help=key_help(FetchConfig, "samples_per_shard"))
    p.add_argument("--shard-bytes", default=None, help=key_help(FetchConfig, "shard_bytes"))
    p.add_argument("--keep-originals", action="store_true", default=None,
                   help="also keep the downloaded files under OUT/originals/")
    for name in ("max_pixels", "min_bytes", "min_side", "max_bytes"):
        p.add_argument("--" + name.replace("_", "-"), default=None, help=key_help(FetchConfig, name))
    p.add_argument("--thumbnail-pattern", default=None, help=key_help(FetchConfig, "thumbnail_pattern", "'' = none"))
    p.add_argument("--retry-failed", action="store_true", default=None, help="retry final failures (4xx, filters) too")
    p.add_argument("--filter-model", default=None, metavar="DIR",
                   help="image-classifier folder run over the fetched images")
    p.add_argument("--drop-class", action="append", default=[], metavar="NAME",
                   help="drop images it predicts as NAME (repeatable)")
    return p


def config_of(args) -> FetchConfig:
    """The typed config: the `--config` file, the `key=value` overrides, then the flags."""
    return load_config(FetchConfig, args, FLAGS, CONVERT)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    cfg = config_of(args)
    if bool(args.filter_model) != bool(args.drop_class):
        raise ConfigError("--filter-model and --drop-class go together")
    if args.filter_model:  # checked before any download (its config only), and again by the run
        try:
            filter_classes(args.filter_model, args.drop_class)
        except ConfigError as err:
            raise flag_error(err, {}) from None
    if args.dry_run:  # the input read and filtered, the ledger and files counted; no request, nothing written
        planned = fetch_plan(cfg)
        print(json.dumps(planned, indent=2))
        print(f"estimate: {planned['estimate']['text']}", file=sys.stderr)
        return 0
    summary = fetch_images(cfg, args.filter_model, args.drop_class)
    print(json.dumps(summary, indent=2))
    print(f"images.csv: {summary['kept']} rows; failures.csv: {sum(summary['failed'].values())} rows (in {cfg.out})")
    return 0
