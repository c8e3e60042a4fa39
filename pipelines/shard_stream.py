"""Shards written as images arrive (`fetch_images --store shards`), in pack_shards' format, resumable after a kill -9.

    stream = ShardStream(out / "shards", settings, samples_per_shard=10_000)
    stream.add("images/ab/abcd.jpg", data)       # appended to the shard being written
    stream.members["images/ab/abcd.jpg"]          # a MemberPath once its shard is finished
    stream.close()                                # finishes the last shard

The shard being written is `NNNNNN.tar` under its final name, with no index; it is finished (the tar ended and
fsynced, then `NNNNNN.index.json`, then `store.json`, each atomically) once it holds `samples_per_shard` images or
`shard_bytes` bytes, and when the stream closes. So a kill loses at most the images of that one shard: on resume a
tar without an index is that unfinished shard (cut anywhere, even inside a member), named in one warning line and
rewritten from its first image, whose callers fetch them again. Finished shards are checked against their records
(`pipelines.store.check_shard`, stat mode): a truncated or changed one, a shard written with other resize settings,
or a shard out of sequence is one ShardError naming the file, and nothing is deleted. Keys run on across shards
(`000000042` is the store's 43rd image), so member names are unique in the store.
"""
from __future__ import annotations

import io
import logging
import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from pipelines.io import atomic_write_json
from pipelines.shards import ShardWriter, member_key, member_suffix, shard_name, shard_record
from pipelines.store import (
    STORE_FILE,
    MemberPath,
    ShardError,
    check_shard,
    index_path,
    read_index,
    read_store,
    store_document,
)

log = logging.getLogger(__name__)

SUFFIXES = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "GIF": ".gif", "BMP": ".bmp", "TIFF": ".tif"}
"""PIL format -> the extension of a member holding it (WebDataset decodes by extension)."""


def sniffed_suffix(data: bytes, file_name: str) -> str:
    """The member extension of `data`: its format's (read from the header), else the file name's."""
    from PIL import Image

    try:
        with Image.open(io.BytesIO(data)) as image:
            return SUFFIXES.get(image.format or "", member_suffix(file_name))
    except Exception:  # noqa: BLE001 - not an image: keep the name's extension
        return member_suffix(file_name)


@contextmanager
def _naming(path: Path) -> Iterator[None]:
    """A system error writing the shard (a full disk) names it, as `pipelines.io.atomic_path` names its file."""
    try:
        yield
    except OSError as err:
        if err.filename is None:
            err.filename = os.fspath(path)
        raise


class ShardStream:
    """An appendable shard store at `root` (module docstring); `settings` (the resize mode's) are recorded in every
    index and must match those of the shards already there."""

    def __init__(self, root: str | Path, settings: dict[str, Any], samples_per_shard: int, shard_bytes: int):
        self.root, self.settings = Path(root), dict(settings)
        self.samples_per_shard, self.shard_bytes = samples_per_shard, shard_bytes
        self.root.mkdir(parents=True, exist_ok=True)
        self.indexes = self._resume()
        self.members: dict[str, MemberPath] = {}
        for index in self.indexes:
            self._claim(index)
        self.next_key = sum(len(index["names"]) for index in self.indexes)
        self.writer: ShardWriter | None = None

    # -- what a run finds -------------------------------------------------------------------------------------------
    def _resume(self) -> list[dict[str, Any]]:
        records = read_store(self.root) if (self.root / STORE_FILE).is_file() else {}
        indexes: list[dict[str, Any]] = []
        while index_path(path := self.root / shard_name(len(indexes))).is_file():
            index = read_index(path)
            if index.get("settings") != self.settings:
                raise ShardError(f"{index_path(path)}: written with {index.get('settings')}, this run asks "
                                 f"{self.settings}; use the same resize options or another --out")
            check_shard(path, records.get(path.name) or shard_record(index), "stat")
            indexes.append(index)
        unlisted = sorted(set(records) - {index["shard"] for index in indexes})
        if unlisted:
            raise ShardError(f"{self.root / unlisted[0]}: listed in {self.root / STORE_FILE} but its index is "
                             "missing or out of sequence; restore it, or move the store away and fetch again")
        last = self.root / shard_name(len(indexes))
        stray = sorted(p.name for p in self.root.glob("*.tar") if p.name > last.name)
        if stray:  # checked before anything is removed
            raise ShardError(f"{self.root / stray[0]}: a shard out of sequence (after {last.name}, which is not "
                             "finished); this store was not written by one fetch: move it away")
        if last.exists():
            log.warning("%s: unfinished shard of a killed run (%d bytes, no index); rewriting it, its images are "
                        "fetched again", last, last.stat().st_size)
            last.unlink()
        if len(records) != len(indexes):  # killed between an index and store.json: list the finished shard
            self._write_store(indexes)
        return indexes

    def _claim(self, index: dict[str, Any]) -> None:
        shard = self.root / index["shard"]
        for member, (offset, size, file_name) in index["members"].items():
            self.members[file_name] = MemberPath(shard, member, offset, size)

    def _write_store(self, indexes: list[dict[str, Any]]) -> None:
        atomic_write_json(self.root / STORE_FILE, store_document([shard_record(i) for i in indexes], **self.settings))

    # -- writing ---------------------------------------------------------------------------------------------------
    def add(self, file_name: str, data: bytes, fields: dict[str, Any] | None = None) -> None:
        """Append one image to the shard being written (opened on the first image); the shard is finished once it
        is full. The image is in `members` once its shard is finished."""
        if self.writer is None:
            name = shard_name(len(self.indexes))
            self.writer = ShardWriter(self.root / name, name)
        self.writer.names.append(file_name)
        with _naming(self.root / self.writer.name):
            self.writer.add(member_key(self.next_key), file_name, data, sniffed_suffix(data, file_name), fields or {})
        self.next_key += 1
        if len(self.writer.names) >= self.samples_per_shard or self.writer.bytes_written >= self.shard_bytes:
            self.finish()

    def finish(self) -> None:
        """Finish the shard being written (if any): end and fsync the tar, then its index, then store.json."""
        writer, self.writer = self.writer, None
        if writer is None:
            return
        path = self.root / writer.name
        try:
            with _naming(path):
                writer.close()
        except BaseException:
            writer.abandon()  # left unfinished: the next run rewrites it
            raise
        index = writer.index(path, self.settings)
        atomic_write_json(index_path(path), index)
        self.indexes.append(index)
        self._claim(index)
        self._write_store(self.indexes)
        log.info("%s: finished (%d images)", path, len(writer.names))

    close = finish
