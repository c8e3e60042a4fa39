"""Per-detector persistence of the runner: one unit per detector spec, written atomically as it finishes.

`out/units/<method>/` holds `rows.csv` (its results-table rows), `scores.parquet` (its per-sample scores),
`validation.json` (its value on ID val against OOD val, for rule selection) and, written last, `unit.json` (the unit's
key, the parts the key was computed from, and its status). A rerun of the same config finds `unit.json` with the same
key and skips the unit; a changed key (other parameters, features or data) redoes it. A unit that raised is recorded in
`out/units/<method>/failure.json` with its traceback in `traceback.txt`, and the runner goes on.
"""
from __future__ import annotations

import json
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from detectors.harness.plan import safe_name
from detectors.harness.results import RESULT_TEXT
from pipelines.io import atomic_path, atomic_write_json, atomic_write_text

UNIT_VERSION = 2


@dataclass
class UnitResult:
    """What a finished unit wrote: its result rows, per-sample scores and validation records (rule selection); a unit
    run in this process also hands out the training model its rule units re-score (`trained`, never written)."""

    rows: pd.DataFrame
    scores: pd.DataFrame
    validation: list[dict[str, Any]] | None = None
    trained: Any = field(default=None, repr=False, compare=False)


class UnitStore:
    """The `units/` folder of a run."""

    def __init__(self, out: str | Path):
        self.root = Path(out) / "units"

    def folder(self, unit: str) -> Path:
        return self.root / safe_name(unit)

    def finished(self, unit: str, key: str) -> UnitResult | None:
        """The stored result when the unit finished with this key, else None."""
        folder = self.folder(unit)
        try:
            meta = json.loads((folder / "unit.json").read_text())
        except (OSError, json.JSONDecodeError):
            return None
        if meta.get("key") != key or meta.get("version") != UNIT_VERSION or meta.get("status") != "done":
            return None
        try:
            validation = (json.loads((folder / "validation.json").read_text())
                          if (folder / "validation.json").is_file() else None)
            return UnitResult(pd.read_csv(folder / "rows.csv", keep_default_na=False, na_values=[""],
                                          dtype=dict.fromkeys((*RESULT_TEXT, "params"), str)),
                              pd.read_parquet(folder / "scores.parquet"), validation)
        except (OSError, ValueError):
            return None

    def write(self, unit: str, key: str, result: UnitResult, info: dict[str, Any] | None = None) -> None:
        """Write rows and scores, then `unit.json` last (its presence means the unit is complete)."""
        folder = self.folder(unit)
        folder.mkdir(parents=True, exist_ok=True)
        with atomic_path(folder / "rows.csv") as tmp:
            result.rows.to_csv(tmp, index=False)
        with atomic_path(folder / "scores.parquet") as tmp:
            result.scores.to_parquet(tmp, index=False)
        if result.validation is not None:
            atomic_write_json(folder / "validation.json", result.validation)
        for stale in ("failure.json", "traceback.txt",
                      *(() if result.validation is not None else ("validation.json",))):
            (folder / stale).unlink(missing_ok=True)
        atomic_write_json(folder / "unit.json", {"version": UNIT_VERSION, "key": key, "status": "done", **(info or {})})

    def fail(self, unit: str, key: str, error: BaseException) -> dict[str, Any]:
        """Record a failed unit (exception and traceback file); returns the failure record for failures.json."""
        folder = self.folder(unit)
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "unit.json").unlink(missing_ok=True)
        trace = folder / "traceback.txt"
        atomic_write_text(trace, "".join(traceback.format_exception(type(error), error, error.__traceback__)))
        record = {"detector": unit, "exception": f"{type(error).__name__}: {error}",
                  "traceback": str(trace.relative_to(self.root.parent))}
        atomic_write_json(folder / "failure.json", {**record, "key": key})
        return record
