"""Any manifest -> a shard manifest (images in WebDataset-layout tar shards, read by offset):
`oodforge pack-shards data/own --out data/own_shards` (then use data/own_shards wherever data/own was used).

Writes OUT/metadata.jsonl (the same rows plus shard_file, shard_member, shard_offset, shard_bytes),
OUT/manifest_info.json (image_root: the store), OUT/shards/NNNNNN.tar + NNNNNN.index.json and OUT/shards/store.json.
Images are stored byte for byte unless --resize asks (fetch's modes: keep_ratio, img2dataset's: shorter side above 512
resized, quality 95; reference, Open-Insect's download.py: shorter side to 224, quality 75). Shard by shard, each
atomically: rerun the same command after an interruption and it packs only the shards not yet finished. `--out` may be
the source folder (converted in place).

`--dry-run` runs every check (the manifest, every source image's size, the shard plan, the finished shards of an
earlier run), packs a few images in memory and prints the estimated time and disk; nothing is written.
`--verify DIR` checks a store or a shard manifest's store: every shard's sha256, every indexed member at its offset in
the tar, no link, device or escaping member name, and a manifest's every shard row against the store (its shard inside
the store and recorded there, its member in that shard's index at the row's offset and size); it then records the
shards' current modified times (a copied store checks in stat mode without re-hashing). Format and measurements:
docs/shards.md.
"""
from __future__ import annotations

import sys
from pathlib import Path

from oodforge.args import command_parser, key_help, load_config, parse
from pipelines.cli import cli_value
from pipelines.data import METADATA, manifest_lines, read_manifest
from pipelines.errors import UserInputError
from pipelines.progress import progress
from pipelines.shards import (
    SHARD_FOLDER,
    PackConfig,
    check_source_rows,
    estimate,
    pack_manifest,
    pack_workers,
    plan_pack,
    record_mtimes,
)
from pipelines.store import STORE_FILE, ShardError, is_shard_row, read_store, row_problems, verify_shard

DOC = "docs/shards.md"


NUMBERS = ("samples_per_shard", "shard_bytes", "short_side", "quality")
FLAGS = {"--resize": "resize", **{"--" + name.replace("_", "-"): name for name in NUMBERS}}
"""The command's flags as shorthands of its config's keys (docs/cli.md); SOURCE, --out, --shard-dir, --workers and
--verify are the run's, not the config's."""
CONVERT = {"--" + name.replace("_", "-"): cli_value for name in NUMBERS}
"""Flag value -> key value: numbers read as YAML (the config checks them)."""


def config_of(args) -> PackConfig:
    """The typed config: the `--config` file, the `key=value` overrides, then the flags."""
    return load_config(PackConfig, args, FLAGS, CONVERT)


def store_root(folder: Path) -> tuple[Path, list[str]]:
    """The store a --verify argument names (the folder itself with store.json, or a shard manifest's image root) and
    the problems of the manifest's shard rows against that store (`row_problems`; none for a bare store)."""
    if (folder / STORE_FILE).is_file():
        return folder, []
    if (folder / METADATA).is_file():
        manifest = read_manifest(folder)
        if any(is_shard_row(r) for r in manifest.rows):
            lines = (f"{folder / METADATA}: line {n}" for n, _ in manifest_lines(folder / METADATA))
            return manifest.root, list(row_problems(manifest.root, manifest.rows, lines))
    raise UserInputError(f"{folder}: neither a shard store ({STORE_FILE}) nor a shard manifest", doc=DOC)


def verify(folder: Path) -> int:
    root, problems = store_root(folder)
    records = read_store(root)
    for name, record in progress(sorted(records.items()), "verify", total=len(records), unit="shard"):
        problems += verify_shard(root / name, record)
    if problems:
        for line in problems[1:]:
            print(line, file=sys.stderr)
        raise ShardError(f"{len(problems)} problem(s) in the store {root}; first: {problems[0]}")
    refreshed = record_mtimes(root)
    if refreshed:
        print(f"recorded the current modified time of {refreshed} shard(s)")
    print(f"{len(records)} shard(s) in {root}: sound")
    return 0


def build_parser():
    p = command_parser(__name__, __doc__, out=True, dry_run=True)
    p.add_argument("source", type=Path, nargs="?", help="manifest folder (metadata.jsonl [+ manifest_info.json])")
    p.add_argument("--shard-dir", type=Path, default=None, help=f"shard folder (default OUT/{SHARD_FOLDER})")
    for name in ("samples_per_shard", "shard_bytes"):
        p.add_argument("--" + name.replace("_", "-"), default=None, help=key_help(PackConfig, name))
    p.add_argument("--resize", default=None, choices=["reference", "keep_ratio", "none"],
                   help=key_help(PackConfig, "resize"))
    for name in ("short_side", "quality"):
        p.add_argument("--" + name.replace("_", "-"), default=None, help=key_help(PackConfig, name))
    p.add_argument("--workers", type=int, default=None, help="processes writing shards (default: the CPUs - 1)")
    p.add_argument("--verify", type=Path, default=None, metavar="DIR", help="check a store or a shard manifest's store")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = parse(p, argv, intermixed=True)
    if args.verify is not None:
        return verify(args.verify)
    if args.source is None or args.out is None:
        p.error("give SOURCE and --out (or --verify DIR)")
    config = config_of(args)
    workers = args.workers or pack_workers()
    if not (args.source / METADATA).is_file():
        raise UserInputError(f"{args.source}: no {METADATA}, not a manifest folder (an image folder becomes one with "
                             "oodforge import-folder ... --store shards)", doc=DOC)
    store = args.shard_dir or args.out / SHARD_FOLDER
    if args.dry_run:
        manifest = read_manifest(args.source)
        check_source_rows(manifest, args.source / METADATA)
        plan = plan_pack(((r["file_name"], manifest.path(r)) for r in manifest.rows), store, config)
        found = estimate(plan, config, workers)
        line = (f"would pack {found['todo_images']} of {found['images']} images into {found['todo_shards']} shard(s) "
                f"({found['finished_shards']} of {found['shards']} already finished) -> {store}; "
                f"{found['source_bytes'] / 1e9:.2f} GB to read, {found['missing']} missing image(s)")
        print(line)
        if "estimated_seconds" in found:
            print(f"estimate at the rate measured here ({1 / found['seconds_per_image']:.1f} img/s a process, "
                  f"{workers} process(es)): {found['estimated_seconds'] / 3600:.2f} h, "
                  f"{found['estimated_bytes'] / 1e9:.2f} GB of shards")
        print("dry run: every check passed; nothing written")
        return 0
    bar = progress(desc="pack", unit="shard")
    manifest, result = pack_manifest(args.source, args.out, config, workers=workers, store=store,
                                     on_shard=lambda index: bar.update(1))
    bar.close()
    print(f"{len(manifest)} rows -> {args.out}/{METADATA}; {len(result.written)} shard(s) written, "
          f"{len(result.kept)} kept from an earlier run, in {result.store}")
    if result.missing:
        print(f"{len(result.missing)} image(s) missing, rows kept without bytes (e.g. {result.missing[0]})")
    if result.undecoded:
        print(f"{len(result.undecoded)} image(s) did not decode, stored as they are (e.g. {result.undecoded[0]})")
    return 0
