"""Streaming statistics of feature rows: chunked passes over (memory-mapped) arrays with bounded memory.

Every statistic a feature-level detector fits is either a sum (class counts, sums and scatter matrices, mean
activations, per-row quantities averaged over the train set) or an exact percentile. Sums are kept as `Moments`,
which merge exactly across chunks, processes and machines; percentiles are found by an exact radix selection over
chunks (two passes, equal to `np.percentile`).

Peak memory is bounded by the chunk size: `StreamContext.rows` rows (float64) at a time, set for a block of code with
`using(StreamContext(...))` or `chunk_rows(n)`, default the environment variable `OODFORGE_CHUNK_ROWS`. Pages of a
memory-mapped input are released once a chunk is read, so the resident set does not grow with the file.

Inside `across_processes()` (a context with `distributed`), every statistic is reduced over the accelerate /
torch.distributed processes: each process passes its own shard of rows and all of them end with the statistics of the
union. The context is a value the caller passes in (held in a context variable for the code it wraps, so the
detectors' fit and score signatures stay those of the library); no module state is rebound.
"""
from __future__ import annotations

import contextlib
import contextvars
import dataclasses
import mmap
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import scipy.sparse

DEFAULT_CHUNK_ROWS = int(os.environ.get("OODFORGE_CHUNK_ROWS", 16384))
_PAGE = mmap.PAGESIZE


@dataclass(frozen=True)
class StreamContext:
    """How streamed passes run: `rows` per chunk (peak memory ~ a few rows x D x 8 bytes) and whether statistics are
    reduced over every process (`distributed`: each process holds a shard of the rows)."""

    rows: int = DEFAULT_CHUNK_ROWS
    distributed: bool = False

    def __post_init__(self) -> None:
        if int(self.rows) < 1:
            raise ValueError(f"chunk rows must be >= 1, got {self.rows}")


_DEFAULT = StreamContext()
_CONTEXT: contextvars.ContextVar[StreamContext] = contextvars.ContextVar("streaming")


def current() -> StreamContext:
    """The stream context in force (the default outside every `using`)."""
    return _CONTEXT.get(_DEFAULT)


@contextlib.contextmanager
def using(context: StreamContext) -> Iterator[StreamContext]:
    """Run the enclosed streamed passes under `context`."""
    token = _CONTEXT.set(context)
    try:
        yield context
    finally:
        _CONTEXT.reset(token)


def chunk_rows(rows: int) -> contextlib.AbstractContextManager[StreamContext]:
    """The current context with `rows` rows per chunk."""
    return using(dataclasses.replace(current(), rows=int(rows)))


def across_processes() -> contextlib.AbstractContextManager[StreamContext]:
    """The current context with every statistic reduced over all processes (each holds a shard of the rows)."""
    return using(dataclasses.replace(current(), distributed=True))


def process_rows(n: int) -> slice:
    """This process's contiguous share of n rows (`pipelines.collectives.share`; all rows with one process)."""
    from pipelines.collectives import share

    mine = share(n)
    return slice(mine.start, mine.stop)


def _gather(obj: Any) -> list[Any]:
    """`obj` of every process in rank order (itself alone outside `across_processes` or with one process); a
    process whose fit failed is met here (`pipelines.collectives.PeerFailed`)."""
    if not current().distributed:
        return [obj]
    from pipelines.collectives import all_gather

    return all_gather(obj, "a sharded fit")


def reduce_sum(*arrays: Any) -> tuple[np.ndarray, ...]:
    """Element-wise sums over processes (in rank order, so every process gets the same bits)."""
    parts = _gather([np.asarray(a) for a in arrays])
    out = list(parts[0])
    for part in parts[1:]:
        out = [a + b for a, b in zip(out, part)]
    return tuple(out)


# -- chunked reading ----------------------------------------------------------------------------------------------
def _mapping(array: np.ndarray) -> mmap.mmap | None:
    """The mmap object behind a (view of a) np.memmap, if any."""
    base: Any = array
    while base is not None:
        if isinstance(base, mmap.mmap):
            return base
        if isinstance(base, np.memmap) and isinstance(getattr(base, "_mmap", None), mmap.mmap):
            return base._mmap
        base = getattr(base, "base", None)
    return None


def release(array: np.ndarray) -> None:
    """Drop the resident pages of a memory-mapped array slice (the file keeps the data; a later read faults them
    back)."""
    mapped = _mapping(array)
    if mapped is None or not array.flags.c_contiguous or array.nbytes == 0 or not hasattr(mapped, "madvise"):
        return
    start = np.frombuffer(mapped, dtype=np.uint8, count=0).ctypes.data if len(mapped) else 0
    begin = array.__array_interface__["data"][0] - start
    first = -(-begin // _PAGE) * _PAGE  # whole pages only: neighbours may still be in use
    stop = (begin + array.nbytes) // _PAGE * _PAGE
    if stop > first:
        mapped.madvise(mmap.MADV_DONTNEED, first, stop - first)


def row_slices(n: int, rows: int | None = None) -> Iterator[slice]:
    """Consecutive row slices of at most `rows` (default the context's)."""
    rows = rows or current().rows
    for start in range(0, n, rows):
        yield slice(start, min(start + rows, n))


def chunks(array: np.ndarray, dtype: Any = None, rows: int | None = None) -> Iterator[tuple[slice, np.ndarray]]:
    """(row slice, rows as a fresh in-memory array in `dtype`) over `array`, releasing mapped pages after each read."""
    for part in row_slices(len(array), rows):
        view = array[part]
        block = fresh_copy(view, dtype)
        release(view)
        yield part, block


def fresh_copy(view: np.ndarray, dtype: Any = None) -> np.ndarray:
    """An in-memory copy of `view` in `dtype`. float16 widens through torch (exact, vectorised: about 3x numpy's
    element-wise conversion, which dominated the read of float16 caches)."""
    target = np.dtype(dtype or view.dtype)
    if view.dtype != np.float16 or target not in (np.float32, np.float64):
        return np.array(view, dtype=target, copy=True)
    import torch

    half = torch.from_numpy(np.array(view, copy=True))
    return half.to(torch.float32 if target == np.float32 else torch.float64).numpy()


def scratch(shape: tuple[int, ...], dtype: Any = np.float32) -> np.ndarray:
    """An uninitialised array for a buffer that is written once per block, from torch's allocator: numpy asks the
    kernel for transparent huge pages on a fresh array of 4 MiB or more, and where the kernel defragments on request
    (`defrag: madvise`) the first writes to a fresh 40 MB array stalled 0.2-0.4 s in compaction here
    (docs/bench_vim.md), against 20 ms of ordinary page faults."""
    import torch

    return torch.empty(shape, dtype=getattr(torch, np.dtype(dtype).name)).numpy()


def map_rows(fn: Callable[[slice, np.ndarray], np.ndarray], array: np.ndarray, dtype: Any = None, *,
             rows: int | None = None, read_only: bool = False) -> np.ndarray:
    """Concatenate fn(slice, rows) [n_rows] over the chunks of `array` (chunked scoring), `rows` per call (default
    the context's rows; a few thousand keep one call's passes in cache). `read_only`: fn never writes to its rows, so
    those of an in-memory array already in `dtype` come as read-only views, not copies (a memory-mapped one is still
    read chunk by chunk and released)."""
    out = None
    for part, block in blocks(array, dtype, rows, read_only):
        value = np.asarray(fn(part, block))
        if out is None:
            out = np.empty((len(array),) + value.shape[1:], dtype=value.dtype)
        out[part] = value
    return out if out is not None else np.zeros(0)


def blocks(array: np.ndarray, dtype: Any = None, rows: int | None = None,
           read_only: bool = False) -> Iterator[tuple[slice, np.ndarray]]:
    """`chunks`, or with `read_only` (the caller never writes to the rows) read-only views of an in-memory array
    already in `dtype`: no copy."""
    if read_only and _mapping(array) is None and (dtype is None or np.dtype(dtype) == array.dtype):
        return _views(array, rows)
    return chunks(array, dtype, rows)


def _views(array: np.ndarray, rows: int | None) -> Iterator[tuple[slice, np.ndarray]]:
    """(row slice, read-only view of those rows) over an in-memory array."""
    for part in row_slices(len(array), rows):
        view = array[part]
        view.flags.writeable = False
        yield part, view


def column_mean(array: np.ndarray) -> np.ndarray:
    """float64 mean row, streamed (reduced across processes inside `across_processes`)."""
    total = np.zeros(array.shape[1])
    for _, block in chunks(array):
        total += block.sum(axis=0, dtype=np.float64)
    total, count = reduce_sum(total, np.array(len(array)))
    return total / count


# -- mergeable moments ------------------------------------------------------------------------------------------
@dataclass
class Moments:
    """Sums of rows (float64) about a fixed `shift` a: per group count n_g and sum s_g = sum (x - a), and the scatter
    S = sum (x - a)(x - a)^T (optional; numpy's x.T @ x is a symmetric rank-k update). Exact to merge; group means and
    the pooled or within-group scatter follow in closed form. The shift (the first chunk's mean) keeps the float64 sums
    well conditioned.
    """

    shift: np.ndarray
    groups: np.ndarray
    count: np.ndarray
    sums: np.ndarray
    scatter: np.ndarray | None

    @classmethod
    def of(cls, rows: np.ndarray, groups: np.ndarray | None = None, *, scatter: Any = True,
           shift: np.ndarray | None = None) -> Moments:
        """Moments of in-memory rows [n,D]. `scatter`: False (none), True (float64 products) or np.float32 (the
        chunk's products in float32, accumulated in float64 across chunks: twice the speed, the precision of
        covariances computed from float32 features, e.g. sklearn's EmpiricalCovariance as ViM's code uses it)."""
        rows = np.asarray(rows, dtype=np.float64)
        if shift is None:
            shift = rows.mean(axis=0) if len(rows) else np.zeros(rows.shape[1])
            if scatter is np.float32:
                shift = shift.astype(np.float32).astype(np.float64)  # exact in float32 too
        centred = rows - shift
        if groups is None:
            ids, position = np.zeros(1, np.int64), np.zeros(len(rows), np.int64)
        else:
            ids, position = np.unique(np.asarray(groups, dtype=np.int64), return_inverse=True)
        one_hot = scipy.sparse.csr_matrix((np.ones(len(rows)), (position, np.arange(len(rows)))),
                                          shape=(len(ids), len(rows)))
        sums = np.asarray(one_hot @ centred)
        product = None
        if scatter is np.float32:
            low = centred.astype(np.float32)
            product = (low.T @ low).astype(np.float64)
        elif scatter:
            product = centred.T @ centred
        return cls(shift, ids, np.bincount(position, minlength=len(ids)).astype(np.int64), sums, product)

    def moved(self, shift: np.ndarray) -> Moments:
        """The same moments about another shift b: s_g += n_g (a - b); S += s (a-b)^T + (a-b) s^T + n (a-b)(a-b)^T."""
        d = self.shift - shift
        total = self.sums.sum(axis=0)
        sums = self.sums + self.count[:, None] * d
        scatter = None
        if self.scatter is not None:
            scatter = self.scatter + np.outer(total, d) + np.outer(d, total) + self.count.sum() * np.outer(d, d)
        return Moments(shift, self.groups, self.count, sums, scatter)

    def merge(self, other: Moments) -> Moments:
        """Moments of the union of both row sets (about this one's shift)."""
        other = other if np.array_equal(other.shift, self.shift) else other.moved(self.shift)
        ids = np.union1d(self.groups, other.groups)
        count, sums = np.zeros(len(ids), np.int64), np.zeros((len(ids), len(self.shift)))
        for part in (self, other):
            at = np.searchsorted(ids, part.groups)
            count[at] += part.count
            sums[at] += part.sums
        scatter = None if self.scatter is None or other.scatter is None else self.scatter + other.scatter
        return Moments(self.shift, ids, count, sums, scatter)

    @property
    def n(self) -> int:
        return int(self.count.sum())

    def means(self) -> np.ndarray:
        """[G,D] mean of each group."""
        return self.shift + self.sums / self.count[:, None]

    def mean(self) -> np.ndarray:
        """[D] mean of all rows."""
        return self.shift + self.sums.sum(axis=0) / self.n

    def pooled_scatter(self) -> np.ndarray:
        """sum (x - mean)(x - mean)^T over all rows [D,D]."""
        total = self.sums.sum(axis=0)
        return self.scatter - np.outer(total, total) / self.n

    def within_scatter(self) -> np.ndarray:
        """sum_g sum_{x in g} (x - mean_g)(x - mean_g)^T [D,D] (class-centred, tied)."""
        weighted = self.sums / np.sqrt(self.count)[:, None]
        return self.scatter - weighted.T @ weighted

    def second_moment_about(self, point: np.ndarray) -> np.ndarray:
        """sum (x - point)(x - point)^T / n [D,D] (an uncentred covariance about `point`)."""
        return self.moved(point).scatter / self.n


def moments(array: np.ndarray, groups: np.ndarray | None = None, *, scatter: Any = True) -> Moments:
    """Moments of all rows of a (memory-mapped) array [N,D], streamed in chunks of the context's rows and reduced
    across processes inside `across_processes` (`scatter` as in `Moments.of`)."""
    total: Moments | None = None
    labels = None if groups is None else np.asarray(groups)
    single = scatter is np.float32 and labels is None  # one group, float32 products: no float64 copy of the rows
    for part, block in blocks(array, np.float32 if single else np.float64, read_only=single):
        if single:
            piece = _single_group_float32(block, None if total is None else total.shift)
        else:
            piece = Moments.of(block, None if labels is None else labels[part], scatter=scatter,
                               shift=None if total is None else total.shift)
        total = piece if total is None else total.merge(piece)
    merged = None
    for piece in _gather(total):  # a process whose share is empty (fewer rows than processes) adds nothing
        if piece is not None:
            merged = piece if merged is None else merged.merge(piece)
    if merged is None:
        raise ValueError("no rows to compute statistics from")
    return merged


@dataclass
class ClassScatter:
    """Group moments (counts, means) and the within-group scatter W = sum_g sum_{x in g} (x - mu_g)(x - mu_g)^T."""

    stats: Moments
    within: np.ndarray

    def pooled(self) -> np.ndarray:
        """sum (x - mu)(x - mu)^T over all rows: W + sum_g n_g (mu_g - mu)(mu_g - mu)^T (a sum of PSD terms)."""
        spread = (self.stats.means() - self.stats.mean()) * np.sqrt(self.stats.count)[:, None]
        return self.within + spread.T @ spread


def class_scatter(array: np.ndarray, groups: np.ndarray) -> ClassScatter:
    """The class-centred scatter of a (memory-mapped) array [N,D] in two streamed passes: group means first, then the
    products of the rows centred on their group's mean (float64), reduced across processes inside `across_processes`.

    `Moments.within_scatter()` subtracts sum_g s_g s_g^T from the raw scatter in one pass; where the classes are far
    apart that leaves rounding eigenvalues of order eps * ||between scatter|| in the null space of a singular tied
    covariance (D > N - C), which a pseudo-inverse would invert. Centred products keep that null space at the rounding
    of the centred rows, as sklearn's EmpiricalCovariance on class-centred features (OpenOOD's MDS fit)."""
    labels = np.asarray(groups)
    stats = moments(array, labels, scatter=False)
    means, at = stats.means(), np.searchsorted(stats.groups, labels.astype(np.int64))
    within = np.zeros((array.shape[1], array.shape[1]))
    for part, block in chunks(array, np.float64):
        block -= means[at[part]]
        within += block.T @ block
    (within,) = reduce_sum(within)
    return ClassScatter(stats, within)


def _single_group_float32(rows: np.ndarray, shift: np.ndarray | None) -> Moments:
    """Moments.of(rows, scatter=np.float32) for float32 rows and one group, centred and multiplied in float32."""
    if shift is None:
        shift = rows.mean(axis=0, dtype=np.float64).astype(np.float32).astype(np.float64)
    centred = rows - shift.astype(np.float32)
    return Moments(shift, np.zeros(1, np.int64), np.array([len(rows)], np.int64),
                   centred.sum(axis=0, dtype=np.float64)[None], (centred.T @ centred).astype(np.float64))


# -- exact percentiles ------------------------------------------------------------------------------------------
_UINT = {2: np.uint16, 4: np.uint32, 8: np.uint64}
_BITS = 16  # histogram resolution of the first pass (65536 bins)


def _keys(values: np.ndarray) -> np.ndarray:
    """Unsigned integers ordered like the floats (IEEE sign-magnitude to two's-complement order)."""
    unsigned = _UINT[values.dtype.itemsize]
    bits = values.view(unsigned)
    sign = unsigned(1) << unsigned(8 * values.dtype.itemsize - 1)
    return np.where(bits & sign, ~bits, bits | sign)


def _lerp(a: Any, b: Any, t: float) -> Any:
    """numpy's linear interpolation of np.percentile (the far end is used from t >= 0.5, as numpy does)."""
    diff = b - a
    return b - diff * (1 - t) if t >= 0.5 else a + diff * t


def percentile(array: np.ndarray, q: float, dtype: Any = None) -> float:
    """np.percentile(array.astype(dtype), q) over all entries (method 'linear'), exactly, in two streamed passes: a
    histogram of the top bits of each value's order key, then the values of the one or two histogram bins holding the
    wanted ranks (reduced across processes inside `across_processes`)."""
    if not 0 <= q <= 100:
        raise ValueError(f"percentile must be in [0, 100], got {q}")
    dtype = np.dtype(dtype or array.dtype)
    if dtype.kind != "f":
        dtype = np.dtype(np.float64)
    # float16 data (as stored in a cache) have 2^16 distinct values: their histogram is exact and one pass suffices
    stored = np.dtype(np.float16) if array.dtype == np.float16 and dtype.itemsize >= 2 else dtype
    width = 8 * stored.itemsize
    shift = max(width - _BITS, 0)
    counts = np.zeros(1 << min(width, _BITS), np.int64)
    nan = 0
    for _, block in chunks(array, stored):
        nan += int(np.isnan(block).sum())
        counts += np.bincount((_keys(block.reshape(-1)) >> shift).astype(np.int64), minlength=len(counts))
    counts, nan = reduce_sum(counts, np.array(nan))
    if nan:
        raise ValueError(f"percentile: the data hold {int(nan)} NaN value(s)")
    n = int(counts.sum())
    if n == 0:
        raise ValueError("percentile of an empty array")
    virtual = (n - 1) * (np.float64(q) / 100)
    lo = int(np.floor(virtual))
    hi = min(lo + 1, n - 1)
    gamma = float(virtual - lo)
    cumulative = np.cumsum(counts)
    bins = np.searchsorted(cumulative, [lo, hi], side="right")
    if shift == 0:  # every bin is one value
        unsigned = _UINT[stored.itemsize]
        keys = bins.astype(unsigned)
        sign = unsigned(1) << unsigned(width - 1)
        a, b = np.where(keys & sign, keys ^ sign, ~keys).view(stored).astype(dtype)
        return float(_lerp(a, b, gamma))
    before = np.concatenate([[0], cumulative])[bins]
    wanted = np.unique(bins)
    picked = []
    for _, block in chunks(array, stored):
        flat = block.reshape(-1)
        picked.append(flat[np.isin((_keys(flat) >> shift).astype(np.int64), wanted)])
    mine = np.concatenate(picked) if picked else np.zeros(0, stored)  # an empty share picks nothing
    candidates = np.concatenate(_gather(mine))
    keys = _keys(candidates)
    rank = np.argsort(keys, kind="stable")  # key order = value order, -0.0 before +0.0 as in the histogram
    ordered, first = candidates[rank], np.searchsorted((keys[rank] >> shift).astype(np.int64), bins)
    a = ordered[first[0] + lo - int(before[0])]
    b = ordered[first[1] + hi - int(before[1])]
    return float(_lerp(a, b, gamma))
