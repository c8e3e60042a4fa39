"""Atomic file writes: a temp file in the same folder, then `os.replace`, so readers never see partial files.

A temp file is named `.<name>.<random>.<host>-<pid>.tmp<suffix>` (host: 8 hex digits of the host name's hash; a long
name or suffix cut, so the temp name fits where the name does) and created with mode 0666 minus the process umask, as
`open` would (0644 under umask 022), so other accounts can read what a run wrote; the mode is set again just before the
rename, because a library that writes the temp path its own way (safetensors' writer replaces it with a 0600 file) would
otherwise decide it. `umask_modes` does the same for the files a library's `save_pretrained` writes into a folder.
`remove_orphan_temps` deletes the temp files a killed writer left behind, and only those. `open_regular` is how a reader
opens a file from strangers: a FIFO, socket or device is refused without blocking on it.
"""
from __future__ import annotations

import errno
import functools
import hashlib
import json
import os
import re
import secrets
import socket
import stat
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

TEMP_PATTERN = re.compile(r"^\.[^/]+\.[^./]+\.tmp(\.[^./]*)?$")  # what atomic_path names its temp files (and did before
                                                                 # owners)
_OWNER = re.compile(r"\.(?P<host>[0-9a-f]{8})-(?P<pid>\d+)\.tmp(\.[^./]*)?$")
FOREIGN_TEMP_SECONDS = 24 * 3600  # a temp of another host's writer is taken for an orphan after this long


@functools.lru_cache(maxsize=1)
def _host() -> str:
    return hashlib.sha256(socket.gethostname().encode()).hexdigest()[:8]


_UMASK_LOCK = threading.Lock()


def current_umask() -> int:
    """The process's umask, read without changing it where Linux shows it (`/proc/self/status`), else set and restored
    under a lock."""
    try:
        with open("/proc/self/status", encoding="ascii", errors="replace") as fh:
            for line in fh:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError, IndexError):
        pass
    with _UMASK_LOCK:
        mask = os.umask(0o022)
        os.umask(mask)
    return mask


def file_mode() -> int:
    """The mode `open` gives a new file: 0666 minus the umask (0644 under umask 022)."""
    return 0o666 & ~current_umask()


def keep_umask(path: str | os.PathLike) -> None:
    """Give a regular file (never a symlink's target) the mode `open` would have: 0666 minus the umask."""
    info = os.lstat(path)
    if stat.S_ISREG(info.st_mode) and stat.S_IMODE(info.st_mode) != file_mode():
        os.chmod(path, file_mode())


def _file_states(folder: Path) -> dict[str, tuple[int, int, int]]:
    """{relative path: (inode, size, mtime_ns)} of the regular files below `folder` (symlinks not followed)."""
    states = {}
    for top, _dirs, files in os.walk(folder):
        for name in files:
            info = os.lstat(os.path.join(top, name))
            if stat.S_ISREG(info.st_mode):
                states[os.path.relpath(os.path.join(top, name), folder)] = (info.st_ino, info.st_size, info.st_mtime_ns)
    return states


@contextmanager
def umask_modes(folder: str | os.PathLike) -> Iterator[Path]:
    """Around a library's own writer (transformers' and diffusers' `save_pretrained`, safetensors' `save_file`, which
    create files 0600): every file created or rewritten below `folder` in the block gets 0666 minus the umask, as the
    project's own writes do; files the block did not touch keep their mode."""
    folder = Path(folder)
    before = _file_states(folder) if folder.is_dir() else {}
    try:
        yield folder
    finally:
        if folder.is_dir():
            for name, state in _file_states(folder).items():
                if before.get(name) != state:
                    keep_umask(folder / name)


class NotRegularFile(OSError):
    """A path that is a FIFO, socket, device or folder where a file was expected; never opened for reading."""


def check_regular(path: str | os.PathLike, mode: int | None = None) -> None:
    """Raise `NotRegularFile` unless `path` (its target, for a symlink) is a regular file; FileNotFoundError when it
    does not exist. `mode`: an `st_mode` already read."""
    mode = os.stat(path).st_mode if mode is None else mode
    if not stat.S_ISREG(mode):
        raise NotRegularFile(errno.EINVAL, f"not a regular file ({file_kind(mode)})", os.fspath(path))


def open_regular(path: str | os.PathLike) -> Any:
    """Open a file for binary reading only when it is a regular file (a symlink's target counts): a FIFO, socket or
    device raises `NotRegularFile` at once, without being opened; the open itself is non-blocking and checked again
    with fstat, so a file swapped for a FIFO in between cannot block the reader either."""
    check_regular(path)  # devices are not even opened (opening some has effects)
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0) | getattr(os, "O_CLOEXEC", 0))
    try:
        check_regular(path, os.fstat(fd).st_mode)  # the same file still: swapped for a FIFO in between, refused
        os.set_blocking(fd, True)
        return os.fdopen(fd, "rb")
    except BaseException:
        os.close(fd)
        raise


def file_kind(mode: int) -> str:
    """What a stat mode is, in words: regular file, folder, FIFO, socket, character device, block device, symlink."""
    kinds = ((stat.S_ISREG, "regular file"), (stat.S_ISDIR, "folder"), (stat.S_ISFIFO, "FIFO"),
             (stat.S_ISSOCK, "socket"), (stat.S_ISCHR, "character device"), (stat.S_ISBLK, "block device"),
             (stat.S_ISLNK, "symlink"))
    return next((word for test, word in kinds if test(mode)), "special file")


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path` (created empty, umask honoured); on success it is renamed onto `path`, on error
    removed. A system error (a full disk) is an OSError naming `path`, also when the writer raised its own exception
    type for it (`os_error_code`)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    name, suffix = _temp_parts(path)
    while True:
        tmp_path = path.parent / f".{name}.{secrets.token_hex(4)}.{_host()}-{os.getpid()}.tmp{suffix}"
        try:
            os.close(os.open(tmp_path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666))
            break
        except FileExistsError:
            continue
        except OSError as err:
            err.filename = os.fspath(path)
            raise
    try:
        yield tmp_path
        keep_umask(tmp_path)  # a library may have replaced the temp file with one of its own mode
        os.replace(tmp_path, path)
    except OSError as err:  # a full disk or a refused write names the file being written, not its temp file
        if err.filename is None or os.fspath(err.filename) == os.fspath(tmp_path):
            err.filename, err.filename2 = os.fspath(path), None
        raise
    except Exception as err:  # a writer in Rust (safetensors) words the system's error in its own exception
        code = os_error_code(err)
        if code is None:
            raise
        raise OSError(code, os.strerror(code), os.fspath(path)) from err
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


_RUST_OS_ERROR = re.compile(r"\(os error (\d+)\)|Os \{ code: (\d+)")


def os_error_code(err: BaseException) -> int | None:
    """The system error number a library's own exception carries in its text (safetensors' `SafetensorError: Error
    while serializing: I/O error: No space left on device (os error 28)`), None when it carries none."""
    found = _RUST_OS_ERROR.search(str(err))
    return int(found[1] or found[2]) if found else None


def _temp_parts(path: Path) -> tuple[str, str]:
    """The name and suffix a temp file of `path` carries: cut when long, so that the temp name (about 30 bytes more)
    fits the file system's 255 bytes wherever `path`'s name does."""
    name, suffix = path.name, path.suffix
    if len(os.fsencode(name)) > 120:
        name = name[:30]  # at most 120 bytes in UTF-8
    return name, suffix if len(os.fsencode(suffix)) <= 16 else ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # another account's live process
        return True
    return True


def is_orphan_temp(path: Path) -> bool:
    """True for a temp file of `atomic_path` whose writer is gone: its process has exited on this host, its writer
    is not recorded (older names), or it belongs to another host and is older than `FOREIGN_TEMP_SECONDS`."""
    if not TEMP_PATTERN.match(path.name):
        return False
    owner = _OWNER.search(path.name)
    if owner is None:
        return True
    if owner["host"] == _host():
        return not _alive(int(owner["pid"]))
    try:
        return time.time() - path.stat().st_mtime > FOREIGN_TEMP_SECONDS
    except OSError:
        return False


def remove_orphan_temps(folder: str | os.PathLike, recursive: bool = True) -> int:
    """Delete the orphaned temp files (`is_orphan_temp`) in `folder` (and below it); returns how many. A temp file of
    a writer still running (another process on the same output) is left alone; nothing else is touched."""
    root = Path(folder)
    if not root.is_dir():
        return 0
    removed = 0
    for path in (root.rglob(".*.tmp*") if recursive else root.glob(".*.tmp*")):
        if path.is_file() and not path.is_symlink() and is_orphan_temp(path):
            path.unlink(missing_ok=True)
            removed += 1
    return removed


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write bytes atomically."""
    with atomic_path(path) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write UTF-8 text atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write JSON (indented, keys in insertion order) atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, default=str) + "\n")


def atomic_save_image(path: str | os.PathLike, image: Any, **save_kwargs: Any) -> None:
    """Save a PIL image atomically; the format follows `path`'s suffix."""
    path = Path(path)
    with atomic_path(path) as tmp:
        image.save(tmp, format=_pil_format(path.suffix), **save_kwargs)


def _pil_format(suffix: str) -> str:
    formats = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP", ".tif": "TIFF",
               ".tiff": "TIFF"}
    try:
        return formats[suffix.lower()]
    except KeyError:
        raise ValueError(f"unsupported image suffix {suffix!r}; use one of {sorted(formats)}") from None


def safe_name(name: Any) -> str:
    """A name from a manifest or a config as one harmless path component: only letters, digits and `-_.+`, never
    starting with a dot; a changed name gains a short hash so that 'a/b' and 'a_b' stay apart."""
    text = str(name)
    safe = "".join(c if c.isalnum() or c in "-_.+" else "_" for c in text)
    if safe.startswith("."):
        safe = "_" + safe.lstrip(".")
    if safe != text or not safe:
        safe = f"{safe[:80]}-{hashlib.sha256(text.encode()).hexdigest()[:8]}"
    return safe
