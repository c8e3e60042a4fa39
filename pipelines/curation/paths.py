"""Paths read from a table kept inside their root: a `file_name` is a relative path without a `..` part (the manifest
rule, `pipelines.schema.inside_folder`), and on disk it resolves, symlinks followed, to a regular file under the
root. Checked for millions of rows: the name rule column-wise, the disk with one `lstat` a file and one `realpath`
per folder (a symlinked file is resolved on its own)."""
from __future__ import annotations

import os
import stat
from pathlib import Path

import numpy as np
import pandas as pd

OUTSIDE = r"^/|(?:^|/)\.\.(?:/|$)|\x00"
"""A name that leaves its root (absolute, a `..` part) or cannot be a path (a NUL)."""


def blank_names(names: pd.Series) -> np.ndarray:
    """True where the file name is missing or empty."""
    text = names.astype("string")
    return (text.isna() | (text.str.strip() == "")).fillna(True).to_numpy(bool)


def leaving_names(names: pd.Series) -> np.ndarray:
    """True where a (non-blank) file name is absolute, has a `..` part or a NUL: it would lead outside its root."""
    return names.astype("string").str.contains(OUTSIDE, regex=True).fillna(False).to_numpy(bool)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def files_under(root: str | os.PathLike, names: list[str]) -> tuple[np.ndarray, int | None]:
    """(present, first escape): present[i] when `root/names[i]` is a regular file whose real path lies under the real
    root; the position of the first name that resolves outside it (through a symlinked folder or file), else None.
    Names must already pass `leaving_names`. Nothing but `lstat` / `stat` touches a file (a FIFO is never opened)."""
    real_root = os.path.realpath(root)
    folders: dict[str, str | None] = {}  # parent as written -> its real path (None: outside the root)
    present = np.zeros(len(names), dtype=bool)
    for i, name in enumerate(names):
        parent, _, base = name.rpartition("/")
        if parent not in folders:
            real = os.path.realpath(os.path.join(real_root, parent)) if parent else real_root
            folders[parent] = real if _inside(real, real_root) else None
        folder = folders[parent]
        if folder is None:
            return present, i
        try:
            info = os.lstat(os.path.join(folder, base))
            if stat.S_ISLNK(info.st_mode):
                target = os.path.realpath(os.path.join(folder, base))
                if not _inside(target, real_root):
                    return present, i
                info = os.stat(target)
        except (FileNotFoundError, NotADirectoryError):
            continue
        except OSError:  # a loop, a name too long, no permission: not an image we can read
            continue
        present[i] = stat.S_ISREG(info.st_mode)
    return present, None


def real_target(root: str | os.PathLike, name: str) -> Path:
    """Where `root/name` really leads (for the message that refuses it)."""
    return Path(os.path.realpath(os.path.join(root, name)))
