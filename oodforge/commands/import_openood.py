"""Manifests for OOD sets from OpenOOD's data folder or plain image folders (images stay where they are).

    oodforge import-openood --root /data/openood --out data/easy
    oodforge import-openood --root /data/openood --out data/easy --folder imagenet_o=/data/imagenet-o
    oodforge import-openood --out data/easy --folder texture=/data/dtd/images      # no --root, no --sets
    oodforge import-openood --out data/easy --sets texture --list texture=lists/dtd.txt --image-root /data/dtd
    oodforge import-openood --root /data/openood --benchmark cifar10 --out data/openood    # a whole v1.5 benchmark

Default with --root: ShiftedBronzes' five easy sets (species, imagenet_o, inaturalist, texture, openimage_o) from
`<root>/benchmark_imglist/<benchmark>/test_<set>.txt`; without --root, the sets given by --list / --folder. One
manifest folder per set under `--out` (`<out>/<set>/metadata.jsonl` + `manifest_info.json` naming the image folder;
a set name is made a safe folder name, `pipelines.io.safe_name`, so no name leaves `--out`), and
`<out>/import_summary.json` (per set: images, missing, unreadable, and what a folder walk skipped: hidden entries,
symlinks, loops, FIFOs / sockets / devices). Every image is decoded once: one that does not decode is left out and
listed in `<out>/<set>/failures.json`. A listed path that leads outside its image folder (through a symlink) is
refused in one line.

`--benchmark cifar10|cifar100|imagenet200|imagenet` without --sets / --list / --folder imports that OpenOOD v1.5
benchmark whole (`pipelines.openood_benchmarks`): one manifest `<out>/<benchmark>/` with the ID train / val / test rows
and their labels, the near-OOD and far-OOD test sets (groups near / far) and the OOD validation set, the lists and image
folders OpenOOD's evaluation API reads (docs/openood.md); `--dry-run` checks every list and prints the counts, writing
nothing. With --sets, --benchmark only names the list folder.
"""
from __future__ import annotations

from pathlib import Path

from oodforge.args import command_parser, load_config
from pipelines.cli import comma_list, pairs
from pipelines.importers import EASY_SETS, ImportResult, import_openood
from pipelines.openood_benchmarks import BENCHMARKS, counts, import_benchmark
from pipelines.params import REQUIRED, Config, config, param

DOC = "README.md, section 'Commands'"
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class ImportOpenOODConfig(Config):
    """What `oodforge import-openood` imports; every key has its flag (`FLAGS`)."""

    DOC = DOC

    out: str = param(REQUIRED, "output folder: one manifest folder per set")
    root: str | None = param(None, "OpenOOD's data folder (benchmark_imglist/, images_largescale/, images_classic/)")
    benchmark: str | None = param(None, "an OpenOOD v1.5 benchmark imported whole; with sets / list / folder the "
                                        "benchmark_imglist subfolder of the sets (null: imagenet)")
    sets: list[str] | None = param(None, "OOD sets; null with root: the five easy sets, without: those of lists / "
                                         "folders")
    group: str = param("easy", "group written on every row")
    lists: list[str] = param([], "SET=FILE image lists")
    folders: list[str] = param([], "SET=DIR plain image folders")
    image_root: str | None = param(None, "where the images of the lists live; null: under root")
    skip_missing: bool = param(False, "leave out listed images that do not exist (counted in the summary)")


FLAGS = {"--out": "out", "--root": "root", "--benchmark": "benchmark", "--sets": "sets", "--group": "group",
         "--list": "lists", "--folder": "folders", "--image-root": "image_root", "--skip-missing": "skip_missing"}
"""The command's flags as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__, out=True, dry_run=True)
    p.add_argument("--root", type=Path, default=None,
                   help="OpenOOD's data folder (holds benchmark_imglist/, images_largescale/, images_classic/)")
    p.add_argument("--benchmark", default=None,
                   help=f"an OpenOOD v1.5 benchmark ({', '.join(BENCHMARKS)}) imported whole; with --sets / --list / "
                   "--folder the benchmark_imglist subfolder of the sets (default imagenet)")
    p.add_argument("--sets", type=comma_list, default=None,
                   help=f"comma-separated OOD sets (default with --root: {','.join(EASY_SETS)}; without: those of "
                   "--list/--folder)")
    p.add_argument("--group", default=None, help="group written on every row (default easy)")
    p.add_argument("--list", action="append", default=None, metavar="SET=FILE",
                   help="an image list for SET (repeatable)")
    p.add_argument("--folder", action="append", default=None, metavar="SET=DIR",
                   help="take SET from a plain image folder (repeatable)")
    p.add_argument("--image-root", type=Path, default=None,
                   help="images of --list files live here (default: under --root)")
    p.add_argument("--skip-missing", action="store_true", default=None,
                   help="leave out listed images that do not exist (counted in the summary)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    parsed = p.parse_args(argv)
    args = load_config(ImportOpenOODConfig, parsed, FLAGS)
    root, out = None if args.root is None else Path(args.root), Path(args.out)
    image_root = None if args.image_root is None else Path(args.image_root)
    if args.benchmark is not None and not (args.sets or args.lists or args.folders):
        if root is None:
            p.error("--benchmark: give --root, OpenOOD's data folder")
        _print_benchmark(import_benchmark(root, out, args.benchmark, skip_missing=args.skip_missing,
                                          dry_run=parsed.dry_run), parsed.dry_run)
        return 0
    if parsed.dry_run:
        p.error("--dry-run: only with --benchmark imported whole (no --sets / --list / --folder)")
    results = import_openood(root, out, benchmark=args.benchmark or "imagenet", sets=args.sets,
                             group=args.group, lists=pairs(args.lists, "--list"),
                             folders=pairs(args.folders, "--folder"),
                             image_root=image_root, skip_missing=args.skip_missing)
    for result in results:
        row = result.summary()
        note = f", {row['missing']} missing left out" if row["missing"] else ""
        note += f", {row['unreadable']} unreadable left out (failures.json)" if row["unreadable"] else ""
        note += f"; {result.skipped.line()}" if result.skipped.line() else ""
        print(f"{row['ood_set']}: {row['images']} images -> {row['folder']} (images in {row['image_root']}{note})")
    return 0


def _print_benchmark(result: ImportResult, dry_run: bool) -> None:
    """Images per ID split and OOD set, what was left out, and where the manifest is (or would be)."""
    found = counts(result.manifest.rows)
    where = f"(dry run: lists checked, no image decoded, nothing written to {result.folder})" if dry_run \
        else f"-> {result.folder}"
    print(f"{result.ood_set}: ID " + ", ".join(f"{k} {v}" for k, v in found["id"].items()) + "; OOD "
          + ", ".join(f"{k} {v}" for k, v in found["ood"].items()) + f" {where}")
    if result.missing:
        print(f"{len(result.missing)} listed images missing, left out (e.g. {result.missing[:3]})")
    if result.failures:
        print(f"{len(result.failures)} images that do not decode, left out ({result.folder / 'failures.json'})")
