"""CF-OOD (Angiulli, Fassetti and Zupi, 2026): the concentration-free outlier factor (CFOF) of a sample among the ID
training features, negated.

OpenOOD (`openood/postprocessors/cfood_postprocessor.py`) L2-normalises the training features (`:95`, h / (||h|| +
1e-10)), keeps a random int(alpha N) of them as the reference set (`:97-107`, `torch.randperm`), and tabulates each
reference row's squared distance to its kappa-th nearest other reference row on a fixed grid of fractions kappa
(`:110-132`: 0.001 ... 0.99, positions int(kappa n - 1) deduplicated). A sample's CFOF is the smallest kappa at which
at least a fraction k of the reference rows have it within their kappa-neighbourhood (`:160-173`, 1 where none), and
the score is -CFOF (`:177`), with alpha 0.1, k 0.01 and APS off (`configs/postprocessors/cfood.yml:3, 8-9`; its
sweep `:12-30` pairs alpha 0.1, 0.5, 1 with k 0.001, 0.005, 0.01, 0.05).

Distances here are ||a||^2 + ||b||^2 - 2 <a, b> in float64 through BLAS (the reference subtracts row by row in
float32), those below `DUPLICATE` counted as 0 so that repeated rows tie exactly as there. Each reference row's table
is nondecreasing along the grid, so a sample's counts come from one binary search per reference row.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc import streaming
from detectors.posthoc.common import stored_features
from detectors.registry import register_detector
from pipelines.params import Params, param

DUPLICATE = 1e-12
"""Squared distances of unit rows below this are 0: float64 rounding of the expansion, not distance (distinct float32
unit rows this close differ by under 1e-6)."""
BLOCK_ENTRIES = 1 << 22
"""Distances held at once (rows x reference rows, float64): 32 MiB."""


def kappa_grid(n: int) -> tuple[np.ndarray, np.ndarray]:
    """(kappa, position): the reference's fractions 0.001 ... 0.99 and the sorted-distance positions int(kappa n - 1),
    keeping the first fraction of each position (cfood_postprocessor.py:110-122)."""
    kval = np.concatenate((np.linspace(0.001, 0.1, 100), np.linspace(0.105, 0.5, 81), np.linspace(0.51, 0.99, 49)))
    kpos = np.array(kval * n - 1, dtype=int)
    keep = np.concatenate(([True], kpos[:-1] < kpos[1:]))
    return kval[keep], kpos[keep]


def unit_rows(h: np.ndarray) -> np.ndarray:
    """Rows over (||h|| + 1e-10), float32 (the reference's normalisation; a zero row stays zero)."""
    h = np.asarray(h, dtype=np.float32)
    return h / (np.linalg.norm(h, axis=1, keepdims=True) + np.float32(1e-10))


def squared_distances(a: np.ndarray, b: np.ndarray, b_sq: np.ndarray) -> np.ndarray:
    """||a_i - b_j||^2 [len(a), len(b)] in float64, those below `DUPLICATE` set to 0."""
    a = a.astype(np.float64)
    d = np.einsum("nd,nd->n", a, a)[:, None] + b_sq[None, :] - 2.0 * (a @ b.T)
    d[d < DUPLICATE] = 0.0
    return d


def neighbour_table(ref: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """[n, len(positions)]: each reference row's squared distances to the others sorted, read at positions + 1 (the
    row itself, at distance 0, comes first)."""
    ref64 = ref.astype(np.float64)
    sq = np.einsum("nd,nd->n", ref64, ref64)
    out = np.empty((len(ref), len(positions)))
    rows = max(1, BLOCK_ENTRIES // len(ref))
    for start in range(0, len(ref), rows):
        d = squared_distances(ref64[start:start + rows], ref64, sq)
        out[start:start + rows] = np.partition(d, positions + 1, axis=1)[:, positions + 1]
    return out


def cfof(queries: np.ndarray, ref: np.ndarray, ref_sq: np.ndarray, table: np.ndarray, kval: np.ndarray,
         k: float) -> np.ndarray:
    """The smallest kappa whose count, the fraction of reference rows i with table[i, kappa] >= d(query, i), reaches
    k (float32 fraction and threshold, as the reference compares them), 1 where none does."""
    n, klen = table.shape
    out = np.empty(len(queries))
    rows = max(1, BLOCK_ENTRIES // n)
    for start in range(0, len(queries), rows):
        d = squared_distances(queries[start:start + rows], ref, ref_sq)
        # first grid index where reference row i reaches the query: table rows are nondecreasing
        first = np.empty(d.shape, dtype=np.int64)
        for i in range(n):
            first[:, i] = np.searchsorted(table[i], d[:, i], side="left")
        b = len(d)
        hist = np.bincount((np.arange(b)[:, None] * (klen + 1) + first).ravel(), minlength=b * (klen + 1))
        counts = np.cumsum(hist.reshape(b, klen + 1)[:, :klen], axis=1)
        reached = counts.astype(np.float32) / np.float32(n) >= np.float32(k)
        hit = reached.any(axis=1)
        out[start:start + b] = np.where(hit, kval[np.argmax(reached, axis=1)], 1.0)
    return out


@register_detector("cfood")
class CFOOD(Detector):
    """s(x) = -CFOF(x): minus the smallest neighbourhood fraction kappa at which a fraction k of the (subsampled) unit
    ID training rows count x among their kappa n nearest neighbours."""

    label = "CF-OOD"
    reference_code = "OpenOOD openood/postprocessors/cfood_postprocessor.py"
    family = "posthoc"
    inputs = frozenset({"features"})
    paper = ("Angiulli, Fassetti and Zupi, CF-OOD: Concentration-Free Density Estimation for Reliable "
             "Out-of-Distribution Detection, 2026")

    @dataclass(frozen=True)
    class Params(Params):
        alpha: float = param(0.1, "fraction of the training rows drawn as the reference set (cfood.yml:8)", gt=0, le=1)
        k: float = param(0.01, "fraction of reference rows that must hold the sample in their neighbourhood "
                         "(cfood.yml:9)", ge=0, le=1)
        seed: int = param(0, "seed of the reference rows' draw (the reference: torch.randperm, unseeded)")

    search_space = {"alpha": [0.1, 0.5, 1], "k": [0.001, 0.005, 0.01, 0.05]}  # cfood.yml:12-30, all 12 pairs
    grids = {"openood_v1.5": {}}  # cfood.yml:3: APS_mode false, the defaults run

    def reference_rows(self, n_train: int) -> np.ndarray:
        """Rows of the training set kept: int(alpha N) drawn with `seed` (all of them at alpha 1), increasing."""
        if self.params["alpha"] >= 1.0:
            return np.arange(n_train)
        order = np.random.default_rng(self.params["seed"]).permutation(n_train)
        return np.sort(order[:int(self.params["alpha"] * n_train)])

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        rows = self.reference_rows(len(h))
        if len(rows) < 2:
            raise ValueError(f"cfood: the reference set needs at least 2 rows (int(alpha N) = {len(rows)} of "
                             f"N = {len(h)}): each row's neighbours exclude itself")
        self.ref = unit_rows(np.asarray(h[rows]))
        self.kval, positions = kappa_grid(len(rows))
        self.table = neighbour_table(self.ref, positions)

    def _score(self, batch) -> np.ndarray:
        ref64 = self.ref.astype(np.float64)
        ref_sq = np.einsum("nd,nd->n", ref64, ref64)
        k = self.params["k"]
        return -streaming.map_rows(lambda _, h: cfof(unit_rows(h), ref64, ref_sq, self.table, self.kval, k),
                                   stored_features(batch, self.name))

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "ref": self.ref, "kval": self.kval, "table": self.table}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.ref, self.kval, self.table = state["ref"], state["kval"], state["table"]
