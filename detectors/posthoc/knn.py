"""Deep k-nearest neighbours (Sun et al., ICML 2022): distance to the k-th nearest L2-normalised train feature.

Indexes (`index` parameter):
- "flat" (default, the reference): exact search. A bank up to `IN_MEMORY_BYTES` (float32) is held in a faiss
  IndexFlatL2; a larger one stays where it is stored (e.g. a memory-mapped cache) and is searched exactly chunk by
  chunk, the k best of each chunk merged: the same distances with memory bounded by the chunk size.
- "flat16": exhaustive search over vectors stored in float16 (faiss scalar quantizer): half the memory, distances
  within float16 rounding of the exact ones.
- "ivf": inverted file with float16 storage (nlist = sqrt(N) clusters trained on 40 nlist evenly spaced rows,
  `nprobe` searched): approximate, much faster
  for large banks; recall is measured in `benchmarks/scale.py` (docs/bench_scale.md).
- "auto": "flat" up to `AUTO_IVF_ROWS` train rows, "ivf" beyond.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param
from pipelines.progress import progress

QUERY_BLOCK = 8192
IN_MEMORY_BYTES = 2 << 30  # a float32 bank up to 2 GiB is held in memory; larger ones are searched streamed
AUTO_IVF_ROWS = 250_000
INDEXES = ("flat", "flat16", "ivf", "auto")


def l2_normalise(features: np.ndarray) -> np.ndarray:
    """A contiguous float32 copy of the rows scaled to unit L2 norm (zero rows stay zero), for faiss."""
    out = np.array(features, dtype=np.float32, order="C")
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


def normalised_chunks(features: np.ndarray):
    """(row slice, l2_normalise(rows)) over the chunks of a stored (possibly memory-mapped) array."""
    for rows, block in streaming.chunks(features):
        yield rows, l2_normalise(block)


def merge_smallest(best: np.ndarray | None, new: np.ndarray, k: int) -> np.ndarray:
    """The k smallest values per row of best and new together (unsorted)."""
    both = new if best is None else np.concatenate([best, new], axis=1)
    return both if both.shape[1] <= k else np.partition(both, k - 1, axis=1)[:, :k]


@register_detector("knn")
class KNN(Detector):
    """s(h) = -||h/||h|| - b_(k)||, b_(k) the k-th nearest normalised train feature (exact search by default).

    OpenOOD returns faiss' squared distance; the square root keeps the ranking and gives the paper's distance.
    """

    label = "KNN"
    reference_code = "OpenOOD openood/postprocessors/knn_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Sun et al., Out-of-Distribution Detection with Deep Nearest Neighbors, ICML 2022"

    @dataclass(frozen=True)
    class Params(Params):
        k: int = param(50, "the score is the distance to the k-th nearest train feature", ge=1)
        index: Literal["flat", "flat16", "ivf", "auto"] = param("flat",
                                                                "nearest-neighbour index (see the module docstring)")
        nprobe: int = param(16, "IVF lists searched per query", ge=1)

    search_space = {"k": [50, 100, 200, 500, 1000]}  # OpenOOD v1.5

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        if self.params["index"] not in INDEXES:
            raise ValueError(f"knn: index={self.params['index']!r} must be one of {INDEXES}")
        h = stored_features(id_train, self.name)
        index = self.params["index"]
        self.kind = ("ivf" if len(h) > AUTO_IVF_ROWS else "flat") if index == "auto" else index
        self.bank, self._source, self._index = None, None, None
        if self.kind == "flat" and len(h) * h.shape[1] * 4 > IN_MEMORY_BYTES:
            self._source = h  # searched streamed, exactly
        elif self.kind == "flat":
            self.bank = np.empty(h.shape, dtype=np.float32)
            for rows, unit in normalised_chunks(h):
                self.bank[rows] = unit
        else:
            self._index = self._quantized_index(h)

    def _quantized_index(self, h: np.ndarray):
        """faiss index with float16 storage: exhaustive ("flat16") or inverted file ("ivf"), filled chunk by chunk."""
        import faiss

        d = h.shape[1]
        if self.kind == "flat16":
            index = faiss.IndexScalarQuantizer(d, faiss.ScalarQuantizer.QT_fp16, faiss.METRIC_L2)
        else:
            nlist = max(1, min(len(h) // 39, int(round(np.sqrt(len(h))))))
            index = faiss.IndexIVFScalarQuantizer(faiss.IndexFlatL2(d), d, nlist, faiss.ScalarQuantizer.QT_fp16,
                                                  faiss.METRIC_L2)
            sample = np.unique(np.linspace(0, len(h) - 1, min(len(h), 40 * nlist)).astype(np.int64))
            index.train(l2_normalise(h[sample]))
            index.nprobe = int(self.params["nprobe"])
        for _, unit in normalised_chunks(h):
            index.add(unit)
        return index

    @property
    def size(self) -> int:
        """Number of train features in the bank."""
        if self.bank is not None:
            return len(self.bank)
        return len(self._source) if self._source is not None else int(self._index.ntotal)

    def search_index(self):
        """The faiss index to search (exact IndexFlatL2 over an in-memory bank, built once), or None when streamed."""
        import faiss

        if self._index is None and self.bank is not None:
            self._index = faiss.IndexFlatL2(self.bank.shape[1])
            self._index.add(self.bank)
        return self._index

    def kth_squared(self, queries: np.ndarray, k: int) -> np.ndarray:
        """Squared distance of each normalised query to its k-th nearest bank vector."""
        index = self.search_index()
        if index is not None:
            if self.kind == "ivf":
                index.nprobe = int(self.params["nprobe"])
            return index.search(queries, k)[0][:, -1]
        import faiss

        best = None
        for _, unit in normalised_chunks(self._source):
            best = merge_smallest(best, faiss.knn(queries, unit, min(k, len(unit)))[0], k)
        return best.max(axis=1)

    def _score(self, batch) -> np.ndarray:
        k = int(self.params["k"])
        if not 1 <= k <= self.size:
            raise ValueError(f"knn: k={k} must be between 1 and the bank size {self.size}")
        h = stored_features(batch, self.name)
        block = QUERY_BLOCK if self._source is None else max(QUERY_BLOCK, 4 * streaming.current().rows)
        kth = np.empty(len(h))
        starts = range(0, len(h), block)
        for start in progress(starts, desc="knn", disable=len(starts) <= 1, leave=False):
            rows = slice(start, start + block)
            kth[rows] = self.kth_squared(l2_normalise(h[rows]), k)
        return -np.sqrt(np.maximum(kth, 0.0))

    def state(self) -> dict[str, np.ndarray]:
        out = {**super().state(), "kind": np.frombuffer(self.kind.encode(), dtype=np.uint8).copy()}
        if self.kind == "flat":
            bank = self.bank
            if bank is None:
                bank = np.empty(self._source.shape, dtype=np.float32)
                for rows, unit in normalised_chunks(self._source):
                    bank[rows] = unit
            return {**out, "bank": bank}
        import faiss

        return {**out, "faiss_index": faiss.serialize_index(self._index)}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.kind = bytes(state["kind"]).decode() if "kind" in state else "flat"
        self.bank, self._source, self._index = None, None, None
        if "bank" in state:
            self.bank = np.ascontiguousarray(state["bank"], dtype=np.float32)
        else:
            import faiss

            self._index = faiss.deserialize_index(np.asarray(state["faiss_index"], dtype=np.uint8))
