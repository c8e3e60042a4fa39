"""OpenOOD v1.5's four benchmarks (`cifar10`, `cifar100`, `imagenet200`, `imagenet`) as one manifest each.

The facts are those of OpenOOD's evaluation API (Jingkang50/OpenOOD 3c35632): the image lists and image folders per
split (`openood/evaluation_api/datasets.py:17-307`, `DATA_INFO`) and the test preprocessing per benchmark
(`openood/evaluation_api/preprocessor.py:8-39` and `:50-59`: Resize(pre_size, bilinear) + CenterCrop(img_size) +
Normalize). Every list is `<path> <label>` per line (`openood/datasets/imglist_dataset.py:59-61`, split at the first
space), its path relative to the list's image folder (`images_classic/` or `images_largescale/` under the data root).

`import_benchmark(root, out, "cifar10")` writes `<out>/cifar10/metadata.jsonl` (metadata only; `manifest_info.json`
names the data root, each `file_name` starts with its image folder): ID rows of `train` / `val` / `test` with their
labels (role id), the near-OOD and far-OOD test sets (role ood, split test, group near / far, `ood_set` OpenOOD's set
name) and the OOD validation set (`val_tin` / `val_openimage_o`: role ood, split val, `ood_set` `ood_val`), so that
`configs/openood_<benchmark>.yaml` evaluates it as OpenOOD's `Evaluator` does. Every row keeps `source_list` (the list
file) and, for OOD rows, `source_label` (the list's label text).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pipelines.data import Manifest, make_row
from pipelines.importers import (
    LIST_FOLDER,
    ImportListError,
    ImportResult,
    _check_inside,
    _keep_existing,
    _probe,
    read_imglist,
    write_external_manifest,
)
from pipelines.io import atomic_write_json
from pipelines.locks import folder_lock

CLASSIC, LARGESCALE = "images_classic", "images_largescale"
OOD_VAL = "ood_val"
"""The `ood_set` of the OOD validation rows (OpenOOD's `ood.val` list)."""


@dataclass(frozen=True)
class Preprocessing:
    """OpenOOD v1.5's test preprocessing of a benchmark: Resize(pre_size, bilinear) + CenterCrop(image_size) +
    Normalize(mean, std)."""

    pre_size: int
    image_size: int
    mean: tuple[float, float, float]
    std: tuple[float, float, float]


@dataclass(frozen=True)
class Benchmark:
    """One OpenOOD v1.5 benchmark: its list folder, class count, ID lists, OOD validation list, near- and far-OOD sets
    (set name -> (list file, image folder)) and test preprocessing."""

    name: str
    num_classes: int
    folder: str
    id_lists: dict[str, str]
    id_data: str
    ood_val: tuple[str, str]
    near: dict[str, tuple[str, str]]
    far: dict[str, tuple[str, str]]
    preprocessing: Preprocessing


_IMAGENET = Preprocessing(256, 224, (0.485, 0.456, 0.406), (0.229, 0.224, 0.225))


def _cifar(name: str, other: str, mean: tuple[float, float, float], std: tuple[float, float, float]) -> Benchmark:
    near = {s: (f"test_{s}.txt", CLASSIC) for s in (other, "tin")}
    far = {s: (f"test_{s}.txt", CLASSIC) for s in ("mnist", "svhn", "texture", "places365")}
    lists = {split: f"{split}_{name}.txt" for split in ("train", "val", "test")}
    return Benchmark(name, 10 if name == "cifar10" else 100, name, lists, CLASSIC, ("val_tin.txt", CLASSIC), near, far,
                     Preprocessing(32, 32, mean, std))


def _imagenet(name: str, num_classes: int) -> Benchmark:
    near = {s: (f"test_{s}.txt", LARGESCALE) for s in ("ssb_hard", "ninco")}
    far = {"inaturalist": ("test_inaturalist.txt", LARGESCALE), "textures": ("test_textures.txt", CLASSIC),
           "openimage_o": ("test_openimage_o.txt", LARGESCALE)}
    lists = {split: f"{split}_{name}.txt" for split in ("train", "val", "test")}
    return Benchmark(name, num_classes, name, lists, LARGESCALE, ("val_openimage_o.txt", LARGESCALE), near, far,
                     _IMAGENET)


BENCHMARKS: dict[str, Benchmark] = {
    "cifar10": _cifar("cifar10", "cifar100", (0.4914, 0.4822, 0.4465), (0.2470, 0.2435, 0.2616)),
    "cifar100": _cifar("cifar100", "cifar10", (0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761)),
    "imagenet200": _imagenet("imagenet200", 200),
    "imagenet": _imagenet("imagenet", 1000),
}
"""OpenOOD v1.5's benchmarks by the name its evaluation API takes (`id_name`)."""


def benchmark(name: str) -> Benchmark:
    """The benchmark `name`; an unknown name is one error line listing the known ones."""
    if name not in BENCHMARKS:
        raise ImportListError(f"unknown OpenOOD benchmark {name!r}; one of {sorted(BENCHMARKS)}")
    return BENCHMARKS[name]


def benchmark_of_classes(num_classes: int) -> Benchmark | None:
    """The benchmark with `num_classes` ID classes (each of the four has its own count), None for any other count."""
    return next((b for b in BENCHMARKS.values() if b.num_classes == num_classes), None)


def _id_label(text: str, list_path: Path, name: str, num_classes: int) -> int:
    try:
        label = int(text)
    except ValueError:
        label = -1
    if not 0 <= label < num_classes:
        raise ImportListError(f"{list_path}: image {name!r} has label {text!r}, not a class index in "
                              f"[0, {num_classes})")
    return label


def _rows(root: Path, bench: Benchmark, skip_missing: bool) -> tuple[list[dict[str, Any]], list[str]]:
    """Every row of the benchmark in list order (ID train, val, test; near sets; far sets; OOD val) and the images
    that are missing (left out with `skip_missing`, else an error)."""
    lists: list[tuple[Path, str, dict[str, Any]]] = []
    for split, file in bench.id_lists.items():
        lists.append((Path(file), bench.id_data, {"split": split, "role": "id"}))
    for group, sets in (("near", bench.near), ("far", bench.far)):
        for name, (file, data) in sets.items():
            lists.append((Path(file), data, {"split": "test", "role": "ood", "ood_set": name, "group": group}))
    lists.append((Path(bench.ood_val[0]), bench.ood_val[1], {"split": "val", "role": "ood", "ood_set": OOD_VAL}))
    rows, missing, seen = [], [], {}
    for file, data, fields in lists:
        list_path = root / LIST_FOLDER / bench.folder / file
        entries = read_imglist(list_path)
        _check_inside(root / data, [n for n, _ in entries], lambda name, list_path=list_path: list_path)
        names, gone = _keep_existing(root / data, [n for n, _ in entries], str(list_path), skip_missing)
        missing += [f"{data}/{n}" for n in gone]
        kept = set(names)
        for name, rest in entries:
            if name not in kept:
                continue
            file_name = f"{data}/{name}"
            if seen.get(file_name) == list_path.name:  # listed twice in one list: once, as `import_imglist` does
                continue
            if file_name in seen:
                raise ImportListError(f"{list_path}: image {name!r} is listed again (first in {seen[file_name]}); "
                                      "an image belongs to one split and set")
            seen[file_name] = list_path.name
            if fields["role"] == "id":
                row = make_row(file_name, label=_id_label(rest, list_path, name, bench.num_classes), **fields)
            else:
                row = make_row(file_name, source_label=rest, **fields)
            rows.append({**row, "source_list": list_path.name})
    return rows, missing


def import_benchmark(openood_root: str | os.PathLike, out: str | os.PathLike, name: str, *,
                     skip_missing: bool = False, dry_run: bool = False) -> ImportResult:
    """OpenOOD v1.5's benchmark `name` from its data folder -> the manifest `<out>/<name>/` (module docstring), with
    `failures.json` (images that do not decode, left out) and `<out>/import_summary.json`. `dry_run`: every check of
    the lists (labels, paths, missing images, images listed twice), no image decoded, nothing written."""
    bench = benchmark(name)
    root = Path(openood_root)
    if not (root / LIST_FOLDER / bench.folder).is_dir():
        raise ImportListError(f"{root / LIST_FOLDER / bench.folder}: no such folder; is {root} OpenOOD's data folder "
                              "(benchmark_imglist/, images_classic/, images_largescale/)?")
    target = Path(out) / bench.name
    if dry_run:
        rows, missing = _rows(root, bench, skip_missing)
        return ImportResult(bench.name, target, Manifest(root, rows), str(root / LIST_FOLDER / bench.folder), missing)
    with folder_lock(target, "import_openood"):
        rows, missing = _rows(root, bench, skip_missing)
        rows, failures = _probe(root, rows)
        if not any(r["role"] == "id" and r["split"] == "test" for r in rows):
            raise ImportListError(f"{name}: no ID test image left to import ({len(missing)} missing, "
                                  f"{len(failures)} that do not decode)")
        result = ImportResult(bench.name, target, write_external_manifest(target, rows, root),
                              str(root / LIST_FOLDER / bench.folder), missing, failures=failures)
        atomic_write_json(target / "failures.json", failures)
        atomic_write_json(Path(out) / "import_summary.json", [{**result.summary(), **counts(rows)}])
    return result


def counts(rows: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """Images per ID split and per OOD set (`near:cifar100`, ..., `ood_val`)."""
    id_rows: dict[str, int] = {}
    ood_rows: dict[str, int] = {}
    for row in rows:
        if row["role"] == "id":
            id_rows[row["split"]] = id_rows.get(row["split"], 0) + 1
        else:
            key = f"{row['group']}:{row['ood_set']}" if row["group"] else row["ood_set"]
            ood_rows[key] = ood_rows.get(key, 0) + 1
    return {"id": id_rows, "ood": ood_rows}
