"""Dataset manifests (ImageFolder layout + `metadata.jsonl`) and robust image loading.

A manifest is a folder of images with one JSON object per image in `metadata.jsonl`, so that
`datasets.load_dataset("imagefolder", data_dir=...)` reads it unchanged. The row schema is `pipelines.schema`
(README.md, section 'Data formats').
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from PIL import Image, ImageOps

from pipelines.decode import MAX_PIXELS, Decode, ImageLoadError, decode, to_rgb_mode  # noqa: F401
from pipelines.io import atomic_write_text
from pipelines.jsonl import encode_lines
from pipelines.schema import (  # noqa: F401
    GROUPS,
    METADATA,
    REQUIRED,
    ROLES,
    SCHEMA_DOC,
    SPLITS,
    ManifestError,
    rows_certainly_valid,
    validate_row,
)
from pipelines.store import MemberPath, is_shard_row, member_path, missing_members
from pipelines.walk import walk_files

MANIFEST_INFO = "manifest_info.json"  # optional sidecar: {"image_root": path} when the images live elsewhere
IMAGE_SUFFIXES = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff", ".gif")


@dataclass
class Manifest:
    """An ImageFolder-layout dataset: `root` plus validated `rows` (dicts, in file order)."""

    root: Path
    rows: list[dict[str, Any]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.root = Path(self.root)

    def __len__(self) -> int:
        return len(self.rows)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        return iter(self.rows)

    def path(self, row: dict[str, Any]) -> Path | MemberPath:
        """Where a row's image is: `root / file_name`, or for a row of the shard store (`shard_file` set) its member
        (`pipelines.store.MemberPath`, with the `Path` surface loaders use: is_file, stat, open('rb'), resolve)."""
        if row.get("shard_file") is None:
            return self.root / row["file_name"]
        return member_path(self.root, row)

    def paths(self) -> list[Path | MemberPath]:
        return [self.path(r) for r in self.rows]

    def labels(self) -> np.ndarray:
        return np.array([r["label"] for r in self.rows], dtype=np.int64)

    def select(self, **conditions: Any) -> Manifest:
        """Rows whose fields equal the given values (a list or tuple value means 'any of'); keeps `root`."""
        def match(row: dict[str, Any]) -> bool:
            for key, want in conditions.items():
                have = row.get(key)
                if isinstance(want, (list, tuple, set, frozenset)):
                    if have not in want:
                        return False
                elif have != want:
                    return False
            return True

        return Manifest(self.root, [r for r in self.rows if match(r)])

    def ood_sets(self) -> list[str]:
        """Names of the OOD sets present, in first-seen order."""
        return list(dict.fromkeys(r["ood_set"] for r in self.rows if r["role"] == "ood"))

    def fingerprint(self) -> str:
        """A short hash of the rows (not the pixels): identifies the manifest in feature caches."""
        text = "\n".join(json.dumps(r, sort_keys=True, default=str) for r in self.rows)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def read_manifest(folder: str | os.PathLike, check_files: bool = False,
                  image_root: str | os.PathLike | None = None) -> Manifest:
    """Read and validate `folder/metadata.jsonl`. With `check_files`, every image must exist (`missing_images`).

    `file_name`s are relative to `image_root` when given, else to the `image_root` of `folder/manifest_info.json`
    when that sidecar exists (absolute, or relative to `folder`), else to `folder` (the ImageFolder layout). Rows of
    the shard store name their shard relative to that root (`pipelines.store`).
    """
    folder = Path(folder)
    meta = folder / METADATA
    root = Path(image_root) if image_root is not None else _image_root(folder)
    if not meta.is_file():
        raise ManifestError(meta, None, None, "no metadata.jsonl: not a manifest folder")
    rows: list[dict[str, Any]] = []
    numbers: list[int] = []
    for number, row in manifest_lines(meta):
        if isinstance(row, ManifestError):
            raise row
        rows.append(row)
        numbers.append(number)
    manifest = Manifest(root, rows)
    if check_files:
        for pos, reason in missing_images(manifest):
            raise ManifestError(meta, numbers[pos], "file_name", reason)
    return manifest


def missing_images(manifest: Manifest) -> Iterator[tuple[int, str]]:
    """(row position, reason) of each row whose image is absent, in row order: a folder row's file is looked up in
    one directory listing per folder (not one stat per file); a shard row's shard must exist with its recorded size
    and hold the member's byte range (`pipelines.store.missing_members`)."""
    listed: dict[str, set[str] | None] = {}
    missing = dict(missing_members(manifest.root, manifest.rows))
    for pos, row in enumerate(manifest.rows):
        if pos in missing:
            yield pos, missing[pos]
            continue
        if is_shard_row(row):
            continue
        folder, _, name = os.path.join(manifest.root, row["file_name"]).rpartition(os.sep)
        files = listed.get(folder, ())
        if files == ():
            files = listed[folder] = _files_in(folder)
        if files is None or name not in files:
            yield pos, f"image not found: {manifest.root / row['file_name']}"


def _files_in(folder: str) -> set[str] | None:
    """Names of the regular files (symlinks followed) in `folder`; None when it cannot be listed."""
    try:
        with os.scandir(folder or os.sep) as entries:
            return {e.name for e in entries if _is_file(e)}
    except OSError:
        return None


def _is_file(entry: os.DirEntry) -> bool:
    """A directory entry that is (or links to) a regular file; a link loop or an unreadable target is not."""
    try:
        return entry.is_file()
    except OSError:  # ELOOP of a self-referential link: DirEntry.is_file raises all but ENOENT
        return False


def manifest_lines(meta: str | os.PathLike) -> Iterator[tuple[int, dict[str, Any] | ManifestError]]:
    """Each non-empty line of a `metadata.jsonl`: its number and the validated row, or the `ManifestError` naming the
    line and field (invalid JSON, a schema error, a repeated file_name). Strict readers raise it, lenient ones skip."""
    seen: dict[str, int] = {}
    with open(meta, encoding="utf-8") as fh:
        for number, text in enumerate(fh, start=1):
            if not text.strip():
                continue
            try:
                try:
                    row = json.loads(text)
                except json.JSONDecodeError as err:
                    raise ManifestError(meta, number, None, f"invalid JSON ({err.msg} at column {err.colno})") from None
                validate_row(row, meta, number)
                if row["file_name"] in seen:
                    raise ManifestError(meta, number, "file_name",
                                        f"duplicate of line {seen[row['file_name']]}: {row['file_name']!r}")
            except ManifestError as err:
                yield number, err
                continue
            seen[row["file_name"]] = number
            yield number, row


def _image_root(folder: Path) -> Path:
    info = folder / MANIFEST_INFO
    if not info.is_file():
        return folder
    try:
        value = json.loads(info.read_text(encoding="utf-8")).get("image_root")
    except (json.JSONDecodeError, AttributeError) as err:
        raise ManifestError(info, None, None, f"invalid JSON object ({err})") from None
    if value is None:
        return folder
    if not isinstance(value, str):
        raise ManifestError(info, None, "image_root", f"must be a path string, got {value!r}")
    return folder / Path(value).expanduser()


def write_manifest(folder: str | os.PathLike, rows: Iterable[dict[str, Any]]) -> Manifest:
    """Validate `rows` and write `folder/metadata.jsonl` atomically; returns the manifest.

    Each line is `json.dumps(row, default=str)`, produced column-wise for speed (`pipelines.jsonl`); rows are
    checked column-wise first and, when that check cannot vouch for them, row by row (naming the line and field).
    """
    root = Path(folder)
    rows = list(rows)
    check_manifest_rows(root, rows)
    atomic_write_text(root / METADATA, encode_lines(rows))
    return Manifest(root, rows)


def check_manifest_rows(folder: str | os.PathLike, rows: list[dict[str, Any]]) -> None:
    """The checks `write_manifest` runs before it writes: schema-valid rows and unique file names, else a
    ManifestError naming `folder/metadata.jsonl`, the line and the field."""
    meta = Path(folder) / METADATA
    if rows_certainly_valid(rows):
        return
    seen: set[str] = set()
    for number, row in enumerate(rows, start=1):
        validate_row(row, meta, number)
        if row["file_name"] in seen:
            raise ManifestError(meta, number, "file_name", f"duplicate file_name {row['file_name']!r}")
        seen.add(row["file_name"])


def make_row(file_name: str, *, split: str = "test", role: str = "id", label: int = 0, ood_set: str | None = None,
             group: str | None = None, **extra: Any) -> dict[str, Any]:
    """Build a schema-complete row (OOD rows get label -1)."""
    if role == "ood":
        label = -1
    return {"file_name": file_name, "split": split, "role": role, "ood_set": ood_set, "group": group, "label": label,
            **extra}


def list_images(folder: str | os.PathLike) -> list[Path]:
    """Image files below `folder`, recursively, sorted by relative path: regular files only, no symlink followed, no
    hidden entry (`pipelines.walk.walk_files`); what was left out is logged in one warning line."""
    images, skipped = walk_files(folder, IMAGE_SUFFIXES)
    if skipped.line():
        logging.getLogger(__name__).warning("%s: %s", folder, skipped.line())
    return images


def open_image_source(folder: str | os.PathLike, **defaults: Any) -> Manifest:
    """A manifest folder as is, or a plain image folder as a manifest with `defaults` on every row."""
    root = Path(folder)
    if (root / METADATA).is_file():
        return read_manifest(root)
    rows = [make_row(p.relative_to(root).as_posix(), **defaults) for p in list_images(root)]
    return Manifest(root, rows)


def to_rgb(image: Image.Image, background: tuple[int, int, int] = (255, 255, 255)) -> Image.Image:
    """Any PIL mode to 8-bit RGB: EXIF orientation applied, alpha composited on `background`,
    CMYK/palette/grayscale converted, 16-bit and float images rescaled to 0-255 (`pipelines.decode.to_rgb_mode`)."""
    return to_rgb_mode(ImageOps.exif_transpose(image), background)


def load_image(path: str | os.PathLike | Any, max_pixels: int | None = MAX_PIXELS, orient: bool = True) -> Image.Image:
    """Load an image as RGB at full size (see `to_rgb`; `orient=False` keeps the stored pixel order); raises
    `ImageLoadError` naming the file and the reason when it is missing, empty, undecodable or larger than `max_pixels`
    (checked on the header, before any pixel is decoded; None = no limit), so a corrupt or huge file is a recorded
    failure, never a crash or a memory blow-up. Orientation and mode conversion copy the pixels only when they change
    them (`pipelines.decode`).

    `path` is a file path or what `Manifest.path` returns for any image store: an object with `is_file()`, `stat()`
    and `open("rb")` (a `pathlib.Path`, or a member of a shard)."""
    return decode(path, Decode(draft=False, orient=orient, max_pixels=max_pixels))[0].image


@dataclass
class LoadFailure:
    """One item that could not be loaded: its position, file and reason."""

    index: int
    file: str
    reason: str


def load_images(paths: Sequence[str | os.PathLike],
                max_pixels: int | None = MAX_PIXELS) -> tuple[list[Image.Image | None], list[LoadFailure]]:
    """Load many images; unreadable ones become `None` with a recorded `LoadFailure` instead of an exception."""
    images: list[Image.Image | None] = []
    failures: list[LoadFailure] = []
    for i, p in enumerate(paths):
        try:
            images.append(load_image(p, max_pixels))
        except ImageLoadError as err:
            images.append(None)
            failures.append(LoadFailure(i, str(p), err.reason))
    return images, failures
