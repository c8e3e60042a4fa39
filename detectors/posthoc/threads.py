"""Threads for the post-hoc detectors' passes: how many cores to use, the native thread pools' limits, and row blocks
on a Python thread per core (numpy and torch release the GIL in their kernels)."""
from __future__ import annotations

import os
import sys
import threading
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
from threadpoolctl import ThreadpoolController

from detectors.posthoc import streaming

BLOCK_ROWS = 2048
"""Rows per block of `map_blocks` by default: a block's working copies stay in a core's cache."""

_controller: tuple[int, ThreadpoolController] | None = None
_pool: tuple[int, int, ThreadPoolExecutor] | None = None  # (process id, workers, pool)
_pool_lock = threading.Lock()
_in_worker = threading.local()


def usable_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def idle_cores() -> int:
    """The cores this process may use less the others' load (the 1-minute load average without this process), at
    least 1."""
    cores = usable_cores()
    others = max(os.getloadavg()[0] - 1.0, 0.0)
    return max(1, min(cores, int(cores - others + 0.5)))


def controller() -> ThreadpoolController:
    """threadpoolctl's view of the loaded thread pools, found again only after an import: finding them walks every
    loaded library (0.5 ms beside torch, a sixth of a 20k x 200 logit detector's score), and a native library comes
    in with an import."""
    global _controller
    if _controller is None or _controller[0] != len(sys.modules):
        _controller = len(sys.modules), ThreadpoolController()
    return _controller[1]


def limit(threads: int, user_api: str | None = None):
    """Context manager: the native pools of `user_api` ("blas", "openmp"; None: all) on at most `threads` threads."""
    return controller().limit(limits=threads, user_api=user_api)


def lapack_threads():
    """OpenBLAS threads for numpy's factorisations (pnml's pseudo-inverse, gmm's per-class Cholesky and SVD): the cores
    the machine leaves idle, at least one. LAPACK's reductions are synchronisation-bound: on a shared 2-core machine
    whose cores were busy one thread ran them 2-5x faster than two (docs/bench_vim.md), while on an idle machine the
    other cores help."""
    return limit(idle_cores())


def one_blas_thread():
    """OpenBLAS (numpy's products) on one thread, for a detector whose parallelism is its row blocks' Python threads
    (`map_blocks`): a threaded OpenBLAS call leaves its pool spinning for about 0.1 s on the cores the next blocks
    start on (ViM's fit on 2 idle cores: 457 ms with its 256-row logit check threaded, 419 ms without)."""
    return limit(1, "blas")


def _mark_worker() -> None:
    _in_worker.active = True


def block_pool(workers: int) -> ThreadPoolExecutor:
    """The process's pool of `workers` block threads, kept between calls (starting two threads costs about 0.2 ms, a
    tenth of a 20k x 200 logit detector's score); made again in a forked child, whose copy has no threads."""
    global _pool
    with _pool_lock:
        if _pool is None or _pool[:2] != (os.getpid(), workers):
            _pool = os.getpid(), workers, ThreadPoolExecutor(workers, "oodforge-blocks", initializer=_mark_worker)
        return _pool[2]


def map_blocks(fn: Callable[[np.ndarray], Any], array: np.ndarray, dtype: Any = None,
               rows: int | None = None) -> Iterator[tuple[slice, Any]]:
    """(row slice, fn(rows)) over the read-only row blocks of `array` (`streaming.blocks`), in order. On a machine with
    more than one core the blocks run on one Python thread per core with one native thread each: each thread runs its
    block's products and its elementwise passes, which a threaded product alone would leave serial (on 2 idle cores
    they were a quarter of ViM's fit and score). Every core, busy or not: the blocks never wait for each other, so a
    busy machine only slows them (ViM beside two busy processes on 2 cores: 1.08x pytorch-ood on one thread, which
    got a third of the machine, against 1.3x on two). At most twice as many blocks as threads are in flight (a
    memory-mapped input's are copies). Called from a block thread, it runs inline: the outer blocks hold the cores.
    `rows`: per block, default BLOCK_ROWS."""
    workers = usable_cores()
    items = streaming.blocks(array, dtype, rows or BLOCK_ROWS, read_only=True)
    if workers == 1 or getattr(_in_worker, "active", False):
        for part, block in items:
            yield part, fn(block)
        return
    pool, pending = block_pool(workers), deque()
    try:
        with limit(1):
            for part, block in items:
                pending.append((part, pool.submit(fn, block)))
                if len(pending) > 2 * workers:
                    done, future = pending.popleft()
                    yield done, future.result()
            while pending:
                done, future = pending.popleft()
                yield done, future.result()
    finally:  # an error or an early stop: the blocks not started are dropped, those running finish
        for _, future in pending:
            future.cancel()


def map_rows(fn: Callable[[np.ndarray], np.ndarray], array: np.ndarray, dtype: Any = None,
             rows: int | None = None) -> np.ndarray:
    """fn(rows) [n_rows] of every block (`map_blocks`), concatenated in order as float64 [N]."""
    out = np.empty(len(array))
    for part, values in map_blocks(fn, array, dtype, rows):
        out[part] = values
    return out
