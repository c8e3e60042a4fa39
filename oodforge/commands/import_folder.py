"""Your images -> manifests (images stay where they are): `oodforge import-folder ROOT --out DIR`.

    oodforge import-folder photos --out data/own                  # photos/{train,val,test}/<class>/: splits kept
    oodforge import-folder photos --out data/own --split-ratio 4:1:5    # photos/<class>/: seeded stratified split
    oodforge import-folder bronzes --out data/bronze --table rows.csv --label fine_era \\
        --levels category,coarse_era,fine_era --split-ratio 4:1:5 --stratify period,category
    oodforge import-folder photos_new --out data/own_ood --ood-folders --group near   # one OOD set per subfolder
    oodforge import-folder field_photos --field --model runs/own/classifier --name bci --out data/field_bci

Labels index the sorted class names (folder names, or the label column / level); `DIR/class_names.json` holds them
and every row its `class_name`. `--levels` names label levels (nested folders above the images, or table columns)
for multi-granularity heads; the label is the last level unless `--label` names another. Splits: per stratum
(default: the label), largest-remainder counts of the ratio (e.g. 7 images at 4:1:5 -> 3 / 1 / 3), shuffled with
`--seed`; a stratum with fewer images than non-zero splits is an error. A table's own `split` column is kept when
every row has train, val or test (one other value is an error naming the table line). The same image (bytes) in two
splits is an error. Unreadable images (also 0-byte or text files named .jpg) are left out and listed in
`DIR/failures.json`; hidden (dot-named) files and folders, symlinks (never followed: dangling, leading out of ROOT, or
to what ROOT already holds), folders reached twice and FIFOs, sockets or devices are left out and counted in
`DIR/import_summary.json`. A folder or image name with a control character (a newline, ...) is refused: rename it.
A table's file_name must lie under ROOT once its symlinks are resolved. One import writes DIR at a time.

`--field`: ROOT/<species>/ folders make a field set (`field:` in eval configs): the folders of species the classifier
`--model` knows (its class_names.json or config.json id2label; underscores may stand for spaces) are the set's ID rows,
labelled by the classifier's index, every other folder its novel rows (ood_set `--name`, default field), all with
`species`. `--known a,b` names the known folders instead; one the classifier does not know is an error.
"""
from __future__ import annotations

from pathlib import Path
from typing import Literal

from oodforge.args import command_parser, load_config, parse
from pipelines.cli import comma_list
from pipelines.importers import ClassImport, import_classes, import_field, import_ood_folders
from pipelines.params import REQUIRED, Config, config, param

DOC = "README.md, section 'Your own data'"
"""Where the command's inputs are documented (named in its one-line errors)."""


@config
class ImportFolderConfig(Config):
    """What `oodforge import-folder` imports; every key has its flag or argument (`FLAGS`)."""

    DOC = DOC

    root: str = param(REQUIRED, "image folder (for `table`: the folder its file_name paths are relative to)")
    out: str = param(REQUIRED, "output manifest folder")
    table: str | None = param(None, "CSV or Parquet table: file_name, a label column, metadata")
    label: str | None = param(None, "the label column / level; null: `label` for tables, the last level")
    levels: list[str] | None = param(None, "label levels (columns or nested folders)")
    split_ratio: str = param(ClassImport.split, "TRAIN:VAL:TEST ratio for sources without splits")
    stratify: list[str] | None = param(None, "fields whose combinations are strata")
    seed: int = param(0, "seed of the split")
    ood_folders: bool = param(False, "ROOT's subfolders are OOD sets (one set each, named after it)")
    group: str | None = param(None, "group of the OOD rows (hard, easy, near, far)")
    field: bool = param(False, "ROOT's species folders are a field set (known + novel species)")
    model: str | None = param(None, "field: the classifier folder whose class names are the known species")
    known: list[str] | None = param(None, "field: the known-species folders; null: those the classifier knows")
    name: str = param("field", "field: the field set's name, ood_set of its novel rows")
    store: Literal["folder", "shards"] = param("folder", "folder: rows point at the images; shards: packed into "
                                                         "OUT/shards/")


FLAGS = {"ROOT": "root",
         **{"--" + name.replace("_", "-"): name for name in ImportFolderConfig.fields() if name != "root"}}
"""The command's flags (and its argument ROOT) as shorthands of its config's keys (docs/cli.md)."""


def build_parser():
    p = command_parser(__name__, __doc__, out=True)
    p.add_argument("root", type=Path, nargs="?",
                   help="image folder (for --table: the folder its file_name paths are relative to)")
    p.add_argument("--table", type=Path, default=None, help="CSV or Parquet table: file_name, a label column, metadata")
    p.add_argument("--label", default=None,
                   help="the label column / level (default: `label` for tables, the last level)")
    p.add_argument("--levels", type=comma_list, default=None,
                   help="comma-separated label levels (columns or nested folders)")
    p.add_argument("--split-ratio", default=None,
                   help=f"TRAIN:VAL:TEST ratio for sources without splits (default {ClassImport.split})")
    p.add_argument("--stratify", type=comma_list, default=None,
                   help="comma-separated fields whose combinations are strata")
    p.add_argument("--seed", type=int, default=None, help="seed of the split (default 0)")
    p.add_argument("--ood-folders", action="store_true", default=None,
                   help="ROOT's subfolders are OOD sets (one set each, named after it)")
    p.add_argument("--group", default=None, help="group of the OOD rows (hard|easy|near|far)")
    p.add_argument("--field", action="store_true", default=None,
                   help="ROOT's species folders are a field set (known + novel species)")
    p.add_argument("--model", type=Path, default=None,
                   help="--field: the classifier folder whose class names are the known species")
    p.add_argument("--known", type=comma_list, default=None,
                   help="--field: comma-separated known-species folders (default: those the classifier knows)")
    p.add_argument("--name", default=None,
                   help="--field: the field set's name, ood_set of its novel rows (default field)")
    p.add_argument("--store", choices=("folder", "shards"), default=None,
                   help="folder: rows point at the images where they are (default); shards: the images are packed "
                        "into DIR/shards/ (bytes unchanged; docs/shards.md)")
    return p


def main(argv: list[str] | None = None) -> int:
    p = build_parser()
    args = load_config(ImportFolderConfig, parse(p, argv, intermixed=True), FLAGS)
    root, out = Path(args.root), Path(args.out)
    model = None if args.model is None else Path(args.model)
    if args.field and args.ood_folders:
        p.error("--field and --ood-folders exclude each other")
    if args.field and model is None:
        p.error("--field needs --model (the classifier folder)")
    if args.field:
        result = (import_field(root, out, model=model, known=args.known, ood_set=args.name,
                               group=args.group))
        known = sorted({r["species"] for r in result.manifest.rows if r["role"] == "id"})
        novel = sorted({r["species"] for r in result.manifest.rows if r["role"] == "ood"})
        ids = sum(r["role"] == "id" for r in result.manifest.rows)
        print(f"field set {args.name}: {ids} images of {len(known)} known species, {len(result.manifest) - ids} of "
              f"{len(novel)} novel species -> {out}")
    elif args.ood_folders:
        result = import_ood_folders(root, out, group=args.group)
        sets = sorted({r["ood_set"] for r in result.manifest.rows})
        print(f"{len(result.manifest)} OOD images in {len(sets)} set(s) {sets} -> {out}")
    else:
        options = ClassImport(levels=args.levels, label=args.label, split=args.split_ratio, stratify=args.stratify,
                              seed=args.seed, table=args.table)
        result = import_classes(root, out, options)
        counts = {s: sum(r["split"] == s for r in result.manifest.rows) for s in ("train", "val", "test")}
        classes = len({r["label"] for r in result.manifest.rows})
        print(f"{len(result.manifest)} ID images, {classes} classes, {counts} -> {out}")
    if args.store == "shards":
        from pipelines.shards import pack_manifest, pack_workers

        packed = pack_manifest(out, out, workers=pack_workers())[1]
        print(f"packed into {len(packed.written) + len(packed.kept)} shard(s) in {packed.store}")
    if result.failures:
        print(f"{len(result.failures)} unreadable image(s) left out: {out / 'failures.json'}")
    if result.skipped.line():
        print(f"{result.skipped.line()}: {out / 'import_summary.json'}")
    return 0
