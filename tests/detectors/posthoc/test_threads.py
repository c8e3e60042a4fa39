"""The post-hoc passes' threads: the core counts stay within the machine, the thread-pool limits apply and lift, the
pools are found again after an import, and `map_blocks` gives every block's result once, in order, on any number of
threads."""
import os
import sys
import types

import numpy as np
import pytest

from detectors.posthoc import threads


def test_idle_cores_is_within_the_machine(monkeypatch):
    cores = len(os.sched_getaffinity(0))
    assert threads.usable_cores() == cores
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (50.0, 0, 0))
    assert threads.idle_cores() == 1  # a loaded machine: one thread
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (1.0, 0, 0))
    assert threads.idle_cores() == cores  # only this process running: every core
    monkeypatch.setattr(threads.os, "getloadavg", lambda: (0.0, 0, 0))
    assert threads.idle_cores() == cores


def _pools() -> dict[tuple[str, str], int]:
    return {(pool["user_api"], pool["filepath"]): pool["num_threads"] for pool in threads.controller().info()}


def test_limit_caps_the_pools_and_restores_them():
    before = _pools()
    assert any(api == "blas" for api, _ in before)  # numpy's OpenBLAS is found
    with threads.limit(1, "blas"):
        inside = _pools()
        assert all(inside[pool] == 1 for pool in before if pool[0] == "blas")
    assert _pools() == before


def test_the_pools_are_found_again_after_an_import(monkeypatch):
    first = threads.controller()
    assert threads.controller() is first  # cached: no walk over the loaded libraries per call
    monkeypatch.setitem(sys.modules, "oodforge_test_new_module", types.ModuleType("oodforge_test_new_module"))
    assert threads.controller() is not first


@pytest.mark.parametrize("workers", [1, 2, 3])
@pytest.mark.parametrize("n, rows", [(0, 4), (1, 4), (10, 4), (12, 4), (7, 100)])
def test_map_blocks_gives_each_block_once_in_order(workers, n, rows, monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: workers)
    x = np.arange(n * 3, dtype=np.float32).reshape(n, 3)
    parts = list(threads.map_blocks(lambda block: block.sum(axis=1), x, rows=rows))
    assert [part.start for part, _ in parts] == list(range(0, n, rows))
    got = np.concatenate([value for _, value in parts]) if parts else np.empty(0, np.float32)
    np.testing.assert_array_equal(got, x.sum(axis=1))


def test_map_blocks_passes_views_or_blocks_of_the_asked_dtype(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    x = np.ones((9, 2), np.float16)
    converted = [block for _, block in threads.map_blocks(lambda block: block, x, np.float32, rows=4)]
    assert [block.dtype for block in converted] == [np.float32] * 3
    views = [block for _, block in threads.map_blocks(lambda block: block, x, rows=4)]  # already float16: no copy
    assert all(np.shares_memory(block, x) and not block.flags.writeable for block in views)


def test_map_rows_concatenates_float64(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    x = np.arange(20, dtype=np.float32).reshape(10, 2)
    got = threads.map_rows(lambda block: block[:, 0] * 2, x, rows=3)
    assert got.dtype == np.float64
    np.testing.assert_array_equal(got, x[:, 0] * 2)
    assert threads.map_rows(lambda block: block[:, 0], x[:0]).shape == (0,)


def test_map_blocks_raises_a_blocks_error(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)

    def fails(block: np.ndarray) -> np.ndarray:
        raise ValueError("bad block")

    with pytest.raises(ValueError, match="bad block"):
        list(threads.map_blocks(fails, np.ones((10, 2), np.float32), rows=3))


def test_the_pool_is_kept_between_calls_and_runs_nested_blocks_inline(monkeypatch):
    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    x = np.arange(40, dtype=np.float64).reshape(20, 2)
    assert threads.block_pool(2) is threads.block_pool(2)

    def nested(block: np.ndarray) -> np.ndarray:  # a block that maps its own rows: inline, no wait on the busy pool
        return threads.map_rows(lambda rows: rows.sum(axis=1), block, rows=2)

    np.testing.assert_array_equal(threads.map_rows(nested, x, rows=5), x.sum(axis=1))
    with pytest.raises(ValueError, match="bad block"):
        list(threads.map_blocks(lambda block: (_ for _ in ()).throw(ValueError("bad block")), x, rows=1))
    np.testing.assert_array_equal(threads.map_rows(lambda block: block[:, 0], x, rows=3), x[:, 0])  # still serves


def _forked_sum(queue) -> None:
    x = np.ones((50, 3), np.float32)
    queue.put(float(threads.map_rows(lambda block: block.sum(axis=1), x, rows=4).sum()))


def test_a_forked_child_gets_its_own_pool(monkeypatch):
    import multiprocessing

    monkeypatch.setattr(threads, "usable_cores", lambda: 2)
    threads.map_rows(lambda block: block[:, 0], np.ones((8, 2)), rows=2)  # the parent's pool has threads
    context = multiprocessing.get_context("fork")
    queue = context.Queue()
    child = context.Process(target=_forked_sum, args=(queue,), daemon=True)
    child.start()
    child.join(60)
    assert child.exitcode == 0 and queue.get(timeout=5) == 150.0  # the fork's copy of the pool has no threads
