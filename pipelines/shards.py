"""The shard image store, write side: images -> WebDataset-layout tar shards with per-shard indexes, resumable.

    store = pack_images(sources, "data/own/shards", PackConfig())       # [(file_name, path), ...]
    pack_manifest("data/own", "data/own_shards")                        # any manifest -> a shard manifest

Shard `NNNNNN.tar` holds, per image, `<key>.<ext>` (the image: its bytes unchanged by default, or resized in one of
fetch's modes, `pipelines.curation.fetch_resize`: `keep_ratio` as img2dataset, `reference` as Open-Insect's
download.py) and `<key>.json` (file_name, original and stored size, the stored bytes' sha256), keys being the image's
position in the pack (`000000042`), so `webdataset.WebDataset` and `wids` read the shards as they are.
`NNNNNN.index.json` (members and offsets, the tar's size, mtime and sha256) is written after its tar, both atomically: a
shard with an index is finished, and a rerun packs only the shards without one. `store.json`
(`pipelines.store.read_store`) lists the finished shards.

Shards are planned before any image is read: consecutive images, at most `samples_per_shard` of them (img2dataset's
and WebDataset's 10,000) and `shard_bytes` of source bytes (1 GiB) a shard, so the plan, and so each finished shard,
is the same on every rerun. A missing image gets no member (its row keeps pointing at no bytes and fails to load as a
missing file does); an image that does not decode is stored as it is (it fails to load as it did). Format and
measurements: docs/shards.md.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import time
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import ProcessPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import Any, BinaryIO, Literal

from PIL import Image

from pipelines.class_names import CLASS_NAMES
from pipelines.curation.fetch_client import FetchFailure
from pipelines.curation.fetch_resize import encoded_suffix, mode_settings, prepare
from pipelines.data import (
    IMAGE_SUFFIXES,
    MANIFEST_INFO,
    MAX_PIXELS,
    Manifest,
    ManifestError,
    read_manifest,
    write_manifest,
)
from pipelines.errors import UserInputError
from pipelines.io import atomic_path, atomic_write_json, remove_orphan_temps
from pipelines.params import Config, param
from pipelines.store import (
    ROW_FIELDS,
    STORE_FILE,
    MemberPath,
    ShardRecord,
    index_path,
    read_index,
    read_store,
    store_document,
)

log = logging.getLogger(__name__)

SHARD_FOLDER = "shards"  # where pack_manifest puts the store, inside the output manifest folder
INDEX_FORMAT = "oodforge-shard-index-v1"
DOC = "docs/shards.md"


SAMPLES_PER_SHARD = 10_000  # img2dataset's number_sample_per_shard, WebDataset's usual shard
SHARD_BYTES = 1 << 30


@dataclass(frozen=True)
class PackConfig(Config):
    """How images are packed into shards."""

    DOC = DOC

    samples_per_shard: int = param(SAMPLES_PER_SHARD, "images a shard at most (img2dataset's number_sample_per_shard)",
                                   ge=1)
    shard_bytes: int = param(SHARD_BYTES, "source bytes a shard at most (a single larger image still gets a shard)",
                             ge=1)
    resize: Literal["reference", "keep_ratio", "none"] = param(
        "none", "the resize modes of fetch (pipelines.curation.fetch_resize): `none` stores every image's bytes "
                "unchanged; `keep_ratio` as img2dataset (shorter side above 512 resized, quality 95); `reference` as "
                "Open-Insect's download.py:10-31 (shorter side to 224, up or down, PIL's quality 75)")
    short_side: int | None = param(None, "the shorter side of resized images (None: the mode's, 224 / 512)", ge=1)
    quality: int | None = param(None, "JPEG / WebP quality of resized images (None: the mode's, 75 / 95)", ge=1, le=100)

    def settings(self) -> dict[str, Any]:
        """What decides the stored bytes (recorded in store.json, compared on resume): `fetch_resize.mode_settings`."""
        return mode_settings(self.resize, self.short_side, self.quality)


@dataclass
class PackResult:
    """A pack: where each image went (file_name -> MemberPath, None when its source was missing), the shards written
    now and before, and the images that were missing or stored undecoded."""

    store: Path
    members: dict[str, MemberPath | None]
    written: list[str] = field(default_factory=list)
    kept: list[str] = field(default_factory=list)
    missing: list[str] = field(default_factory=list)
    undecoded: list[str] = field(default_factory=list)


class PackError(UserInputError):
    """A pack that cannot go on (a store packed from other images or settings, a reserved row field); names it."""

    doc = DOC


# -- plan -------------------------------------------------------------------------------------------------------------
def source_size(path: Any) -> int | None:
    try:
        return int(path.stat().st_size) if path.is_file() else None
    except OSError:
        return None


def plan_shards(sizes: Sequence[int | None], config: PackConfig) -> list[range]:
    """Consecutive positions per shard: at most `samples_per_shard` images and `shard_bytes` source bytes (missing
    images count 0), a new shard only when the current one is not empty."""
    shards, start, total = [], 0, 0
    for pos, size in enumerate(sizes):
        size = size or 0
        if pos > start and (pos - start >= config.samples_per_shard or total + size > config.shard_bytes):
            shards.append(range(start, pos))
            start, total = pos, 0
        total += size
    if start < len(sizes):
        shards.append(range(start, len(sizes)))
    return shards


def shard_name(number: int) -> str:
    return f"{number:06d}.tar"


def member_key(position: int) -> str:
    return f"{position:09d}"


# -- one image, one shard
# -----------------------------------------------------------------------------------------------
def member_suffix(file_name: str) -> str:
    """The extension a member of unchanged bytes gets: the source's (lower case) when an image suffix, else `.bin`."""
    suffix = PurePosixPath(str(file_name)).suffix.lower()
    return suffix if suffix in IMAGE_SUFFIXES else ".bin"


def stored_image(data: bytes, file_name: str, config: PackConfig) -> tuple[bytes, str, dict[str, Any]]:
    """(bytes to store, their extension, json fields) of one source image, by `fetch_resize.prepare` in the config's
    mode; `none` reads only the header (the original size) and stores the bytes unchanged. Bytes that are not a whole
    image are kept as they are (`error` says why)."""
    settings = config.settings()
    try:
        if settings["short_side"] is None:
            with Image.open(io.BytesIO(data)) as img:
                return data, member_suffix(file_name), {"original_size": list(img.size)}
        prepared = prepare(data, file_name, settings["short_side"], MAX_PIXELS, settings["quality"], config.resize)
    except FetchFailure as err:
        return data, member_suffix(file_name), {"error": f"not decoded ({err.reason}); stored as it is"}
    except Exception as err:  # PIL raises many types for corrupt headers
        return data, member_suffix(file_name), {"error": f"not decoded ({type(err).__name__}: {err}); stored as it is"}
    fields: dict[str, Any] = {"original_size": [prepared.original_width, prepared.original_height]}
    if prepared.data is data:
        return data, member_suffix(file_name), fields
    return prepared.data, encoded_suffix(file_name), {**fields, "size": [prepared.width, prepared.height]}


class HashingWriter:
    """A write-only file wrapper that hashes what passes through (the tar is hashed as it is written)."""

    def __init__(self, fh: BinaryIO):
        self.fh, self.sha = fh, hashlib.sha256()

    def write(self, data: bytes) -> int:
        self.sha.update(data)
        return self.fh.write(data)

    def tell(self) -> int:
        return self.fh.tell()


def _add(tar: tarfile.TarFile, name: str, data: bytes) -> tuple[int, int]:
    """Add a regular member; returns (offset of its data, its size)."""
    info = tarfile.TarInfo(name)
    info.size, info.mode, info.mtime = len(data), 0o444, 0
    tar.addfile(info, io.BytesIO(data))
    padded = -(-len(data) // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE
    return tar.offset - padded, len(data)


class ShardWriter:
    """One shard being written to `path`: each image as `<key>.<ext>` plus its `<key>.json`, the tar hashed as it is
    written; `close` ends the tar and fsyncs it, `index` is what `<stem>.index.json` records of it (named `name`)."""

    def __init__(self, path: Path, name: str):
        self.name, self.raw = name, open(path, "wb")
        self.sink = HashingWriter(self.raw)
        self.tar = tarfile.open(fileobj=self.sink, mode="w", format=tarfile.USTAR_FORMAT)  # type: ignore[arg-type]
        self.names: list[str | None] = []
        self.members: dict[str, list[Any]] = {}
        self.missing: list[str] = []
        self.undecoded: list[str] = []
        self.digest: str | None = None

    def add(self, key: str, file_name: str, image: bytes, ext: str, fields: dict[str, Any]) -> tuple[str, int, int]:
        """Append one image (its name already in `names`); returns (member, offset, size)."""
        if "error" in fields:
            self.undecoded.append(file_name)
        offset, size = _add(self.tar, key + ext, image)
        self.members[key + ext] = [offset, size, file_name]
        meta = {"file_name": file_name, "sha256": hashlib.sha256(image).hexdigest(), **fields}
        _add(self.tar, key + ".json", json.dumps(meta, sort_keys=True).encode())
        return key + ext, offset, size

    @property
    def bytes_written(self) -> int:
        return self.raw.tell()

    def close(self) -> None:
        """End the tar, fsync and close the file (idempotent)."""
        if self.digest is None:
            self.tar.close()
            self.raw.flush()
            os.fsync(self.raw.fileno())
            self.raw.close()
            self.digest = self.sink.sha.hexdigest()

    def abandon(self) -> None:
        """Close the file without ending the tar (what a kill leaves: an unfinished shard)."""
        try:
            self.raw.close()
        except OSError:  # its buffer could not be written (a full disk): the shard is unfinished either way
            pass

    def index(self, path: Path, settings: dict[str, Any]) -> dict[str, Any]:
        st = os.stat(path)
        return {"format": INDEX_FORMAT, "shard": self.name, "size": st.st_size, "mtime_ns": st.st_mtime_ns,
                "sha256": self.digest, "settings": settings, "names": self.names, "members": self.members,
                "missing": self.missing, "undecoded": self.undecoded}


def write_shard(path: Path, items: Sequence[tuple[int, str, Any]], config: PackConfig) -> dict[str, Any]:
    """Write the shard `path` (tar, then its index, each atomically) from (position, file_name, source path) items;
    returns the index."""
    with atomic_path(path) as tmp:
        writer = ShardWriter(tmp, path.name)
        try:
            for position, file_name, source in items:
                writer.names.append(file_name)
                try:
                    with source.open("rb") as fh:
                        data = fh.read()
                except OSError:
                    writer.missing.append(file_name)
                    continue
                writer.add(member_key(position), file_name, *stored_image(data, str(source.name), config))
        finally:
            writer.close()
    index = writer.index(path, config.settings())
    atomic_write_json(index_path(path), index)
    return index


def _write_shard_job(args: tuple[str, list[tuple[int, str, Any]], PackConfig]) -> dict[str, Any]:
    path, items, config = args
    return write_shard(Path(path), items, config)


def shard_record(index: dict[str, Any]) -> ShardRecord:
    return ShardRecord(index["shard"], index["size"], index["mtime_ns"], index["sha256"], len(index["members"]))


def _finished(path: Path, names: list[str], config: PackConfig) -> dict[str, Any] | None:
    """The index of an already finished shard whose images are `names` (None when it is not finished); a finished
    shard of other images or settings, or one whose tar does not match its index in size, is a PackError."""
    if not index_path(path).is_file():
        return None
    index = read_index(path)
    if index.get("names") != names or index.get("settings") != config.settings():
        raise PackError(f"{path}: packed from other images or settings than this run plans (the source rows, their "
                        "sizes or resize/short_side/quality changed); pack into a new --out or remove the store")
    try:
        size = path.stat().st_size
    except OSError:
        size = None
    if size != index["size"]:
        log.warning("%s: its tar is missing or not the indexed size; packing it again", path)
        return None
    return index


# -- a whole pack -----------------------------------------------------------------------------------------------------
@dataclass
class PackPlan:
    """What a pack would do: the shards (position ranges), which are finished, the source bytes to read."""

    store: Path
    names: list[str]
    sources: list[Any]
    sizes: list[int | None]
    shards: list[range]
    finished: dict[int, dict[str, Any]]

    @property
    def todo(self) -> list[int]:
        return [i for i in range(len(self.shards)) if i not in self.finished]

    def todo_images(self) -> int:
        return sum(len(self.shards[i]) for i in self.todo)

    def todo_bytes(self) -> int:
        return sum(self.sizes[p] or 0 for i in self.todo for p in self.shards[i])


def plan_pack(sources: Iterable[tuple[str, Any]], store: str | os.PathLike, config: PackConfig) -> PackPlan:
    """Every check a pack runs before writing: the images (deduplicated by file_name, first source kept), their
    sizes, the shard plan and the finished shards of an earlier run (which must be of the same plan)."""
    store = Path(store)
    unique: dict[str, Any] = {}
    for name, path in sources:
        unique.setdefault(name, path)
    names, paths = list(unique), list(unique.values())
    sizes = [source_size(p) for p in paths]
    shards = plan_shards(sizes, config)
    finished = {}
    for number, positions in enumerate(shards):
        index = _finished(store / shard_name(number), [names[p] for p in positions], config)
        if index is not None:
            finished[number] = index
    return PackPlan(store, names, paths, sizes, shards, finished)


def pack_images(sources: Iterable[tuple[str, Any]], store: str | os.PathLike, config: PackConfig | None = None, *,
                workers: int = 1, on_shard: Callable[[dict[str, Any]], None] | None = None,
                plan: PackPlan | None = None) -> PackResult:
    """Pack (file_name, source path) pairs into the shard store `store` (module docstring), `workers` processes
    writing one shard each; finished shards of an earlier run are kept. `store.json` is rewritten after every shard,
    so a killed pack loses at most the shards being written."""
    config = config or PackConfig()
    plan = plan or plan_pack(sources, store, config)
    store = plan.store
    store.mkdir(parents=True, exist_ok=True)
    remove_orphan_temps(store, recursive=False)
    indexes = dict(plan.finished)
    written: list[str] = []

    def done(number: int, index: dict[str, Any]) -> None:
        indexes[number] = index
        written.append(index["shard"])
        _write_store(store, indexes, config)
        if on_shard is not None:
            on_shard(index)

    jobs = [(str(store / shard_name(n)), [(p, plan.names[p], plan.sources[p]) for p in plan.shards[n]], config)
            for n in plan.todo]
    if workers > 1 and len(jobs) > 1:
        with ProcessPoolExecutor(max_workers=workers) as pool:
            for number, index in zip(plan.todo, pool.map(_write_shard_job, jobs)):
                done(number, index)
    else:
        for number, job in zip(plan.todo, jobs):
            done(number, _write_shard_job(job))
    _write_store(store, indexes, config)
    return _result(store, plan, indexes, written)


def _write_store(store: Path, indexes: dict[int, dict[str, Any]], config: PackConfig) -> None:
    atomic_write_json(store / STORE_FILE,
                      store_document([shard_record(i) for i in indexes.values()], **config.settings()))


def record_mtimes(store: Path) -> int:
    """After a verified copy: record each shard's current modified time in its index and in `store.json` (so the
    stat check needs no re-hash); returns how many changed. Call only once the shards' digests were checked."""
    indexes = {}
    changed = 0
    for number, name in enumerate(sorted(read_store(store))):
        index = read_index(store / name)
        mtime = (store / name).stat().st_mtime_ns
        if index.get("mtime_ns") != mtime:
            index = {**index, "mtime_ns": mtime}
            atomic_write_json(index_path(store / name), index)
            changed += 1
        indexes[number] = index
    if changed:
        settings = {k: v for k, v in next(iter(indexes.values()))["settings"].items()}
        atomic_write_json(store / STORE_FILE, store_document([shard_record(i) for i in indexes.values()], **settings))
    return changed


def _result(store: Path, plan: PackPlan, indexes: dict[int, dict[str, Any]], written: list[str]) -> PackResult:
    members: dict[str, MemberPath | None] = dict.fromkeys(plan.names)
    result = PackResult(store, members, written, [i["shard"] for n, i in sorted(plan.finished.items())])
    for number in sorted(indexes):
        index = indexes[number]
        shard = store / index["shard"]
        for member, (offset, size, file_name) in index["members"].items():
            members[file_name] = MemberPath(shard, member, offset, size)
        result.missing += index["missing"]
        result.undecoded += index["undecoded"]
    return result


# -- manifests
# -----------------------------------------------------------------------------------------------------------
def shard_rows(rows: Iterable[dict[str, Any]], result: PackResult, root: Path) -> list[dict[str, Any]]:
    """Manifest rows pointing at their members (`pipelines.store.ROW_FIELDS`, the shard relative to `root`, the shard
    manifest's image root); a row whose image was missing keeps no member and fails to load as a missing file."""
    out = []
    prefix = os.path.relpath(result.store, root)
    prefix = "" if prefix == "." else prefix + "/"
    for row in rows:
        member = result.members.get(row["file_name"])
        base = {k: v for k, v in row.items() if k not in ROW_FIELDS}
        if member is not None:
            base.update(shard_file=prefix + member.shard.name, shard_member=member.member, shard_offset=member.offset,
                        shard_bytes=member.size)
        out.append(base)
    return out


def check_source_rows(manifest: Manifest, where: str | os.PathLike) -> None:
    """A source row may not carry the shard fields (a shard manifest is repacked from its members, not its fields);
    a row with them in a folder manifest is refused, naming it."""
    for number, row in enumerate(manifest.rows, start=1):
        taken = [k for k in ROW_FIELDS if k in row and row.get("shard_file") is None]
        if taken:
            raise ManifestError(where, number, taken[0], "reserved for the shard store (pipelines.store.ROW_FIELDS)")


def pack_manifest(source: str | os.PathLike, out: str | os.PathLike, config: PackConfig | None = None, *,
                  workers: int = 1, store: str | os.PathLike | None = None,
                  on_shard: Callable[[dict[str, Any]], None] | None = None) -> tuple[Manifest, PackResult]:
    """The manifest folder `source` (any store) -> the shard manifest `out`: `out/metadata.jsonl` with the shard
    fields, `out/manifest_info.json` naming the store as image root, the shards in `store` (default `out/shards`);
    `class_names.json` is copied. `out` may be `source` (converted in place, after the shards are written)."""
    source, out = Path(source), Path(out)
    manifest = read_manifest(source)
    check_source_rows(manifest, source / "metadata.jsonl")
    store = Path(store) if store is not None else out / SHARD_FOLDER
    result = pack_images(((r["file_name"], manifest.path(r)) for r in manifest.rows), store, config,
                         workers=workers, on_shard=on_shard)
    return write_shard_manifest(out, manifest.rows, result, source), result


def pack_manifests(folders: Sequence[str | os.PathLike], store: str | os.PathLike, config: PackConfig | None = None, *,
                   workers: int = 1, on_shard: Callable[[dict[str, Any]], None] | None = None) -> PackResult:
    """Several manifest folders (e.g. make_splits' regions, which share images) -> one store: each image packed
    once (by file_name, the first manifest's source kept), then each folder's rows rewritten to point into it."""
    manifests = [(Path(f), read_manifest(f)) for f in folders]
    for folder, manifest in manifests:
        check_source_rows(manifest, folder / "metadata.jsonl")
    sources = ((r["file_name"], m.path(r)) for _, m in manifests for r in m.rows)
    result = pack_images(sources, store, config, workers=workers, on_shard=on_shard)
    for folder, manifest in manifests:
        write_shard_manifest(folder, manifest.rows, result, folder)
    return result


def pack_workers() -> int:
    """Processes a pack uses by default: every CPU but one."""
    return max(1, (os.cpu_count() or 1) - 1)


def write_shard_manifest(out: Path, rows: list[dict[str, Any]], result: PackResult,
                         source: Path | None = None) -> Manifest:
    """`out/metadata.jsonl` (rows pointing into `result`'s store) and `out/manifest_info.json` (the store as image
    root, relative to `out` when inside it; other keys of an existing sidecar kept)."""
    out.mkdir(parents=True, exist_ok=True)
    root = result.store.resolve()
    try:
        image_root = os.path.relpath(root, out.resolve())
    except ValueError:  # another drive
        image_root = str(root)
    info_path = out / MANIFEST_INFO
    info: dict[str, Any] = {}
    if info_path.is_file():
        try:
            info = json.loads(info_path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):
            info = {}
    if source is not None and source.resolve() != out.resolve():
        names = source / CLASS_NAMES
        if names.is_file():
            shutil.copyfile(names, out / CLASS_NAMES)
    manifest = write_manifest(out, shard_rows(rows, result, root))
    atomic_write_json(info_path, {**info, "image_root": image_root, "store": "shards"})
    return Manifest(root, manifest.rows)


# -- estimates
# ----------------------------------------------------------------------------------------------------------
TAR_OVERHEAD = 2 * 512 + 1024 + 300  # two headers, padding and the json member, a sample


def measure_rate(plan: PackPlan, config: PackConfig, samples: int = 12,
                 clock: Callable[[], float] = time.perf_counter) -> tuple[float, float] | None:
    """(seconds an image, stored bytes per source byte) measured on up to `samples` images of the plan (evenly
    spaced among those still to pack); None when none is readable."""
    todo = [p for n in plan.todo for p in plan.shards[n] if plan.sizes[p]]
    if not todo:
        return None
    picked = todo[::max(1, len(todo) // samples)][:samples]
    seconds, stored, read = 0.0, 0, 0
    for pos in picked:
        start = clock()
        try:
            with plan.sources[pos].open("rb") as fh:
                data = fh.read()
        except OSError:
            continue
        image, _, _ = stored_image(data, str(plan.sources[pos].name), config)
        seconds += clock() - start
        stored += len(image)
        read += len(data)
    if not read:
        return None
    return seconds / len(picked), stored / read


def estimate(plan: PackPlan, config: PackConfig, workers: int) -> dict[str, Any]:
    """The dry run's numbers: images and shards to pack, source bytes, and at the rate measured here the time and
    the disk the shards will take."""
    images, read = plan.todo_images(), plan.todo_bytes()
    measured = measure_rate(plan, config)
    found = {"images": len(plan.names), "shards": len(plan.shards), "finished_shards": len(plan.finished),
             "todo_shards": len(plan.todo), "todo_images": images, "source_bytes": read,
             "missing": sum(1 for n in plan.todo for p in plan.shards[n] if plan.sizes[p] is None)}
    if measured is not None:
        seconds, ratio = measured
        found.update(seconds_per_image=seconds, workers=workers,
                     estimated_seconds=images * seconds / max(1, workers),
                     estimated_bytes=int(read * ratio + images * TAR_OVERHEAD))
    return found


__all__ = ["PackConfig", "PackError", "PackPlan", "PackResult", "SHARD_FOLDER", "estimate", "pack_images",
           "pack_manifest", "plan_pack", "plan_shards", "shard_rows", "stored_image", "write_shard",
           "write_shard_manifest", "record_mtimes", "pack_manifests", "pack_workers", "SAMPLES_PER_SHARD",
           "SHARD_BYTES", "ShardWriter", "HashingWriter", "member_key", "member_suffix", "shard_name", "shard_record"]
