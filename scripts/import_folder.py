#!/usr/bin/env python
"""Your images -> manifests (images stay where they are): `python scripts/import_folder.py ROOT --out DIR`.

    python scripts/import_folder.py photos --out data/own                  # photos/{train,val,test}/<class>/: splits kept
    python scripts/import_folder.py photos --out data/own --split 4:1:5    # photos/<class>/: seeded stratified split
    python scripts/import_folder.py bronzes --out data/bronze --table rows.csv --label fine_era \\
        --levels category,coarse_era,fine_era --split 4:1:5 --stratify period,category
    python scripts/import_folder.py photos_new --out data/own_ood --ood --group near   # one OOD set per subfolder

Labels index the sorted class names (folder names, or the label column / level); `DIR/class_names.json` holds them
and every row its `class_name`. `--levels` names label levels (nested folders above the images, or table columns)
for multi-granularity heads; the label is the last level unless `--label` names another. Splits: per stratum
(default: the label), largest-remainder counts of the ratio (e.g. 7 images at 4:1:5 -> 3 / 1 / 3), shuffled with
`--seed`; a stratum with fewer images than non-zero splits is an error. A table's own `split` column is kept when
every row has train, val or test. The same image (bytes) in two splits is an error. Unreadable images are left out and listed in
`DIR/failures.json`.
"""
from __future__ import annotations

import sys
from pathlib import Path

from pipelines.cli import comma_list, parser, run_main
from pipelines.importers import ClassImport, import_classes, import_ood_folders


def main(argv: list[str] | None = None) -> int:
    p = parser(__doc__, out=True)
    p.add_argument("root", type=Path, help="image folder (for --table: the folder its file_name paths are relative to)")
    p.add_argument("--table", type=Path, default=None, help="CSV or Parquet table: file_name, a label column, metadata")
    p.add_argument("--label", default=None, help="the label column / level (default: `label` for tables, the last level)")
    p.add_argument("--levels", type=comma_list, default=None, help="comma-separated label levels (columns or nested folders)")
    p.add_argument("--split", default="4:1:5", help="TRAIN:VAL:TEST ratio for sources without splits (default 4:1:5)")
    p.add_argument("--stratify", type=comma_list, default=None, help="comma-separated fields whose combinations are strata")
    p.add_argument("--seed", type=int, default=0, help="seed of the split (default 0)")
    p.add_argument("--ood", action="store_true", help="ROOT's subfolders are OOD sets (one set each, named after it)")
    p.add_argument("--group", default=None, help="group of the OOD rows (hard|easy|near|far)")
    args = p.parse_args(argv)
    if args.out is None:
        p.error("--out is required")
    if args.ood:
        result = import_ood_folders(args.root, args.out, group=args.group)
        sets = sorted({r["ood_set"] for r in result.manifest.rows})
        print(f"{len(result.manifest)} OOD images in {len(sets)} set(s) {sets} -> {args.out}")
    else:
        options = ClassImport(levels=args.levels, label=args.label, split=args.split, stratify=args.stratify,
                              seed=args.seed, table=args.table)
        result = import_classes(args.root, args.out, options)
        counts = {s: sum(r["split"] == s for r in result.manifest.rows) for s in ("train", "val", "test")}
        classes = len({r["label"] for r in result.manifest.rows})
        print(f"{len(result.manifest)} ID images, {classes} classes, {counts} -> {args.out}")
    if result.missing:
        print(f"{len(result.missing)} unreadable image(s) left out: {Path(args.out) / 'failures.json'}")
    return 0


if __name__ == "__main__":
    sys.exit(run_main(main, doc="README.md, section 'Your own data'"))
