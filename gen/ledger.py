"""Append-only job ledger: one JSONL file per process (each line fsync'ed), merged by the main process.

A record is `{"index", "status": "done" | "failed", ...}`; a done record carries the output's manifest `row`, so the
manifest can be rebuilt from the ledger alone. Reading merges every file in the folder, so a rerun with a different
number of processes still sees all earlier work; for an index, `done` wins over `failed`.
"""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from pipelines.io import atomic_write_text

DONE, FAILED = "done", "failed"
MERGED = "merged.jsonl"


class Ledger:
    """The ledger folder of one job; `append` writes this process's file, `records` reads them all."""

    def __init__(self, folder: str | os.PathLike, rank: int = 0):
        self.folder = Path(folder)
        self.rank = rank
        self.path = self.folder / f"process-{rank:03d}.jsonl"

    def append(self, *records: dict[str, Any]) -> None:
        """Append records and fsync once, so a killed process loses at most the lines being written."""
        for record in records:
            if record.get("status") not in (DONE, FAILED) or not isinstance(record.get("index"), int):
                raise ValueError(f"ledger record needs an int 'index' and status done|failed, got {record!r}")
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as fh:
            fh.write("".join(json.dumps(record, default=str) + "\n" for record in records))
            fh.flush()
            os.fsync(fh.fileno())

    def files(self) -> list[Path]:
        return sorted(self.folder.glob("*.jsonl")) if self.folder.is_dir() else []

    def records(self) -> dict[int, dict[str, Any]]:
        """The final record of every index over all files (`done` beats `failed`; a torn last line is ignored)."""
        merged: dict[int, dict[str, Any]] = {}
        for path in self.files():
            with open(path, encoding="utf-8") as fh:
                for text in fh:
                    try:
                        record = json.loads(text)
                    except json.JSONDecodeError:
                        continue  # a line cut short by a kill; its item is redone
                    index = record.get("index")
                    if not isinstance(index, int):
                        continue
                    if merged.get(index, {}).get("status") != DONE:
                        merged[index] = record
        return merged

    def merge(self) -> dict[int, dict[str, Any]]:
        """Main process, after every process finished: fold all files into `merged.jsonl` (atomically), drop the
        rest."""
        records = self.records()
        text = "".join(json.dumps(records[i], default=str) + "\n" for i in sorted(records))
        atomic_write_text(self.folder / MERGED, text)
        for path in self.files():
            if path.name != MERGED:
                path.unlink()
        return records
