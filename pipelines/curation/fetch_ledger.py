"""What fetch_images wrote, and where it may write: the ledger, paths kept under `--out`, the image store.

- `OUT/.fetch/ledger.jsonl`: one JSON line per outcome, the last line of a URL wins. `writing` (the sha256 and size
  about to be written) goes before an image's rename, `ok` after it, so a file found at a path is the project's only
  when the ledger says this URL wrote exactly it (a run killed between the two lines is told by the hash).
- `Paths.resolve(file_name)`: a table's `file_name` as a path under `--out`, or a final FetchFailure: blank,
  absolute, `..`, reaching outside through a symlink (in `images/` or at the file itself), a name the file system
  cannot hold (a part over `NAME_MAX` bytes, the path over `PATH_MAX`), or one of the run's own files and folders
  (`RESERVED`: images.csv, the ledger, ...).
- `FileStore`: one file per image, written atomically; the one place a finished image is written or removed, so
  another store (shards) can stand in.
"""
from __future__ import annotations

import hashlib
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pipelines.curation.fetch_client import FetchFailure

LEDGER = Path(".fetch") / "ledger.jsonl"
RESERVED = frozenset({"images.csv", "failures.csv", "filtered.csv", "fetch_summary.json", ".fetch", "shards",
                      "originals", ".oodforge.lock", ".oodforge.lock.guard"})
"""The names at the top of `--out` the run writes itself (its tables, ledger, shard store, originals, lock): an image's
`file_name` there would overwrite them or be overwritten (compared case-folded, for case-insensitive disks)."""
_RESERVED_FOLDED = frozenset(name.casefold() for name in RESERVED)
NAME_MAX, PATH_MAX = 255, 4096
"""The longest path part and path in bytes Linux file systems take (`pathconf`'s usual values): longer names are
refused per row before any request, not left to fail the write."""


def read_ledger(path: Path) -> dict[str, dict[str, Any]]:
    """url -> its last record (a line cut short by a kill, or not a record, is skipped)."""
    records: dict[str, dict[str, Any]] = {}
    if path.is_file():
        with open(path, encoding="utf-8", errors="replace") as handle:
            for line in handle:
                try:
                    record = json.loads(line)
                except json.JSONDecodeError:
                    continue
                if isinstance(record, dict) and isinstance(record.get("url"), str):
                    records[record["url"]] = record
    return records


class Ledger:
    """Appends records (flushed line by line) to OUT/.fetch/ledger.jsonl; the folder is created if missing."""

    def __init__(self, out: Path):
        self.path = out / LEDGER
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self.handle = open(self.path, "a", encoding="utf-8")

    def write(self, record: dict[str, Any]) -> None:
        """Append one record; a failed write (a full disk) names the ledger."""
        try:
            self.handle.write(json.dumps({**record, "t": round(time.time(), 3)}) + "\n")
            self.handle.flush()
        except OSError as err:
            err.filename = err.filename or os.fspath(self.path)
            raise

    def close(self) -> None:
        self.handle.close()


class Paths:
    """Resolves `file_name`s under `out` (realpaths of their folders cached: one lstat a file after the first)."""

    def __init__(self, out: Path):
        self.out, self.out_text = out, os.fspath(out)
        self.root = os.path.realpath(out)
        self.folders: dict[str, bool] = {}

    def resolve(self, file_name: Any, *, own: bool = False) -> Path:
        """`out/file_name`, or a final FetchFailure saying why not; `own`: a path the fetch itself derives under one of
        its folders (an original's copy), so `RESERVED` does not apply."""
        self._check_name(file_name, own)
        path = os.path.join(self.out_text, os.path.normpath(file_name))
        self._check_links(file_name, path)
        return Path(path)

    def _check_name(self, file_name: Any, own: bool) -> None:
        """The name's own checks: a non-blank relative path without NUL or '..', within the file system's lengths,
        outside the fetch's reserved folders unless `own`."""
        if not isinstance(file_name, str) or not file_name.strip():
            raise FetchFailure("unsafe file_name: blank", True)
        if "\0" in file_name:
            raise FetchFailure("unsafe file_name: holds a NUL byte", True)
        if os.path.isabs(file_name):
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: absolute (it must lie under --out)", True)
        parts = file_name.split("/")
        if ".." in parts:
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: '..' leaves --out", True)
        longest = max(len(os.fsencode(part)) for part in parts)
        if longest > NAME_MAX:
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: too long for the file system (a part of "
                               f"{longest} bytes; at most {NAME_MAX})", True)
        length = len(os.fsencode(os.path.join(self.root, file_name)))
        if length >= PATH_MAX:
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: too long for the file system (a path of "
                               f"{length} bytes under --out; at most {PATH_MAX - 1})", True)
        first = next((part for part in parts if part not in ("", ".")), "")
        if not own and first.casefold() in _RESERVED_FOLDED:
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: {first!r} is the fetch's own output in --out",
                               True)

    def _check_links(self, file_name: str, path: str) -> None:
        """The file system's checks: the path is no symlink and its folder's realpath lies under `out` (cached)."""
        folder = os.path.dirname(path)
        inside = self.folders.get(folder)
        if inside is None:
            inside = self.folders[folder] = _under(os.path.realpath(folder), self.root)
        if os.path.islink(path):
            where = ("leads outside --out" if not _under(os.path.realpath(path), self.root)
                     else "is never written through")
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: a symlink {where}", True)
        if not inside:
            raise FetchFailure(f"unsafe file_name {_short(file_name)}: a symlink leads outside --out", True)


def _short(file_name: str, keep: int = 60) -> str:
    """A file name quoted for a message, its middle cut when long (a 5,000-character name stays one readable line)."""
    return repr(file_name) if len(file_name) <= 2 * keep else repr(f"{file_name[:keep]}...{file_name[-keep:]}")


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


class FileStore:
    """One file per image under `out` (`write` atomic through `writer`, pipelines.io's by default)."""

    def __init__(self, out: Path, writer: Callable[[Path, bytes], None]):
        self.out, self.writer = out, writer

    def write(self, path: Path, data: bytes) -> None:
        self.writer(path, data)

    def remove(self, path: Path) -> None:
        path.unlink(missing_ok=True)
