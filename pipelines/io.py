"""Atomic file writes: a temp file in the same folder, then `os.replace`, so readers never see partial files."""
from __future__ import annotations

import hashlib
import json
import os
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator


@contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temp path beside `path`; on success it is renamed onto `path`, on error removed."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp" + path.suffix, dir=path.parent)
    os.close(fd)
    tmp_path = Path(tmp)
    try:
        yield tmp_path
        os.replace(tmp_path, path)
    finally:
        if tmp_path.exists():
            tmp_path.unlink()


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
    formats = {".png": "PNG", ".jpg": "JPEG", ".jpeg": "JPEG", ".webp": "WEBP", ".bmp": "BMP", ".tif": "TIFF", ".tiff": "TIFF"}
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
