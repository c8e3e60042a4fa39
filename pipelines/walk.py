"""Walks of folders that strangers fill: they end, stay inside the folder and open nothing but regular files.

`walk_files(folder, suffixes)` lists the files below `folder` whose names end in one of `suffixes`, in sorted order,
and names what it left out (`Skipped`):

- hidden (dot-named) files and folders (a hidden folder is not descended);
- symlinks: never followed. A dangling one (or one that loops onto itself) is named as dangling; one whose target
  lies outside the folder as leading out of it (it would read files the folder's owner did not put there: a link to
  /etc/passwd named cat.jpg); one whose target lies inside as an alias (the walk reaches the target on its own path,
  so following it would only list the same files twice, or forever for a link to a parent);
- a folder reached a second time (same device and inode: a bind mount of a parent), so no walk loops;
- FIFOs, sockets and devices: never opened (reading a FIFO named pipe.jpg blocks forever).

A folder or listed file whose name holds a control character (U+0000-U+001F, U+007F-U+009F), a line or paragraph
separator or bytes that are not UTF-8 is refused in one line (`UnsafeName`): folder names become class, species and
set names, and such a name either breaks the one-line outputs and CSV files it reaches or, normalised, merges with
another class (`Genus0 species0\\n` read as `Genus0 species0`); the user renames it.

`subfolders(top)` is the same rule for one level (class, species and set folders); `resolve_inside(root, name)` is
the rule for a path read from a table or list: resolved (symlinks included), it must lie under the resolved root.
"""
from __future__ import annotations

import os
import stat
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import UserInputError
from pipelines.io import file_kind

UNSAFE_CATEGORIES = frozenset({"Cc", "Zl", "Zp", "Cs"})  # control characters, line / paragraph separators, non-UTF-8
                                                         # bytes


class UnsafeName(UserInputError):
    """A folder or file name with a control character; names it (escaped) and asks for a rename."""


def unsafe_character(name: str) -> str | None:
    """The first character of `name` that must not be in a name (`U+000A`), None when there is none."""
    for char in name:
        if unicodedata.category(char) in UNSAFE_CATEGORIES:
            return f"U+{ord(char):04X}"
    return None


def check_name(name: str, where: str) -> None:
    """Raise `UnsafeName` when `name` holds a control character, naming `where` (the path, escaped)."""
    bad = unsafe_character(name)
    if bad is not None:
        kind = ("bytes that are not UTF-8" if bad.startswith("U+DC") and len(bad) == 6
                else f"a control character ({bad})")
        raise UnsafeName(f"{printable(where)}: the name holds {kind}; names become labels and lines of the outputs, "
                         "so rename it")


def printable(text: str) -> str:
    """`text` as is when it is safe to print on one line, else its escaped repr."""
    return text if unsafe_character(text) is None else ascii(text)


@dataclass
class Skipped:
    """What a folder walk left out, by reason (paths relative to the walk's base, folders ending in '/')."""

    hidden: list[str] = field(default_factory=list)
    dangling_links: list[str] = field(default_factory=list)
    links_out: list[str] = field(default_factory=list)
    links_inside: list[str] = field(default_factory=list)
    loops: list[str] = field(default_factory=list)
    not_regular: list[str] = field(default_factory=list)

    WORDS = {"hidden": "hidden (dot-named) entries", "dangling_links": "dangling symlink(s)",
             "links_out": "symlink(s) leading out of the folder", "links_inside": "symlink(s) to what the folder holds "
             "(not followed)", "loops": "folder(s) reached twice (a loop)",
             "not_regular": "FIFO(s), socket(s) or device(s) (not regular files)"}

    def add(self, other: Skipped) -> None:
        for name in self.WORDS:
            getattr(self, name).extend(getattr(other, name))

    def summary(self) -> dict[str, Any]:
        out: dict[str, Any] = {}
        for name in self.WORDS:
            values = getattr(self, name)
            out[name] = len(values)
            out["dangling_link_examples" if name == "dangling_links" else f"{name}_examples"] = values[:5]
        return out

    def line(self) -> str | None:
        """One line for the command's output, None when nothing was skipped."""
        parts = [f"{len(getattr(self, n))} {words}" for n, words in self.WORDS.items() if getattr(self, n)]
        if not parts:
            return None
        first = next(getattr(self, n)[0] for n in self.WORDS if getattr(self, n))
        listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
        return f"skipped {listed} (e.g. {printable(first)})"


def is_inside(path: str | os.PathLike, root: str | os.PathLike) -> bool:
    """True when `path`, resolved (every symlink followed), lies under `root` resolved."""
    real, base = os.path.realpath(path), os.path.realpath(root)
    return real == base or os.path.commonpath([real, base]) == base


def resolve_inside(root: str | os.PathLike, name: str) -> Path | None:
    """`root / name` when its resolved path lies under `root`'s resolved path (symlinks in it included), else None."""
    path = Path(root) / name
    return path if is_inside(path, root) else None


def _rel(path: Path, base: Path) -> str:
    return path.relative_to(base).as_posix()


def _link(path: Path, rel: str, boundary: str, skipped: Skipped, named: bool) -> None:
    """Name a symlink under its reason (never followed); `named`: also a live link (a folder or a wanted file)."""
    try:
        target = os.stat(path)
    except OSError:  # dangling, or a loop of links
        skipped.dangling_links.append(rel)
        return
    if not (named or stat.S_ISDIR(target.st_mode)):
        return
    inside = is_inside(path, boundary)
    (skipped.links_inside if inside else skipped.links_out).append(rel + ("/" if stat.S_ISDIR(target.st_mode) else ""))


def subfolders(top: str | os.PathLike, skipped: Skipped, relative_to: str | os.PathLike | None = None) -> list[Path]:
    """The visible real subfolders of `top`, sorted, names checked (`check_name`); hidden entries and symlinks (never
    followed) go to `skipped`, named relative to `relative_to` (default `top`)."""
    top = Path(top)
    base = Path(relative_to) if relative_to is not None else top
    boundary = os.path.realpath(top)
    folders = []
    with os.scandir(top) as entries:
        for entry in sorted(entries, key=lambda e: e.name):
            path = top / entry.name
            rel = _rel(path, base)
            if entry.name.startswith("."):
                skipped.hidden.append(rel + ("/" if entry.is_dir() else ""))
            elif entry.is_symlink():
                _link(path, rel, boundary, skipped, named=False)
            elif entry.is_dir(follow_symlinks=False):
                check_name(entry.name, str(path))
                folders.append(path)
    return folders


def walk_files(folder: str | os.PathLike, suffixes: Iterable[str],
               relative_to: str | os.PathLike | None = None) -> tuple[list[Path], Skipped]:
    """The regular files below `folder` (recursively, sorted) whose lower-cased suffix is one of `suffixes`, and what
    was left out (module docstring), named relative to `relative_to` (default `folder`)."""
    root = Path(folder)
    if not root.is_dir():
        raise FileNotFoundError(f"image folder not found: {root}")
    base = Path(relative_to) if relative_to is not None else root
    wanted = tuple(s.lower() for s in suffixes)
    boundary = os.path.realpath(root)
    start = os.stat(root)
    visited = {(start.st_dev, start.st_ino)}
    files, skipped, stack = [], Skipped(), [root]
    while stack:
        here = stack.pop()
        with os.scandir(here) as listing:
            entries = sorted(listing, key=lambda e: e.name)
        below = []
        for entry in entries:
            name = entry.name
            wanted_name = name.lower().endswith(wanted)
            if name.startswith("."):
                skipped.hidden.append(_rel(here / name, base) + ("/" if entry.is_dir() else ""))
                continue
            if entry.is_symlink():
                _link(here / name, _rel(here / name, base), boundary, skipped, named=wanted_name)
                continue
            info = entry.stat(follow_symlinks=False)
            if stat.S_ISDIR(info.st_mode):
                check_name(name, entry.path)
                key = (info.st_dev, info.st_ino)
                if key in visited:
                    skipped.loops.append(_rel(here / name, base) + "/")
                else:
                    visited.add(key)
                    below.append(here / name)
            elif stat.S_ISREG(info.st_mode):
                if wanted_name:
                    check_name(name, entry.path)
                    files.append(here / name)
            else:
                skipped.not_regular.append(f"{_rel(here / name, base)} ({file_kind(info.st_mode)})")
        stack.extend(reversed(below))
    return sorted(files), skipped
