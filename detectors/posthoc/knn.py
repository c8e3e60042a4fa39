"""Deep k-nearest neighbours (Sun et al., ICML 2022): distance to the k-th nearest L2-normalised train feature."""
from __future__ import annotations

import numpy as np
from tqdm.auto import tqdm

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import float32_features
from detectors.registry import register_detector

QUERY_BLOCK = 8192


def l2_normalise(features: np.ndarray) -> np.ndarray:
    """A contiguous float32 copy of the rows scaled to unit L2 norm (zero rows stay zero), for faiss."""
    out = np.array(features, dtype=np.float32, order="C")
    out /= np.maximum(np.linalg.norm(out, axis=1, keepdims=True), 1e-12)
    return out


@register_detector("knn")
class KNN(Detector):
    """s(h) = -||h/||h|| - b_(k)||, b_(k) the k-th nearest normalised train feature (exact search, faiss IndexFlatL2).

    OpenOOD returns faiss' squared distance; the square root keeps the ranking and gives the paper's distance.
    """

    family = "posthoc"
    inputs = frozenset({"features"})
    paper = "Sun et al., Out-of-Distribution Detection with Deep Nearest Neighbors, ICML 2022"
    defaults = {"k": 50}
    search_space = {"k": [50, 100, 200, 500, 1000]}

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        self.bank = l2_normalise(float32_features(id_train, self.name))
        self._index = None

    def index(self):
        """The exact faiss index over the bank (built once per detector)."""
        import faiss

        if getattr(self, "_index", None) is None:
            self._index = faiss.IndexFlatL2(self.bank.shape[1])
            self._index.add(self.bank)
        return self._index

    def _score(self, batch) -> np.ndarray:
        k = int(self.k)
        if not 1 <= k <= len(self.bank):
            raise ValueError(f"knn: k={k} must be between 1 and the bank size {len(self.bank)}")
        queries = l2_normalise(float32_features(batch, self.name))
        index = self.index()
        kth = np.empty(len(queries))
        starts = range(0, len(queries), QUERY_BLOCK)
        for start in tqdm(starts, desc="knn", disable=len(starts) <= 1, leave=False):
            squared, _ = index.search(queries[start:start + QUERY_BLOCK], k)
            kth[start:start + QUERY_BLOCK] = squared[:, -1]
        return -np.sqrt(np.maximum(kth, 0.0))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "bank": self.bank}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.bank = np.ascontiguousarray(state["bank"], dtype=np.float32)
        self._index = None
