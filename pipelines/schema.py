"""The manifest schema, defined once: the fields every `metadata.jsonl` row carries, their allowed values, and the
three checks built on them (one row, a list of rows column-wise, a pandas table column-wise).

The row check names the file, line and field of the first fault; the two column-wise checks are fast and conservative
(they may answer False for valid rows, e.g. int subclasses), so a writer that gets False validates row by row, which
names the line. Format: README.md, section 'Data formats'.
"""
from __future__ import annotations

import math
import os
from pathlib import PurePath
from typing import Any

from pipelines.errors import UserInputError

METADATA = "metadata.jsonl"
SPLITS = ("train", "val", "test")
ROLES = ("id", "ood")
GROUPS = ("hard", "easy", "near", "far")
REQUIRED = ("file_name", "split", "role", "ood_set", "group", "label")
COORDINATES = ("lat", "lon")
SCHEMA_DOC = "README.md, section 'Data formats'"


class ManifestError(UserInputError):
    """A manifest line that breaks the schema; names the file, the line and the field."""

    doc = SCHEMA_DOC

    def __init__(self, file: str | os.PathLike, line: int | None, field: str | None, message: str):
        self.file, self.line, self.field = str(file), line, field
        where = self.file + (f", line {line}" if line is not None else "") + (f", field '{field}'" if field else "")
        super().__init__(f"{where}: {message}")


def plain_relative(name: Any) -> bool:
    """The column-wise checks' stricter file_name rule: also no backslash (a subset of `inside_folder`)."""
    return (isinstance(name, str) and name != "" and not name.startswith("/") and "\\" not in name
            and ".." not in name.split("/"))


def inside_folder(name: Any) -> bool:
    """What `validate_row` accepts as a file_name: a non-empty path, not absolute, without a '..' part."""
    return (isinstance(name, str) and name != "" and not PurePath(name).is_absolute()
            and ".." not in PurePath(name).parts)


def _finite_or_none(value: Any) -> bool:
    return value is None or (isinstance(value, (int, float)) and math.isfinite(value))


def validate_row(row: Any, file: str | os.PathLike = METADATA, line: int | None = None) -> dict[str, Any]:
    """Check one manifest row against the schema and return it; raises `ManifestError` naming the field."""
    def fail(field: str | None, message: str) -> ManifestError:
        return ManifestError(file, line, field, message)

    if not isinstance(row, dict):
        raise fail(None, f"expected a JSON object, got {type(row).__name__}")
    for key in REQUIRED:
        if key not in row:
            raise fail(key, "missing required field")
    if not inside_folder(row["file_name"]):
        raise fail("file_name", f"must be a non-empty relative path inside the folder, got {row['file_name']!r}")
    for key, allowed in (("split", SPLITS), ("role", ROLES)):
        if row[key] not in allowed:
            raise fail(key, f"must be one of {allowed}, got {row[key]!r}")
    fault = _label_fault(row) or _optional_fault(row)
    if fault is not None:
        raise fail(*fault)
    return row


def _label_fault(row: dict[str, Any]) -> tuple[str, str] | None:
    """(field, message) of the first fault of the label and ood_set against the role; None when they agree."""
    label, ood_set = row["label"], row["ood_set"]
    if isinstance(label, bool) or not isinstance(label, int):
        return "label", f"must be an integer, got {label!r}"
    if row["role"] == "id" and ood_set is not None:
        return "ood_set", f"must be null for role 'id', got {ood_set!r}"
    if row["role"] == "id" and label < 0:
        return "label", f"ID rows need a class index >= 0, got {label}"
    if row["role"] == "ood" and (not isinstance(ood_set, str) or not ood_set):
        return "ood_set", f"OOD rows need a non-empty set name, got {ood_set!r}"
    if row["role"] == "ood" and label != -1:
        return "label", f"OOD rows have label -1, got {label}"
    return None


def _optional_fault(row: dict[str, Any]) -> tuple[str, str] | None:
    """(field, message) of the first fault of the group, coordinates and provenance; None when they are valid."""
    if row["group"] is not None and row["group"] not in GROUPS:
        return "group", f"must be one of {GROUPS} or null, got {row['group']!r}"
    for key in COORDINATES:
        if not _finite_or_none(row.get(key)):
            return key, f"must be a finite number or null, got {row[key]!r}"
    if "provenance" in row and not isinstance(row["provenance"], dict):
        return "provenance", "must be a JSON object"
    return None


def rows_certainly_valid(rows: list[Any]) -> bool:
    """True only when every row passes `validate_row` and no file_name repeats (checked column-wise, for millions of
    rows); False may also mean "cannot vouch" (unusual types), never "valid"."""
    if any(type(row) is not dict for row in rows):
        return False
    try:
        columns = {key: [row[key] for row in rows] for key in REQUIRED}
        if not (set(columns["split"]) <= set(SPLITS) and set(columns["role"]) <= set(ROLES)
                and set(columns["group"]) <= {None, *GROUPS}):
            return False
    except (KeyError, TypeError):  # a missing field, unhashable values
        return False
    names, labels = columns["file_name"], columns["label"]
    if not (all(type(n) is str and plain_relative(n) for n in names) and all(type(v) is int for v in labels)
            and len(set(names)) == len(names)):
        return False
    if not all((ood is None and label >= 0) if role == "id" else (type(ood) is str and ood != "" and label == -1)
               for role, ood, label in zip(columns["role"], columns["ood_set"], labels)):
        return False
    optional = [row for row in rows if len(row) > len(REQUIRED)]
    return all(all(type(row.get(k)) in (int, float, type(None)) and _finite_or_none(row.get(k)) for k in COORDINATES)
               and ("provenance" not in row or type(row["provenance"]) is dict) for row in optional)


def table_certainly_valid(table: Any) -> bool:
    """`rows_certainly_valid` for a pandas DataFrame with the REQUIRED columns (and optionally lat/lon), vectorised:
    True only when every row, as `json` would write it (NaN coordinates become null), passes `validate_row`."""
    import numpy as np
    import pandas as pd

    if not set(REQUIRED) <= set(table.columns):
        return False
    names, ood_set, label = table["file_name"], table["ood_set"], table["label"]
    if not (pd.api.types.is_integer_dtype(label) and pd.api.types.infer_dtype(names, skipna=False) == "string"):
        return False
    is_id = (table["role"] == "id").to_numpy()
    ood_names = ood_set[~is_id]
    coordinates = table[[c for c in COORDINATES if c in table.columns]].to_numpy(dtype=np.float64)
    return bool(table["split"].isin(SPLITS).all() and table["role"].isin(ROLES).all()
                and (table["group"].isna() | table["group"].isin(GROUPS)).all()
                and not names.duplicated().any() and (names.str.len() > 0).all()
                and not names.str.contains(r"^/|\\|(?:^|/)\.\.(?:/|$)", regex=True).any()
                and ood_set[is_id].isna().all() and (label[is_id] >= 0).all()
                and (ood_names.empty or (pd.api.types.infer_dtype(ood_names, skipna=False) == "string"
                                         and (ood_names.str.len() > 0).all()))
                and (label[~is_id] == -1).all() and not np.isinf(coordinates).any())
