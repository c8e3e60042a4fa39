"""Manifests from the data people have: class folders or tables (ID, with stratified splits and label levels), folders
of OOD sets, OpenOOD v1.5 benchmark image lists and plain folders.

`import_classes(root, out, ClassImport(...))` turns `ROOT/{train,val,test}/<class>/` (splits kept), a flat
`ROOT/<class>/` or a table (`file_name`, a label column, any metadata) into one ID manifest; splits are made by
`pipelines.splits.stratified_split` (largest-remainder counts per stratum). `import_ood_folders` makes one OOD set
per subfolder.

Each imported set becomes its own metadata-only manifest folder (`<out>/<ood_set>/metadata.jsonl` plus
`manifest_info.json` with the absolute `image_root`), so nothing is copied and the runner reads it like any manifest.

The folders and tables come from strangers: folders are walked by `pipelines.walk` (no symlink followed, FIFOs and
devices never opened, a name with a control character refused), every path read from a table or image list must
resolve under its image folder (else one error line naming the row), and every image is decoded once: one that does
not decode is left out and recorded in `<out>/failures.json`. Each output folder is held by one importer at a time
(`pipelines.locks.folder_lock`).

OpenOOD's data folder (what its download script builds) holds `benchmark_imglist/<benchmark>/test_<set>.txt` with one
`<path> <label>` line per image (the path relative to `images_largescale/` or `images_classic/`, split at the first
space, as OpenOOD's ImglistDataset does). `EASY_SETS` maps ShiftedBronzes' five easy OOD sets to the list names
OpenOOD uses for them.
"""
from __future__ import annotations

import math
import os
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.class_names import ClassNames, model_class_names, write_class_names
from pipelines.data import (
    IMAGE_SUFFIXES,
    MANIFEST_INFO,
    SPLITS,
    ImageLoadError,
    Manifest,
    load_image,
    make_row,
    write_manifest,
)
from pipelines.errors import UserInputError
from pipelines.fingerprint import file_identity
from pipelines.io import NotRegularFile, atomic_write_json, check_regular, safe_name
from pipelines.locks import folder_lock
from pipelines.schema import COORDINATES, inside_folder
from pipelines.splits import parse_ratio, stratified_split
from pipelines.walk import Skipped, check_name, resolve_inside, subfolders, unsafe_character, walk_files

# set name -> image-list file names to look for (first found wins), in OpenOOD's spellings
EASY_SETS: dict[str, tuple[str, ...]] = {
    "species": ("test_species.txt", "test_species_sub.txt"),
    "imagenet_o": ("test_imagenet_o.txt", "test_imageneto.txt", "test_imagenet-o.txt"),
    "inaturalist": ("test_inaturalist.txt",),
    "texture": ("test_texture.txt", "test_textures.txt"),
    "openimage_o": ("test_openimage_o.txt", "test_openimageo.txt"),
}
DATA_DIRS = ("images_largescale", "images_classic")  # where OpenOOD's list paths are rooted
LIST_FOLDER = "benchmark_imglist"


class ImportListError(UserInputError):
    """A list or folder that cannot be imported; names the file (and line)."""


@dataclass
class ImportResult:
    """One imported set: its manifest folder and manifest (root = the image folder), its source, listed images not
    found (`missing`), images that do not decode (`failures`: file, reason) and what the folder walk skipped."""

    ood_set: str
    folder: Path
    manifest: Manifest
    source: str
    missing: list[str] = field(default_factory=list)
    skipped: Skipped = field(default_factory=Skipped)
    failures: list[dict[str, str]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {"ood_set": self.ood_set, "images": len(self.manifest), "folder": str(self.folder),
                "image_root": str(self.manifest.root), "source": self.source, "missing": len(self.missing),
                "missing_examples": self.missing[:5], "unreadable": len(self.failures),
                "unreadable_examples": [f["file"] for f in self.failures[:5]], **self.skipped.summary()}


def scan_images(folder: str | os.PathLike, relative_to: str | os.PathLike | None = None) -> tuple[list[Path], Skipped]:
    """Image files below `folder` (recursively, sorted) and what was left out (`pipelines.walk.walk_files`: hidden
    entries, symlinks, loops, FIFOs, sockets and devices), each named relative to `relative_to` (default `folder`)."""
    return walk_files(folder, IMAGE_SUFFIXES, relative_to)


def read_imglist(path: str | os.PathLike) -> list[tuple[str, str]]:
    """(image path, rest of the line) per non-empty line of an OpenOOD image list; bad lines raise naming the line."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"image list not found: {path}")
    entries = []
    with open(path, encoding="utf-8") as fh:
        for number, line in enumerate(fh, start=1):
            line = line.strip("\r\n")
            if not line.strip():
                continue
            name, _, rest = line.strip().partition(" ")
            if Path(name).is_absolute() or ".." in Path(name).parts:
                raise ImportListError(f"{path}, line {number}: image path must be relative, got {name!r}")
            if unsafe_character(name) is not None:
                raise ImportListError(f"{path}, line {number}: image path {name!r} holds a control character")
            entries.append((name, rest.strip()))
    if not entries:
        raise ImportListError(f"{path}: the image list is empty")
    return entries


def find_imglist(root: str | os.PathLike, benchmark: str, ood_set: str) -> Path:
    """`<root>/benchmark_imglist/<benchmark>/<one of the set's list names>`; the error lists what was tried."""
    folder = Path(root) / LIST_FOLDER / benchmark
    names = EASY_SETS.get(ood_set, (f"test_{ood_set}.txt",))
    for name in names:
        if (folder / name).is_file():
            return folder / name
    raise FileNotFoundError(f"no image list for OOD set {ood_set!r}: tried {[str(folder / n) for n in names]} "
                            f"(pass one explicitly with --list {ood_set}=FILE, or a plain folder with --folder)")


def _data_dir(root: Path, entries: list[tuple[str, str]], list_path: Path) -> Path:
    """The OpenOOD image folder under `root` holding the list's images (judged on its first entries)."""
    probe = [name for name, _ in entries[:20]]
    for sub in DATA_DIRS:
        if any((root / sub / name).is_file() for name in probe):
            return root / sub
    raise ImportListError(f"{list_path}: none of its first images exists under {[str(root / d) for d in DATA_DIRS]} "
                       f"(e.g. {probe[0]!r}); is {root} OpenOOD's data folder?")


def write_external_manifest(folder: str | os.PathLike, rows: Iterable[dict[str, Any]],
                            image_root: str | os.PathLike) -> Manifest:
    """A metadata-only manifest: `folder/metadata.jsonl` (validated) + `manifest_info.json` naming `image_root`."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    root = Path(image_root).resolve()
    manifest = write_manifest(folder, rows)
    atomic_write_json(folder / MANIFEST_INFO, {"image_root": str(root)})
    return Manifest(root, manifest.rows)


def _check_inside(root: Path, names: Iterable[str], where: Any) -> None:
    """Every name, resolved with its symlinks, must lie under `root`: else one error line (`where(name)` says where
    the name was read)."""
    for name in names:
        if resolve_inside(root, name) is None:
            raise ImportListError(f"{where(name)}: image path {name!r} leads outside the image folder {root} (through "
                                  "a "
                                  "symlink); refused")


def _keep_existing(root: Path, names: list[str], where: str, skip_missing: bool) -> tuple[list[str], list[str]]:
    missing = [n for n in names if not (root / n).exists()]
    if missing and not skip_missing:
        raise ImportListError(f"{where}: {len(missing)} of {len(names)} images not found under {root} (e.g. "
                           f"{missing[:3]}); pass skip_missing / --skip-missing to import the rest")
    gone = set(missing)
    return [n for n in names if n not in gone], missing


def import_imglist(list_path: str | os.PathLike, out: str | os.PathLike, *, ood_set: str,
                   image_root: str | os.PathLike | None = None,
                   openood_root: str | os.PathLike | None = None, group: str | None = "easy", split: str = "test",
                   skip_missing: bool = False) -> ImportResult:
    """One OpenOOD image list -> the manifest folder `out` (OOD rows, label -1).

    Images are looked up under `image_root`, else under `openood_root`'s `images_largescale/` or `images_classic/`
    (whichever holds the list's images). Rows keep the list's own label text as `source_label`.
    """
    list_path = Path(list_path)
    entries = read_imglist(list_path)
    if image_root is None:
        if openood_root is None:
            raise ValueError("import_imglist needs image_root or openood_root")
        root = _data_dir(Path(openood_root), entries, list_path)
    else:
        root = Path(image_root)
    labels = dict(entries)
    unique = list(dict.fromkeys(n for n, _ in entries))
    _check_inside(root, unique, lambda name: list_path)
    with folder_lock(out, "import_openood"):
        names, missing = _keep_existing(root, unique, str(list_path), skip_missing)
        rows = [make_row(n, split=split, role="ood", ood_set=ood_set, group=group, source_list=list_path.name,
                         source_label=labels[n]) for n in names]
        rows, failures = _probe(root, rows)
        if not rows:
            raise ImportListError(f"{list_path}: no image left to import ({len(missing)} missing, {len(failures)} "
                                  "that do not decode)")
        result = ImportResult(ood_set, Path(out), write_external_manifest(out, rows, root), str(list_path), missing,
                              failures=failures)
        atomic_write_json(result.folder / "failures.json", failures)
    return result


def import_folder(folder: str | os.PathLike, out: str | os.PathLike, *, ood_set: str | None, group: str | None = "easy",
                  split: str = "test", role: str = "ood", label: int = -1,
                  category_from_subfolder: bool = False) -> ImportResult:
    """A plain image folder (searched recursively) -> the manifest folder `out`, images left in place.

    `role="id"` takes a class `label` and no `ood_set`; `category_from_subfolder` stores a first-level subfolder name
    as `category`.
    """
    folder = Path(folder)
    images, skipped = scan_images(folder)
    if not images:
        raise ImportListError(f"image folder {folder} holds no images")
    names = [p.relative_to(folder).as_posix() for p in images]
    name = ood_set or folder.name
    rows = []
    for file_name in names:
        parts = Path(file_name).parts
        extra = {"category": parts[0]} if category_from_subfolder and len(parts) > 1 else {}
        rows.append(make_row(file_name, split=split, role=role, label=label, ood_set=name if role == "ood" else None,
                             group=group, **extra))
    with folder_lock(out, "import_folder"):
        rows, failures = _probe(folder, rows)
        if not rows:
            raise ImportListError(f"image folder {folder}: none of its {len(failures)} images decodes (e.g. "
                                  f"{failures[0]['file']}: {failures[0]['reason']})")
        result = ImportResult(name, Path(out), write_external_manifest(out, rows, folder), str(folder), skipped=skipped,
                              failures=failures)
        atomic_write_json(result.folder / "failures.json", failures)
    return result


def import_openood(openood_root: str | os.PathLike | None, out: str | os.PathLike, *, benchmark: str = "imagenet",
                   sets: Iterable[str] | None = None, group: str | None = "easy", split: str = "test",
                   lists: dict[str, str | os.PathLike] | None = None,
                   folders: dict[str, str | os.PathLike] | None = None,
                   image_root: str | os.PathLike | None = None, skip_missing: bool = False) -> list[ImportResult]:
    """The given OOD sets from OpenOOD's data folder -> `<out>/<set>/`; `sets=None` means ShiftedBronzes' five easy
    sets when `openood_root` is given, else only the sets named in `lists` / `folders`.

    `lists` names an image list per set (instead of looking under `benchmark_imglist/<benchmark>/`), its paths
    relative to `image_root` when given, else to OpenOOD's image folders; `folders` takes a set from a plain image
    folder instead. Writes `<out>/import_summary.json`.
    """
    lists, folders = dict(lists or {}), dict(folders or {})
    if sets is None:
        sets = list(EASY_SETS) if openood_root is not None else []
    sets = list(dict.fromkeys([*sets, *lists, *folders]))
    if not sets:
        raise ImportListError("nothing to import: give --root (OpenOOD's data folder), --list SET=FILE or --folder "
                              "SET=DIR")
    results = []
    with folder_lock(out, "import_openood"):
        for name in sets:
            target = Path(out) / safe_name(name)  # a name from the command line never leaves `out`
            if name in folders:
                results.append(import_folder(folders[name], target, ood_set=name, group=group, split=split))
                continue
            if openood_root is None and name not in lists:
                raise ImportListError(f"OOD set {name!r}: no OpenOOD root (--root), list (--list) or folder (--folder) "
                                      "given")
            list_path = Path(lists[name]) if name in lists else find_imglist(openood_root, benchmark, name)
            root = image_root if name in lists else None
            results.append(import_imglist(list_path, target, ood_set=name, image_root=root, openood_root=openood_root,
                                          group=group, split=split, skip_missing=skip_missing))
        atomic_write_json(Path(out) / "import_summary.json", [r.summary() for r in results])
    return results


# -- class folders and tables -> ID manifests ------------------------------------------------------------------
@dataclass
class ClassImport:
    """How `import_classes` reads its source: label levels, the label's level, the split, the stratification."""

    levels: list[str] | None = None
    label: str | None = None
    split: str = "4:1:5"
    stratify: list[str] | None = None
    seed: int = 0
    table: str | os.PathLike | None = None


def _subfolders(top: Path, root: Path, skipped: Skipped) -> list[Path]:
    """The visible real subfolders of `top`, sorted (`pipelines.walk.subfolders`: names checked, symlinks never
    followed); what was left out goes to `skipped`, named from `root`."""
    return subfolders(top, skipped, relative_to=root)


def _folder_rows(root: Path, depth: int, skipped: Skipped) -> list[dict[str, Any]]:
    """Rows of ROOT/{train,val,test}/<level 1>/.../<level depth>/ (split from the folder) or of ROOT/<levels>/ (no
    split yet); `parts` holds the level folder names. Hidden entries and dangling links go to `skipped`."""
    splits = [s for s in SPLITS if (root / s).is_dir()]
    tops = [(root / s, s) for s in splits] if splits else [(root, None)]
    rows = []
    for top, split in tops:
        for folder in _subfolders(top, root, skipped):
            images, left_out = scan_images(folder, relative_to=root)
            skipped.add(left_out)
            if not images:
                raise ImportListError(f"class folder {folder} holds no images")
            for path in images:
                rel = path.relative_to(top)
                if len(rel.parts) <= depth:
                    raise ImportListError(f"{path}: expected {depth} level folder(s) above each image "
                                          f"({split or 'no split'})")
                rows.append({"file_name": path.relative_to(root).as_posix(), "split": split,
                             "parts": rel.parts[:depth]})
    if not rows:
        raise ImportListError(f"{root}: no class folders with images (expected ROOT/<class>/ or ROOT/train/<class>/)")
    return rows


def _read_table(table: Path, used: list[str]) -> Any:
    """A CSV or Parquet table as a DataFrame of strings / values (a Parquet file's nested or binary columns made plain,
    `pipelines.curation.parquet`: `used` columns holding lists or structs refused); an unreadable or empty one is one
    error line."""
    import pandas as pd

    from pipelines.curation.parquet import read_parquet

    if not table.is_file():
        raise ImportListError(f"table not found: {table}")
    parquet = table.suffix.lower() in (".parquet", ".pq")
    try:
        frame = read_parquet(table, used) if parquet else pd.read_csv(table, dtype=str)
    except UserInputError:
        raise
    except pd.errors.EmptyDataError:
        raise ImportListError(f"{table}: the table is empty (expected a header line: file_name, a label column, "
                              "...)") from None
    except Exception as err:  # pyarrow / parser errors of a corrupt or foreign file
        kind = "Parquet" if parquet else "CSV"
        raise ImportListError(f"{table}: not a readable {kind} table ({' '.join(str(err).split())[:200]})") from None
    if frame.empty:
        raise ImportListError(f"{table}: the table has a header but no rows")
    return frame


def _table_row(table: Path, index: int) -> str:
    """Where a table row is: CSV line number (the header is line 1), or Parquet row number (from 1)."""
    return (f"{table}, line {index + 2}" if table.suffix.lower() not in (".parquet", ".pq")
            else f"{table}, row {index + 1}")


def _table_rows(table: Path, columns: list[str], root: Path) -> list[dict[str, Any]]:
    """Rows of a CSV / Parquet table with `file_name` and the named columns (every other column kept as metadata).
    A `split` column must hold train, val or test on every row; lat / lon are read as numbers; a file_name must lie
    under `root` once resolved, and the named (label) columns hold no control characters. Each fault names the table
    row."""
    frame = _read_table(table, ["file_name", *columns, "split", "lat", "lon"])
    for column in ["file_name", *columns]:
        if column not in frame.columns:
            raise ImportListError(f"{table}: no column {column!r} (columns: {list(frame.columns)})")
    frame = frame.astype(object).where(frame.notna(), None)
    rows = frame.to_dict("records")
    seen: dict[str, int] = {}
    for index, row in enumerate(rows):
        missing = [c for c in ["file_name", *columns] if row.get(c) in (None, "")]
        if missing:
            raise ImportListError(f"{_table_row(table, index)}: empty {missing[0]!r}")
        _check_file_name(table, root, index, row, seen)
        for column in columns:
            check_name(str(row[column]), f"{_table_row(table, index)}: {column} {str(row[column])!r}")
        if "split" in frame.columns and row["split"] not in SPLITS:
            raise ImportListError(f"{_table_row(table, index)}: split must be one of {', '.join(SPLITS)}, got "
                                  f"{row['split']!r} (drop the split column to split by --split)")
        row.setdefault("split", None)
        _read_coordinates(table, frame, index, row)
    return rows


def _check_file_name(table: Path, root: Path, index: int, row: dict[str, Any], seen: dict[str, int]) -> None:
    """A table row's file_name (made a string): a relative path inside `root`, of safe characters, on no earlier row
    (`seen`: file_name -> first row, updated)."""
    row["file_name"] = str(row["file_name"])
    if not inside_folder(row["file_name"]) or unsafe_character(row["file_name"]) is not None:
        raise ImportListError(f"{_table_row(table, index)}: file_name must be a relative path inside the image "
                              f"folder, got {row['file_name']!r}")
    _check_inside(root, [row["file_name"]], lambda name: _table_row(table, index))
    first = seen.setdefault(row["file_name"], index)
    if first != index:
        raise ImportListError(f"{_table_row(table, index)}: file_name {row['file_name']!r} is already on "
                              f"{_table_row(table, first).rsplit(', ', 1)[1]}")


def _read_coordinates(table: Path, frame: Any, index: int, row: dict[str, Any]) -> None:
    """A table row's lat / lon (where given) as floats; a value that is not a finite number raises."""
    for key in COORDINATES:
        if row.get(key) is not None:
            try:
                row[key] = float(row[key])
            except (TypeError, ValueError):
                row[key] = math.nan
            if not math.isfinite(row[key]):
                raise ImportListError(f"{_table_row(table, index)}: {key} must be a finite number, got "
                                      f"{frame[key].iloc[index]!r}")


def _source_rows(root: Path, options: ClassImport, skipped: Skipped) -> tuple[list[dict[str, Any]], str, list[str]]:
    """(rows with split or None and level values, the label field, the level fields) of a folder tree or a table."""
    levels = list(options.levels or [])
    if options.table is not None:
        label = options.label or "label"
        return _table_rows(Path(options.table), list(dict.fromkeys([label, *levels])), root), label, levels
    names = levels or ["class_name"]
    rows = _folder_rows(root, len(names), skipped)
    for row in rows:
        row.update(zip(names, row.pop("parts")))
    label = options.label or names[-1]
    if label not in names:
        raise ImportListError(f"--label {label!r} is not one of the folder levels {names}")
    return rows, label, levels


def _assign_splits(rows: list[dict[str, Any]], label: str, options: ClassImport) -> None:
    """Rows without a split (flat folders, tables without a `split` column) get the seeded stratified split."""
    if all(row.get("split") in SPLITS for row in rows):
        return
    stratify = options.stratify or [label]
    for column in stratify:
        if any(column not in row for row in rows):
            raise ImportListError(f"--stratify: no field {column!r} on the rows (fields: {sorted(rows[0])})")
    strata = [tuple(str(row[c]) for c in stratify) for row in rows]
    for row, split in zip(rows, stratified_split(strata, parse_ratio(options.split), options.seed)):
        row["split"] = split


def _check_leaks(root: Path, rows: list[dict[str, Any]]) -> None:
    """The same image bytes under two splits is one error line naming both files (`rows`: images that decode)."""
    seen: dict[str, dict[str, Any]] = {}
    for row in rows:
        digest = file_identity(root / row["file_name"], "content")
        if digest is None:
            continue
        first = seen.setdefault(digest, row)
        if first["split"] != row["split"]:
            raise ImportListError(f"the same image is in two splits: {first['file_name']} ({first['split']}) and "
                                  f"{row['file_name']} ({row['split']}); remove one")


PROBE_THREADS = 4  # images decoded at once by `_probe` (PIL releases the GIL while it decodes)


def _decode_failure(path: Path) -> str | None:
    """Why the image at `path` cannot be used (not found, not a regular file, does not decode), None when it decodes."""
    try:
        check_regular(path)  # a FIFO or device is never opened
        load_image(path)
    except FileNotFoundError:
        return "file not found"
    except NotRegularFile as err:
        return err.strerror
    except ImageLoadError as err:
        return err.reason
    return None


def decode_failures(root: str | os.PathLike, names: Iterable[str]) -> dict[str, str]:
    """{name: reason} for each image `root / name` that cannot be used (not found, not a regular file, does not
    decode), in the order given; every image is decoded once (`PROBE_THREADS` at a time)."""
    names = list(names)
    with ThreadPoolExecutor(PROBE_THREADS) as pool:
        reasons = pool.map(_decode_failure, (Path(root) / name for name in names))
        return {name: reason for name, reason in zip(names, reasons) if reason is not None}


def _probe(root: Path, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[dict[str, str]]]:
    """Rows whose image decodes, and a failure record {file, reason} for every other one (in row order)."""
    reasons = decode_failures(root, [row["file_name"] for row in rows])
    kept = [row for row in rows if row["file_name"] not in reasons]
    return kept, [{"file": name, "reason": reason} for name, reason in reasons.items()]


def import_classes(root: str | os.PathLike, out: str | os.PathLike, options: ClassImport | None = None) -> ImportResult:
    """Class folders or a table -> one ID manifest at `out` (images stay in place; module docstring).

    Labels index the sorted class names (the label level's values); each row keeps `class_name` and every level
    field. `out/class_names.json` = {"names", "label_field", "levels"}; unreadable images go to `out/failures.json`.
    """
    root, options = Path(root), options or ClassImport()
    if not root.is_dir():
        raise ImportListError(f"image folder not found: {root}")
    skipped = Skipped()
    rows, label, levels = _source_rows(root, options, skipped)
    _assign_splits(rows, label, options)
    with folder_lock(out, "import_folder"):
        rows, failures = _probe(root, rows)
        if not rows:
            raise ImportListError(f"{root}: no readable image ({len(failures)} failed, e.g. {failures[0]['file']}: "
                                  f"{failures[0]['reason']})")
        _check_leaks(root, rows)  # decoded images only: identical broken files (0 bytes) are failures, not leaks
        names = sorted({str(row[label]) for row in rows})
        index = {name: i for i, name in enumerate(names)}
        reserved = {"file_name", "split", "role", "ood_set", "group", "label", "class_name"}
        manifest_rows = [make_row(row["file_name"], split=row["split"], role="id", label=index[str(row[label])],
                                  **{k: v for k, v in row.items() if k not in reserved}, class_name=str(row[label]))
                         for row in rows]
        result = ImportResult("id", Path(out), write_external_manifest(out, manifest_rows, root), str(root),
                              skipped=skipped, failures=failures)
        write_class_names(out, ClassNames(names, label if options.levels or options.table else None, levels))
        _write_records(result)
    return result


def _write_records(result: ImportResult) -> None:
    """`failures.json` (unreadable images) and `import_summary.json` (counts, what was skipped) beside the manifest."""
    atomic_write_json(result.folder / "failures.json", result.failures)
    atomic_write_json(result.folder / "import_summary.json", result.summary())


def import_ood_folders(root: str | os.PathLike, out: str | os.PathLike, *, group: str | None = None,
                       split: str = "test") -> ImportResult:
    """One OOD set per subfolder of `root`, named after it, all in one manifest folder `out` (images in place)."""
    root = Path(root)
    if not root.is_dir():
        raise ImportListError(f"image folder not found: {root}")
    rows, skipped = _set_rows(root, "OOD", lambda name: dict(role="ood", ood_set=name, group=group, split=split))
    if not rows:
        raise ImportListError(f"{root}: no subfolders with images (one OOD set per subfolder)")
    with folder_lock(out, "import_folder"):
        rows, failures = _probe(root, rows)
        if not rows:
            raise ImportListError(f"{root}: no readable image ({len(failures)} failed, e.g. {failures[0]['file']}: "
                                  f"{failures[0]['reason']})")
        result = ImportResult(",".join(dict.fromkeys(r["ood_set"] for r in rows)), Path(out),
                              write_external_manifest(out, rows, root), str(root), skipped=skipped, failures=failures)
        _write_records(result)
    return result


def _set_rows(root: Path, kind: str, fields: Any) -> tuple[list[dict[str, Any]], Skipped]:
    """Rows of every image under each subfolder of `root`, `fields(folder name)` on each; what was skipped."""
    rows, skipped = [], Skipped()
    for folder in _subfolders(root, root, skipped):
        images, left_out = scan_images(folder, relative_to=root)
        skipped.add(left_out)
        if not images:
            raise ImportListError(f"{kind} folder {folder} holds no images")
        rows += [make_row(p.relative_to(root).as_posix(), **fields(folder.name)) for p in images]
    return rows, skipped


# -- field sets: known-species folders are the set's own ID rows, the others its novel rows ------------------------
def _species_key(name: str) -> str:
    return " ".join(name.replace("_", " ").split()).casefold()


def _known_folders(root: Path, model: Path, names: list[str], folders: list[str], match: dict[str, int | None],
                   known: Iterable[str] | None) -> set[str]:
    """The folders of known species: those matching a class, or `known` (each a class, and no other folder one).
    There must be some, and some novel folders besides."""
    if known is not None:
        known = list(known)
        for name in known:
            if name not in match:
                raise ImportListError(f"--known {name!r}: no such folder in {root} (folders: {folders[:8]})")
            if match[name] is None:
                raise ImportListError(f"--known {name!r}: the classifier {model} has no class {name!r} "
                                      f"({len(names)} classes, e.g. {names[:5]})")
        extra = [f for f in folders if f not in known and match[f] is not None]
        if extra:
            raise ImportListError(f"{root / extra[0]}: a class of the classifier but not in --known; add it there "
                                  "or rename the folder")
    ids = {f for f in folders if match[f] is not None} if known is None else set(known)
    if not ids:
        raise ImportListError(f"{root}: no folder is a species of the classifier {model} (classes, e.g. "
                              f"{names[:5]}): a field set needs its own known-species images")
    if len(ids) == len(folders):
        raise ImportListError(f"{root}: every folder is a known species: a field set needs novel-species folders too")
    return ids


def import_field(root: str | os.PathLike, out: str | os.PathLike, *, model: str | os.PathLike,
                 known: Iterable[str] | None = None, ood_set: str = "field", group: str | None = None,
                 split: str = "test") -> ImportResult:
    """A field set from species folders `root/<species>/`: the folders of species the classifier `model` knows
    become ID rows (label = the classifier's index of the species, by its class names), every other folder novel
    rows (role ood, `ood_set`); every row keeps `species` (the folder's, or the classifier's spelling of it).

    A folder matches a class by name, also with underscores as spaces and in any case. `known` names the folders
    the user says are known species: each must be a class of the classifier, and no other folder may be one.
    """
    root, model = Path(root), Path(model)
    if not root.is_dir():
        raise ImportListError(f"image folder not found: {root}")
    classes = model_class_names(model) if model.is_dir() else None
    if classes is None or not classes.names:
        raise ImportListError(f"--model {model}: not a classifier folder with class names (class_names.json or "
                              "config.json id2label)")
    exact = {name: i for i, name in enumerate(classes.names)}
    loose = {_species_key(name): i for i, name in enumerate(classes.names)}
    folders = [p.name for p in _subfolders(root, root, Skipped())]
    match = {f: exact.get(f, loose.get(_species_key(f))) for f in folders}
    ids = _known_folders(root, model, classes.names, folders, match, known)

    def fields(name: str) -> dict[str, Any]:
        if name in ids:
            label = match[name]
            return dict(role="id", label=label, split=split, species=classes.names[label],
                        class_name=classes.names[label])
        return dict(role="ood", ood_set=ood_set, group=group, split=split, species=name)

    rows, skipped = _set_rows(root, "species", fields)
    with folder_lock(out, "import_folder"):
        rows, failures = _probe(root, rows)
        if not {row["role"] for row in rows} >= {"id", "ood"}:
            raise ImportListError(f"{root}: after leaving out the {len(failures)} image(s) that do not decode (e.g. "
                                  f"{failures[0]['file']}: {failures[0]['reason']}), a field set needs readable "
                                  "known-species and novel-species images")
        result = ImportResult(ood_set, Path(out), write_external_manifest(out, rows, root), str(root), skipped=skipped,
                              failures=failures)
        _write_records(result)
    return result
