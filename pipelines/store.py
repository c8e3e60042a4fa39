"""The shard image store, read side: images as members of POSIX tar shards in the WebDataset layout, read by offset.

A shard manifest is an ordinary manifest (`metadata.jsonl`, schema unchanged) whose rows also carry where their bytes
are: `shard_file` (the tar, relative to the manifest's image root), `shard_member` (the member's name, `<key>.<ext>`),
`shard_offset` (where the member's bytes start in the tar) and `shard_bytes` (how many). `Manifest.path(row)` returns a
`MemberPath` for such a row: `is_file()`, `stat()`, `open("rb")` (the member's exact bytes), `resolve()`, `name`,
`suffix`, `str()` = "<shard>#<member>". Every read checks the tar header just before the bytes (name and size), so a
row that does not match its shard is a recorded load failure, never another image's pixels.

The image root holds `store.json`: each shard's size, mtime_ns, sha256 and sample count (plus `wids_version` and
`shardlist`, so `wids.ShardListDataset` reads the folder as is), and `<shard stem>.index.json` per shard (its members
and their offsets). A run's key comes from the shards' recorded digests (`shard_identities`): a shard whose bytes
changed (size, or sha256 in content mode, or an mtime change whose re-hash differs) is one `ShardError` naming it.

Nothing is ever extracted: member names are dictionary keys, never paths; `scan_tar` reads a tar's headers (foreign
shards, `pack_shards.py --verify`) and refuses links, devices, sparse members, names that would leave a folder and
sizes past the end of the file. Format and measurements: docs/shards.md.
"""
from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import stat as stat_module
import tarfile
import threading
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

from pipelines.errors import UserInputError
from pipelines.schema import inside_folder

log = logging.getLogger(__name__)

STORE_FILE = "store.json"
STORE_FORMAT = "oodforge-shards-v1"
INDEX_SUFFIX = ".index.json"
ROW_FIELDS = ("shard_file", "shard_member", "shard_offset", "shard_bytes")
"""The fields a shard manifest's rows add to the schema's (reserved: a source row may not carry them)."""
MAX_MEMBER_BYTES = 1 << 30  # a row or header declaring a larger image member is refused before any byte is read
OPEN_SHARDS = 64  # open shard file handles kept per process (least recently used closed first)
BLOCK = 512
_CHUNK = 1 << 24
DOC = "docs/shards.md"


class ShardError(UserInputError):
    """A shard that is missing, truncated, changed since it was indexed, or not a safe tar; names the file."""

    doc = DOC


def index_path(shard: str | os.PathLike) -> Path:
    """`<folder>/<stem>.index.json` for `<folder>/<stem>.tar`."""
    shard = Path(shard)
    return shard.with_name(shard.name.removesuffix(".tar") + INDEX_SUFFIX)


def is_shard_row(row: dict[str, Any]) -> bool:
    return row.get("shard_file") is not None


# -- reading members --------------------------------------------------------------------------------------------------
class _Handles:
    """Per-process LRU of read-only file descriptors, reopened after a fork (DataLoader workers) and read with pread,
    which moves no shared file position (threads may read one shard at once)."""

    def __init__(self, size: int = OPEN_SHARDS):
        self.size, self.pid, self.lock = size, os.getpid(), threading.Lock()
        self.fds: OrderedDict[str, int] = OrderedDict()

    def fd(self, path: str) -> int:
        with self.lock:
            if self.pid != os.getpid():  # a forked child: the parent's descriptors are not ours to close or share
                self.fds, self.pid = OrderedDict(), os.getpid()
            fd = self.fds.get(path)
            if fd is not None:
                self.fds.move_to_end(path)
                return fd
            fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
            if not stat_module.S_ISREG(os.fstat(fd).st_mode):
                os.close(fd)
                raise OSError(f"{path}: not a regular file")
            self.fds[path] = fd
            while len(self.fds) > self.size:
                os.close(self.fds.popitem(last=False)[1])
            return fd

    def drop(self, path: str) -> None:
        with self.lock:
            fd = self.fds.pop(path, None)
            if fd is not None and self.pid == os.getpid():
                os.close(fd)


_HANDLES = _Handles()
_ROOT = Path()


def _header_fields(block: bytes) -> tuple[str, int, bytes]:
    """(name, size, type flag) of a ustar header block (the short name field; pack_shards writes no long names)."""
    name = block[0:100].split(b"\0", 1)[0].decode("utf-8", "replace")
    prefix = block[345:500].split(b"\0", 1)[0].decode("utf-8", "replace") if block[257:262] == b"ustar" else ""
    raw = block[124:136]
    if raw and raw[0] & 0x80:  # base-256 (GNU) size
        size = int.from_bytes(raw[1:], "big")
    else:
        text = raw.split(b"\0", 1)[0].strip(b" \0")
        size = int(text, 8) if text else -1
    return (f"{prefix}/{name}" if prefix else name), size, block[156:157]


def read_member(shard: str | os.PathLike, member: str, offset: int, size: int) -> bytes:
    """The `size` bytes of `member` at `offset` in `shard`, after checking the tar header just before them names
    `member` with that size; any mismatch (a repacked or foreign shard) is an OSError naming the shard and member."""
    where = f"{shard}#{member}"
    if not (isinstance(offset, int) and isinstance(size, int)) or offset < BLOCK or size < 0 or offset % BLOCK:
        raise OSError(f"{where}: invalid member position (offset {offset!r}, {size!r} bytes)")
    if size > MAX_MEMBER_BYTES:
        raise OSError(f"{where}: declares {size} bytes, over the {MAX_MEMBER_BYTES} byte limit of an image member")
    path = os.fspath(shard)
    for attempt in (0, 1):
        fd = _HANDLES.fd(path)
        try:
            if offset + size > os.fstat(fd).st_size:
                raise OSError(f"{where}: the shard ends before the member's {size} bytes at offset {offset} "
                              "(truncated since it was indexed)")
            header = os.pread(fd, BLOCK, offset - BLOCK)  # two reads: no copy of the member's bytes
            data = os.pread(fd, size, offset)
            break
        except OSError as err:
            if err.errno is None or attempt:  # our own message, or a second failure
                raise
            _HANDLES.drop(path)  # a descriptor closed under us (LRU in another thread): reopen once
    name, declared, kind = _header_fields(header)
    long_name = len(member.encode("utf-8")) > 100  # PAX / GNU long names: the header holds a cut copy
    if (name != member and not long_name) or declared != size or kind not in (b"0", b"\0", b"7"):
        raise OSError(f"{where}: the tar header at offset {offset - BLOCK} names {name!r} ({declared} bytes), not this "
                      "member: the shard changed since the manifest was written (re-pack it)")
    if len(data) != size:
        raise OSError(f"{where}: the shard ends inside the member (truncated since it was indexed)")
    return data


class _StatResult:
    """What `MemberPath.stat()` returns: os.stat_result's fields a reader uses (a regular file of the member's size,
    the shard's times)."""

    __slots__ = ("st_size", "st_mtime_ns", "st_mtime", "st_mode", "st_ino", "st_dev")

    def __init__(self, size: int, shard: os.stat_result):
        self.st_size, self.st_mtime_ns, self.st_mtime = size, shard.st_mtime_ns, shard.st_mtime
        self.st_mode, self.st_ino, self.st_dev = stat_module.S_IFREG | 0o444, shard.st_ino, shard.st_dev


class MemberPath:
    """One image member of a shard, with the `pathlib.Path` surface the loaders use (never a filesystem path)."""

    __slots__ = ("shard", "member", "offset", "size")

    def __init__(self, shard: str | os.PathLike, member: str, offset: int, size: int):
        self.shard = shard if type(shard) is type(_ROOT) else Path(shard)
        self.member, self.offset, self.size = member, offset, size

    @property
    def name(self) -> str:
        return PurePosixPath(self.member).name

    @property
    def suffix(self) -> str:
        return PurePosixPath(self.member).suffix

    def __str__(self) -> str:
        return f"{self.shard}#{self.member}"

    def __repr__(self) -> str:
        return f"MemberPath({str(self.shard)!r}, {self.member!r}, offset={self.offset}, size={self.size})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, MemberPath) and (self.shard, self.member) == (other.shard, other.member)

    def __hash__(self) -> int:
        return hash((self.shard, self.member))

    def __reduce__(self) -> tuple[Any, ...]:
        return MemberPath, (self.shard, self.member, self.offset, self.size)

    def resolve(self) -> MemberPath:
        """The member of the shard's resolved path (resolved once per shard and process)."""
        shard = _RESOLVED.get(self.shard)
        if shard is None:
            shard = _RESOLVED.setdefault(self.shard, self.shard.resolve())
        return MemberPath(shard, self.member, self.offset, self.size)

    def is_file(self) -> bool:
        """The shard is a regular file long enough to hold the member (the header is checked when it is read)."""
        try:
            st = os.stat(self.shard)
        except (OSError, ValueError):
            return False
        return stat_module.S_ISREG(st.st_mode) and self.offset + self.size <= st.st_size

    exists = is_file

    def stat(self) -> _StatResult:
        return _StatResult(self.size, os.stat(self.shard))

    def read_bytes(self) -> bytes:
        return read_member(self.shard, self.member, self.offset, self.size)

    def open(self, mode: str = "rb") -> io.BytesIO:
        """A seekable file object of exactly the member's bytes."""
        if mode != "rb":
            raise ValueError(f"{self}: shard members open read-only in binary ('rb'), not {mode!r}")
        return io.BytesIO(self.read_bytes())

    def identity(self, mode: str) -> Any:
        """What `pipelines.fingerprint.file_identity` records: the member bytes' sha256 (`content`), else
        (size, the shard's mtime_ns, offset); None when it cannot be read."""
        try:
            if mode == "content":
                return hashlib.sha256(self.read_bytes()).hexdigest()
            return [self.size, os.stat(self.shard).st_mtime_ns, self.offset]
        except OSError:
            return None


_SAFE_SHARDS: dict[str, bool] = {}
_RESOLVED: dict[Path, Path] = {}
_JOINED: dict[tuple[Path, str], Path] = {}  # (image root, shard name) -> the shard's path, built once


def member_path(root: Path, row: dict[str, Any]) -> MemberPath:
    """The `MemberPath` of a shard row under `root`; a shard name that would leave `root` (absolute, `..`) or that
    `root/store.json` does not record, or a malformed member position, is a `ShardError` naming the row's file_name
    (every reader of a shard row comes through here)."""
    shard, member = row["shard_file"], row.get("shard_member")
    ok = _SAFE_SHARDS.get(shard) if isinstance(shard, str) else False
    if ok is None:
        ok = _SAFE_SHARDS.setdefault(shard, inside_folder(shard) and "\0" not in shard and shard.endswith(".tar"))
    offset, size = row.get("shard_offset"), row.get("shard_bytes")
    if not ok or not isinstance(member, str) or type(offset) is not int or type(size) is not int:
        raise ShardError(f"{row.get('file_name')!r}: invalid shard reference (shard_file {shard!r}, shard_member "
                         f"{member!r}, shard_offset {offset!r}, shard_bytes {size!r}): a shard inside the image root "
                         "and the member's position are needed")
    joined = _JOINED.get((root, shard))
    if joined is None:
        if shard not in _recorded(root):
            raise ShardError(f"{row.get('file_name')!r}: shard_file {shard!r} is not in {root / STORE_FILE} (the row "
                             "points into a shard the store never recorded)")
        joined = _JOINED.setdefault((root, shard), root / shard)
    return MemberPath(joined, member, offset, size)


_RECORDED: dict[tuple[Path, int, int], frozenset[str]] = {}


def _recorded(root: Path) -> frozenset[str]:
    """The shard names `root/store.json` records (read once per state of the file and process)."""
    try:
        st = os.stat(root / STORE_FILE)
    except OSError:
        st = None
    key = (root, st.st_mtime_ns, st.st_size) if st is not None else (root, -1, -1)
    names = _RECORDED.get(key)
    if names is None:
        names = _RECORDED.setdefault(key, frozenset(read_store(root)))
    return names


def image_path(text: str | os.PathLike) -> Path | MemberPath:
    """A path as `str(Manifest.path(row))` wrote it back into a path object: a file path, or "<shard>.tar#<member>"
    (found in the shard's index) when no file of that name exists."""
    path = Path(text)
    shard, sep, member = str(text).rpartition(".tar#")
    if not sep or path.exists():
        return path
    shard_file = Path(shard + ".tar")
    entry = read_index(shard_file).get("members", {}).get(member) if shard_file.is_file() else None
    if entry is None:
        return path
    return MemberPath(shard_file, member, int(entry[0]), int(entry[1]))


# -- shard records and a run's key
# --------------------------------------------------------------------------------------
@dataclass(frozen=True)
class ShardRecord:
    """What the store recorded of one shard when it was written."""

    name: str
    size: int
    mtime_ns: int
    sha256: str
    samples: int

    def entry(self) -> dict[str, Any]:
        return {"url": self.name, "nsamples": self.samples, "filesize": self.size, "mtime_ns": self.mtime_ns,
                "sha256": self.sha256}


def read_index(shard: str | os.PathLike) -> dict[str, Any]:
    """A shard's `<stem>.index.json` ({} when absent); a malformed one is a ShardError naming it."""
    path = index_path(shard)
    if not path.is_file():
        return {}
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        raise ShardError(f"{path}: unreadable shard index ({err})") from None
    if not isinstance(index, dict) or not isinstance(index.get("members"), dict):
        raise ShardError(f"{path}: not a shard index (no 'members' mapping)")
    return index


def read_store(root: str | os.PathLike) -> dict[str, ShardRecord]:
    """The shard records of `root/store.json` by shard name; a missing or malformed file is a ShardError."""
    path = Path(root) / STORE_FILE
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
        records = {}
        for entry in raw["shardlist"]:
            record = ShardRecord(entry["url"], int(entry["filesize"]), int(entry["mtime_ns"]), str(entry["sha256"]),
                                 int(entry["nsamples"]))
            records[record.name] = record
        return records
    except FileNotFoundError:
        raise ShardError(f"{path}: no shard store index here (rows name shards under {root}; pack them with "
                         "oodforge pack-shards)") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, ValueError) as err:
        raise ShardError(f"{path}: malformed shard store index ({type(err).__name__}: {err})") from None


def store_document(records: Iterable[ShardRecord], **settings: Any) -> dict[str, Any]:
    """The `store.json` content: the format, the packing settings, the shard list (wids' descriptor keys)."""
    return {"format": STORE_FORMAT, "wids_version": 1, **settings,
            "shardlist": [r.entry() for r in sorted(records, key=lambda r: r.name)]}


def file_sha256(path: str | os.PathLike) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(_CHUNK):
            h.update(block)
    return h.hexdigest()


_VERIFIED: dict[tuple[Any, ...], str] = {}  # a shard file's state and the mode -> its checked sha256, per process


def check_shard(path: Path, record: ShardRecord, mode: str) -> str:
    """The shard's sha256 once its file matches its record: `stat` mode compares size and mtime (an mtime-only
    change, a copy, is re-hashed and accepted when the bytes are the same), `content` mode re-hashes. Raises
    ShardError naming the shard when it is missing, truncated or changed."""
    try:
        st = os.stat(path)
    except OSError as err:
        raise ShardError(f"{path}: shard missing ({err.strerror}); the manifest's rows point into it") from None
    if not stat_module.S_ISREG(st.st_mode):
        raise ShardError(f"{path}: not a regular file")
    if st.st_size != record.size:
        what = "truncated" if st.st_size < record.size else "grown"
        raise ShardError(f"{path}: {st.st_size} bytes, the store recorded {record.size} ({what} since it was packed); "
                         "re-pack it (oodforge pack-shards) or restore the file")
    key = (str(path), st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, mode)  # ctime: no utime hides a write
    if key in _VERIFIED:
        return _VERIFIED[key]
    if mode == "stat" and st.st_mtime_ns == record.mtime_ns:
        _VERIFIED[key] = record.sha256
        return record.sha256
    digest = file_sha256(path)
    if digest != record.sha256:
        raise ShardError(f"{path}: its sha256 is not the one the store recorded (the shard's bytes changed since it "
                         "was packed); re-pack it (oodforge pack-shards) or restore the file")
    if mode == "stat":
        log.info("%s: modified time changed (a copy?) but the bytes are the ones recorded", path)
    _VERIFIED[key] = digest
    return digest


def shard_identities(root: Path, shards: Iterable[str], mode: str) -> list[list[str]]:
    """[shard name, recorded sha256] of each shard named, sorted, each checked against its file (`check_shard`)."""
    records = read_store(root)
    found = []
    for name in sorted(set(shards)):
        record = records.get(name)
        if record is None:
            raise ShardError(f"{root / name}: not in {root / STORE_FILE} (rows point into a shard the store never "
                             "recorded); re-pack the manifest")
        found.append([name, check_shard(root / name, record, mode)])
    return found


def store_members(root: str | os.PathLike, mode: str = "stat") -> dict[str, MemberPath]:
    """file_name -> its member in the store `root` (`store.json` and the shards' indexes; a later shard's member wins),
    each shard checked against its record first (`check_shard`: a missing, truncated or changed shard is one
    ShardError naming it). A folder without `store.json` holds no members ({})."""
    root = Path(root)
    if not (root / STORE_FILE).is_file():
        return {}
    members: dict[str, MemberPath] = {}
    for name, record in sorted(read_store(root).items()):
        path = root / name
        check_shard(path, record, mode)
        index = read_index(path)
        if not index:
            raise ShardError(f"{index_path(path)}: missing; {root / STORE_FILE} lists its shard (restore it, or "
                             "re-verify the store with scripts/pack_shards.py --verify)")
        for member, entry in index["members"].items():
            members[entry[2]] = MemberPath(path, member, int(entry[0]), int(entry[1]))
    return members


def missing_members(root: Path, rows: list[dict[str, Any]]) -> Iterator[tuple[int, str]]:
    """(row position, reason) of each shard row whose shard is missing, changed in size, or too short to hold the
    member, by one stat per shard (the headers are checked when a member is read, and by `verify_shard`)."""
    sizes: dict[str, int | None] = {}
    records: dict[str, ShardRecord] | None = None
    for pos, row in enumerate(rows):
        if not is_shard_row(row):
            continue
        path = member_path(root, row)
        name = row["shard_file"]
        if name not in sizes:
            try:
                st = os.stat(path.shard)
                sizes[name] = st.st_size if stat_module.S_ISREG(st.st_mode) else None
            except OSError:
                sizes[name] = None
            if sizes[name] is not None:
                records = read_store(root) if records is None else records
                record = records.get(name)
                if record is None or record.size != sizes[name]:
                    raise ShardError(f"{path.shard}: " + ("not in the store's index" if record is None else
                                     f"{sizes[name]} bytes, the store recorded {record.size} (truncated or rewritten)"))
        size = sizes[name]
        if size is None:
            yield pos, f"shard not found: {path.shard}"
        elif path.offset + path.size > size:
            yield pos, f"member {path.member} lies past the end of {path.shard}"


def row_problems(root: Path, rows: Iterable[dict[str, Any]], where: Iterable[str]) -> Iterator[str]:
    """One line for each shard row that does not point at a member the store `root` recorded (`where[i]` names row i,
    e.g. its manifest line): a shard outside the root or not in `store.json`, a malformed position (`member_path`), a
    member absent from its shard's index or recorded at another offset or size."""
    indexes: dict[str, dict[str, Any]] = {}
    for row, name in zip(rows, where):
        if not is_shard_row(row):
            continue
        try:
            path = member_path(root, row)
        except ShardError as err:
            yield f"{name}: {err}"
            continue
        shard = row["shard_file"]
        if shard not in indexes:
            indexes[shard] = read_index(path.shard).get("members", {})
        entry = indexes[shard].get(path.member)
        if entry is None:
            yield f"{name}: shard_member {path.member!r} is not in the index of {shard}"
        elif list(entry[:2]) != [path.offset, path.size]:
            yield (f"{name}: {path.member!r} is at offset {path.offset} ({path.size} bytes) in the row, at {entry[0]} "
                   f"({entry[1]} bytes) in the index of {shard}")


# -- scanning tars safely ---------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class TarMember:
    name: str
    offset: int  # of the data
    size: int


def safe_member_name(name: str) -> bool:
    """A member name usable as a key: relative, no `..` part, no backslash or NUL (we never extract, but a name is
    still refused if extracting it could leave the folder)."""
    return inside_folder(name) and "\\" not in name and "\0" not in name


def scan_tar(path: str | os.PathLike) -> list[TarMember]:
    """The regular members of a tar (names, data offsets, sizes), reading headers only. A symlink, hardlink, device,
    FIFO or sparse member, a name that leaves the folder, a repeated name, a size past the end of the file or a
    truncated or malformed archive is a ShardError naming the tar and the member. Directories are skipped."""
    path = Path(path)
    total = path.stat().st_size
    members: list[TarMember] = []
    seen: set[str] = set()
    try:
        with tarfile.open(path, mode="r:") as tar:
            for info in tar:
                if info.isdir():
                    continue
                if not info.isreg() or info.issparse():
                    kind = ("symlink" if info.issym() else "hardlink" if info.islnk() else "FIFO" if info.isfifo()
                            else "device" if info.isdev() else "sparse file" if info.issparse() else "type "
                            f"{info.type!r}")
                    raise ShardError(f"{path}: member {info.name!r} is a {kind}; shards hold regular files only")
                if not safe_member_name(info.name):
                    raise ShardError(f"{path}: member name {info.name!r} would leave the folder (absolute or '..'); "
                                     "refused")
                if info.size > MAX_MEMBER_BYTES or info.offset_data + info.size > total:
                    raise ShardError(f"{path}: member {info.name!r} declares {info.size} bytes at offset "
                                     f"{info.offset_data}, past the end of the {total}-byte file (truncated or "
                                     "hostile)")
                if info.name in seen:
                    raise ShardError(f"{path}: member {info.name!r} appears twice")
                seen.add(info.name)
                members.append(TarMember(info.name, info.offset_data, info.size))
    except tarfile.TarError as err:
        raise ShardError(f"{path}: not a readable tar ({err})") from None
    return members


def verify_shard(path: Path, record: ShardRecord | None = None) -> list[str]:
    """Problems of one shard against its index (and its store record): every indexed member present at its offset
    with its size, no member unindexed, the digest as recorded. An empty list means sound."""
    problems = []
    index = read_index(path)
    if not index:
        return [f"{index_path(path)}: no shard index"]
    if record is not None:
        try:
            check_shard(path, record, "content")
        except ShardError as err:
            return [str(err)]
    found = {m.name: m for m in scan_tar(path)}
    for name, entry in index["members"].items():
        member = found.get(name)
        if member is None:
            problems.append(f"{path}: member {name!r} is in the index but not in the tar")
        elif [member.offset, member.size] != list(entry[:2]):
            problems.append(f"{path}: member {name!r} is at offset {member.offset} ({member.size} bytes), the index "
                            f"says {entry[0]} ({entry[1]} bytes)")
    sidecars = {name.rsplit(".", 1)[0] + ".json" for name in index["members"]}  # each image's <key>.json
    extra = sorted(set(found) - set(index["members"]) - sidecars)
    if extra:
        problems.append(f"{path}: {len(extra)} member(s) not in the index (first: {extra[0]!r})")
    return problems
