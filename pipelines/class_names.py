"""`class_names.json`, the one schema of class names beside a manifest or a model folder, read and written here only.

    {"names": ["Actias luna", ...], "label_field": "species" | null, "levels": ["genus", ...]}

`names[i]` is the name of label i; `label_field` the row field the names came from (null: folder names or label
numbers); `levels` the extra label levels of a multi-granularity model. Without the file, names come from the ID
rows: `class_name`, else `species` (what `import_folder` and `make_splits` write on every row), else the label number.
A model folder without the file has its transformers `config.json` `id2label`.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pipelines.errors import UserInputError
from pipelines.io import atomic_write_json

CLASS_NAMES = "class_names.json"
NAME_FIELDS = ("class_name", "species")  # row fields that name a row's class, first found wins


@dataclass(frozen=True)
class ClassNames:
    """Index -> class name, the row field they came from and the extra label levels."""

    names: list[str]
    label_field: str | None = None
    levels: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"names": list(self.names), "label_field": self.label_field, "levels": list(self.levels)}


def read_class_names(folder: str | os.PathLike) -> ClassNames | None:
    """`folder/class_names.json`, None when there is none; a malformed file is one error naming it."""
    path = Path(folder) / CLASS_NAMES
    if not path.is_file():
        return None
    try:
        raw = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise UserInputError(f"{path}: not readable JSON ({err})") from None
    names = raw.get("names") if isinstance(raw, dict) else None
    if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
        raise UserInputError(f"{path}: expected {{\"names\": [strings], \"label_field\": ..., \"levels\": [...]}}")
    if len(set(names)) != len(names):
        raise UserInputError(f"{path}: a class name is given twice")
    return ClassNames(names, raw.get("label_field"), list(raw.get("levels") or []))


def write_class_names(folder: str | os.PathLike, names: ClassNames) -> Path:
    path = Path(folder) / CLASS_NAMES
    atomic_write_json(path, names.to_dict())
    return path


def names_from_rows(rows: Iterable[dict[str, Any]]) -> ClassNames:
    """Class names of the ID rows by label: their `class_name`, else `species`, else the label number. A label with
    two names is one error naming both."""
    rows = [r for r in rows if r.get("role", "id") == "id" and int(r["label"]) >= 0]
    if not rows:
        return ClassNames([])
    source = next((f for f in NAME_FIELDS if any(r.get(f) not in (None, "") for r in rows)), None)
    names: dict[int, str] = {}
    for row in rows:
        label = int(row["label"])
        value = row.get(source) if source else None
        name = str(value) if value not in (None, "") else str(label)
        if names.setdefault(label, name) != name:
            raise UserInputError(f"label {label} has two {source or 'names'}: {names[label]!r} and {name!r} "
                                 f"({row['file_name']})")
    return ClassNames([names.get(i, str(i)) for i in range(max(names) + 1)], source)


def model_class_names(folder: str | os.PathLike) -> ClassNames | None:
    """A model folder's class names: its `class_names.json`, else `config.json`'s `id2label`; None when neither."""
    saved = read_class_names(folder)
    if saved is not None:
        return saved
    path = Path(folder) / "config.json"
    if not path.is_file():
        return None
    id2label = json.loads(path.read_text(encoding="utf-8")).get("id2label") or {}
    return ClassNames([str(id2label[k]) for k in sorted(id2label, key=int)]) if id2label else None
