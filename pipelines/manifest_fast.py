"""A column-wise check that a list of manifest rows certainly passes `pipelines.data.validate_row` (and has unique
file names), for writing millions of rows. It is conservative: it may answer False for valid rows (e.g. int
subclasses, unusual paths); the caller then validates row by row, which names the line and field of any error."""
from __future__ import annotations

import math
from typing import Any

from pipelines.data import GROUPS, REQUIRED, ROLES, SPLITS


def _plain_relative(name: Any) -> bool:
    return (type(name) is str and name != "" and not name.startswith("/") and "\\" not in name
            and ".." not in name.split("/"))


def _finite_or_none(value: Any) -> bool:
    return value is None or (type(value) in (int, float) and math.isfinite(value))


def rows_certainly_valid(rows: list[Any]) -> bool:
    """True only when every row passes validate_row and no file_name repeats."""
    if any(type(row) is not dict for row in rows):
        return False
    try:
        columns = {key: [row[key] for row in rows] for key in REQUIRED}
    except KeyError:
        return False
    names, labels = columns["file_name"], columns["label"]
    try:
        if not (set(columns["split"]) <= set(SPLITS) and set(columns["role"]) <= set(ROLES)
                and set(columns["group"]) <= {None, *GROUPS}):
            return False
    except TypeError:  # unhashable values
        return False
    if not (all(map(_plain_relative, names)) and all(type(v) is int for v in labels) and len(set(names)) == len(names)):
        return False
    if not all((ood is None and label >= 0) if role == "id" else (type(ood) is str and ood != "" and label == -1)
               for role, ood, label in zip(columns["role"], columns["ood_set"], labels)):
        return False
    optional = [row for row in rows if len(row) > len(REQUIRED)]
    return all(_finite_or_none(row.get("lat")) and _finite_or_none(row.get("lon"))
               and ("provenance" not in row or type(row["provenance"]) is dict) for row in optional)
