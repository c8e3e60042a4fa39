"""Download the images of a GBIF archive or an occurrence table, resumably: `python scripts/fetch_images.py
--occurrences gbif.zip --taxon-filter moths --out data/moths` (then `make_splits.py --occurrences data/moths/images.csv
--image-root data/moths ...`).

Writes OUT/images/... (one file per URL, atomically), OUT/images.csv (the fetched rows with file_name), OUT/failures.csv
(every URL that failed, with its reason), OUT/fetch_summary.json; with `--filter-model DIR --drop-class NAME` the
classifier's dropped rows go to OUT/filtered.csv. Rerun the same command after an interruption (kill -9 included): it
fetches only what is missing. `--dry-run` reads and filters the input, counts what is already fetched and what is
left, checks the filter classifier, and requests nothing. Bad options print one line and exit 2 (`--debug` shows the
traceback).
"""
from __future__ import annotations

import json
import sys

from pipelines.cli import cli_value, flag_error, parser, run_main
from pipelines.curation.fetch import FetchConfig, fetch_images, fetch_plan, filter_classes
from pipelines.errors import ConfigError

FLAGS = {"taxa.preset": "--taxon-filter"}
NUMBERS = ("per_species", "workers", "rate", "timeout", "retries", "backoff", "min_bytes", "min_side", "max_bytes")


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, dry_run=True)
    p.add_argument("--occurrences", required=True, help="GBIF Darwin Core Archive (zip or folder) or a CSV/TSV/Parquet table with url, species")
    p.add_argument("--out", required=True, help="output folder")
    p.add_argument("--taxon-filter", default=None, metavar="NAME", help="a named taxon rule: moths (Open-Insects)")
    p.add_argument("--include", action="append", default=[], metavar="RANK=VALUE[,VALUE]", help="fetch only these taxa")
    p.add_argument("--exclude", action="append", default=[], metavar="RANK=VALUE[,VALUE]", help="skip these taxa")
    p.add_argument("--per-species", default=None, help="images a species at most (default 1000; 0 = no cap)")
    p.add_argument("--workers", default=None, help="parallel downloads (default 8)")
    p.add_argument("--rate", default=None, help="requests a second per host (default 2)")
    p.add_argument("--timeout", default=None, help="seconds a request may take (default 30)")
    p.add_argument("--retries", default=None, help="retries of timeouts, connection errors, 429 and 5xx (default 3)")
    p.add_argument("--backoff", default=None, help="seconds before the first retry, doubled each time (default 1)")
    p.add_argument("--min-bytes", default=None, help="drop smaller downloads (default 1024)")
    p.add_argument("--min-side", default=None, help="drop images whose longer side is shorter (thumbnails; default 128)")
    p.add_argument("--max-bytes", default=None, help="refuse larger downloads (default 64 MiB)")
    p.add_argument("--thumbnail-pattern", default=None, help=r"URLs matching this regex are skipped (default (?i)(thumb|/square\.|_sq\.); '' = none)")
    p.add_argument("--retry-failed", action="store_true", default=None, help="retry final failures (4xx, filters) too")
    p.add_argument("--filter-model", default=None, metavar="DIR", help="image-classifier folder run over the fetched images")
    p.add_argument("--drop-class", action="append", default=[], metavar="NAME", help="drop images it predicts as NAME (repeatable)")
    args = p.parse_args(argv)
    raw = {"occurrences": args.occurrences, "out": args.out, "retry_failed": args.retry_failed,
           "taxa": {"preset": args.taxon_filter, "include": args.include, "exclude": args.exclude}}
    for name in NUMBERS:
        if getattr(args, name) is not None:
            raw[name] = cli_value(getattr(args, name))
    if raw.get("per_species") == 0:
        raw["per_species"] = None
    if args.thumbnail_pattern is not None:
        raw["thumbnail_pattern"] = args.thumbnail_pattern or None
    try:
        cfg = FetchConfig.from_dict({k: v for k, v in raw.items() if v is not None}, "")
    except ConfigError as err:
        raise flag_error(err, FLAGS) from None
    if bool(args.filter_model) != bool(args.drop_class):
        raise ConfigError("--filter-model and --drop-class go together")
    if args.filter_model:  # checked before any download (its config only), and again by the run
        try:
            filter_classes(args.filter_model, args.drop_class)
        except ConfigError as err:
            raise flag_error(err, FLAGS) from None
    if args.dry_run:  # the input read and filtered, the ledger and files counted; no request, nothing written
        print(json.dumps(fetch_plan(cfg), indent=2))
        return 0
    summary = fetch_images(cfg, args.filter_model, args.drop_class)
    print(json.dumps(summary, indent=2))
    print(f"images.csv: {summary['kept']} rows; failures.csv: {sum(summary['failed'].values())} rows (in {cfg.out})")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="docs/species.md"))
