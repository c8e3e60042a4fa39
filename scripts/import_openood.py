"""Manifests for OOD sets from OpenOOD's data folder or plain image folders (images stay where they are).

    python scripts/import_openood.py --root /data/openood --out data/easy
    python scripts/import_openood.py --root /data/openood --out data/easy --folder imagenet_o=/data/imagenet-o
    python scripts/import_openood.py --out data/easy --sets texture --list texture=lists/dtd.txt --image-root /data/dtd

Default: ShiftedBronzes' five easy sets (species, imagenet_o, inaturalist, texture, openimage_o) from
`<root>/benchmark_imglist/<benchmark>/test_<set>.txt`, one manifest folder per set under `--out`
(`<out>/<set>/metadata.jsonl` + `manifest_info.json` naming the image folder), and `<out>/import_summary.json`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from pipelines.importers import EASY_SETS, import_openood


def pairs(values: list[str], flag: str) -> dict[str, str]:
    out = {}
    for value in values:
        name, sep, path = value.partition("=")
        if not sep or not name or not path:
            raise SystemExit(f"{flag} takes SET=PATH, got {value!r}")
        out[name] = path
    return out


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--root", type=Path, default=None, help="OpenOOD's data folder (holds benchmark_imglist/, images_largescale/, images_classic/)")
    parser.add_argument("--out", type=Path, required=True, help="output folder: one manifest folder per set")
    parser.add_argument("--benchmark", default="imagenet", help="benchmark_imglist subfolder (default imagenet)")
    parser.add_argument("--sets", type=lambda s: [x.strip() for x in s.split(",") if x.strip()], default=list(EASY_SETS),
                        help=f"comma-separated OOD sets (default: {','.join(EASY_SETS)})")
    parser.add_argument("--group", default="easy", help="group written on every row (default easy)")
    parser.add_argument("--list", action="append", default=[], metavar="SET=FILE", help="an image list for SET (repeatable)")
    parser.add_argument("--folder", action="append", default=[], metavar="SET=DIR", help="take SET from a plain image folder (repeatable)")
    parser.add_argument("--image-root", type=Path, default=None, help="images of --list files live here (default: under --root)")
    parser.add_argument("--skip-missing", action="store_true", help="leave out listed images that do not exist (counted in the summary)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    results = import_openood(args.root, args.out, benchmark=args.benchmark, sets=args.sets, group=args.group,
                             lists=pairs(args.list, "--list"), folders=pairs(args.folder, "--folder"),
                             image_root=args.image_root, skip_missing=args.skip_missing)
    summary = [r.summary() for r in results]
    for row in summary:
        note = f", {row['missing']} missing left out" if row["missing"] else ""
        print(f"{row['ood_set']}: {row['images']} images -> {row['folder']} (images in {row['image_root']}{note})")


if __name__ == "__main__":
    main()
