"""pipelines.batches: finished chunks kept atomically, read back by a rerun, never read once their inputs changed."""
from __future__ import annotations

import numpy as np
import pytest

from pipelines.batches import KEPT_FOLDER, clear_kept_batches, kept_batches


def counting(values):
    calls = []

    def compute(start, stop):
        calls.append((start, stop))
        return values[start:stop].astype(np.float32)  # any float dtype: kept as float64

    return compute, calls


def test_chunks_are_kept_and_reused(tmp_path):
    values = np.random.default_rng(0).normal(size=7)
    rows = [f"r{i}" for i in range(7)]
    compute, calls = counting(values)
    first = kept_batches(tmp_path, {"m": 1}, rows, 3, compute)
    assert calls == [(0, 3), (3, 6), (6, 7)] and first.dtype == np.float64
    np.testing.assert_array_equal(first, values.astype(np.float32).astype(np.float64))
    compute2, calls2 = counting(values)
    assert np.array_equal(kept_batches(tmp_path, {"m": 1}, rows, 3, compute2), first) and calls2 == []
    compute3, calls3 = counting(values)
    kept_batches(tmp_path, {"m": 2}, rows, 3, compute3)  # another identity
    renamed = rows[:4] + ["x"] + rows[5:]  # one row of the middle chunk is another image
    compute4, calls4 = counting(values)
    kept_batches(tmp_path, {"m": 1}, renamed, 3, compute4)
    assert calls3 == [(0, 3), (3, 6), (6, 7)] and calls4 == [(3, 6)]
    assert kept_batches(tmp_path, {"m": 1}, [], 3, compute).shape == (0,)


def test_an_unreadable_or_wrong_file_is_computed_again_and_clear_removes_all(tmp_path):
    values = np.arange(4.0)
    compute, _ = counting(values)
    kept_batches(tmp_path, "id", ["a", "b", "c", "d"], 2, compute)
    files = sorted((tmp_path / KEPT_FOLDER).rglob("*.npy"))
    files[0].write_bytes(b"cut short")
    np.save(files[1], np.zeros(3))  # wrong length
    compute2, calls = counting(values)
    np.testing.assert_array_equal(kept_batches(tmp_path, "id", ["a", "b", "c", "d"], 2, compute2), values)
    assert calls == [(0, 2), (2, 4)]
    clear_kept_batches(tmp_path)
    assert not (tmp_path / KEPT_FOLDER).exists()


def test_a_wrong_count_is_an_error_and_nothing_is_kept(tmp_path):
    with pytest.raises(ValueError, match="computed 1 values for 2 rows"):
        kept_batches(tmp_path, "id", ["a", "b"], 2, lambda start, stop: np.zeros(1))
    assert not list(tmp_path.rglob("*.npy"))
    with pytest.raises(ValueError, match="chunk"):
        kept_batches(tmp_path, "id", ["a"], 0, lambda start, stop: np.zeros(1))
