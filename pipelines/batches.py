"""Finished batches of a long per-row computation kept on disk, so that a killed rerun resumes within a set.

    values = kept_batches(folder, identity, row_keys, chunk, lambda start, stop: compute(rows[start:stop]))

The rows are cut into chunks of `chunk` rows; each finished chunk's float64 values are written atomically to
`folder/<identity hash>/<start>-<stop>-<rows hash>.npy`, and a rerun reads every chunk file it finds instead of
computing it again. The identity (whatever decides the values: a method, its parameters and state, its model's
weights) and each chunk's row keys are in the names, so a changed input never reads a stale file; a file that does
not read back as the expected float64 vector is computed again. Because a resumed run cuts the same chunks and each
chunk's computation is the same, its result is bitwise equal to an uninterrupted run.
"""
from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from pipelines.fingerprint import combine
from pipelines.io import atomic_path

KEPT_FOLDER = "kept_batches"
"""The folder, inside a caller's work folder, that holds the kept batches."""


def kept_batches(folder: str | os.PathLike, identity: Any, rows: Sequence[str], chunk: int,
                 compute: Callable[[int, int], Any]) -> np.ndarray:
    """float64 values of every row: each chunk of `chunk` rows read from its kept file, else `compute(start, stop)`
    (a vector of stop - start values) and kept. `identity`: JSON-able data deciding the values; `rows`: row keys."""
    if chunk < 1:
        raise ValueError(f"chunk must be >= 1, got {chunk}")
    where = Path(folder) / KEPT_FOLDER / combine(identity)[:24]
    parts = []
    for start in range(0, len(rows), chunk):
        stop = min(start + chunk, len(rows))
        path = where / f"{start:09d}-{stop:09d}-{combine(list(rows[start:stop]))[:16]}.npy"
        values = _read(path, stop - start)
        if values is None:
            values = np.asarray(compute(start, stop), dtype=np.float64).reshape(-1)
            if len(values) != stop - start:
                raise ValueError(f"rows {start}..{stop}: computed {len(values)} values for {stop - start} rows")
            where.mkdir(parents=True, exist_ok=True)
            with atomic_path(path) as tmp, open(tmp, "wb") as fh:
                np.save(fh, values, allow_pickle=False)
        parts.append(values)
    return np.concatenate(parts) if parts else np.zeros(0, dtype=np.float64)


def _read(path: Path, n: int) -> np.ndarray | None:
    try:
        values = np.load(path, allow_pickle=False)
    except (OSError, ValueError):
        return None
    if values.dtype != np.float64 or values.shape != (n,):
        return None
    return values


def clear_kept_batches(folder: str | os.PathLike) -> None:
    """Remove the kept batches under a work folder (once the whole result is written, they are not needed)."""
    shutil.rmtree(Path(folder) / KEPT_FOLDER, ignore_errors=True)
