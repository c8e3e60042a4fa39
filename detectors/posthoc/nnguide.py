"""NNGuide (Park et al., ICCV 2023): the energy guided by the mean of the k largest inner products with a bank of
L2-normalised training features scaled by their energies.

The official code (roomo7time/nnguide at c123cac): features L2-normalised (`model_engines/assets.py:20`), the bank
= normalised train features times logsumexp of their logits (`ood_detectors/nnguide.py:22-23`) on a random 1% of the
training set (`dataloaders/factory.py:185-189`, `subsample` `:204-217`), guidance = the mean of the k = 10
(`configs/detector/nnguide.yaml:4`) largest inner products (`ood_detectors/assets.py:5-19`, faiss `IndexFlatIP`),
score = guidance times the energy (`ood_detectors/nnguide.py:29-32`). pytorch-ood 0.4.0's port (`ai_coded`) banks all
of the fit rows (`bank_fraction: 1.0` here).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from detectors.base import Detector, FeatureSet
from detectors.posthoc.common import logsumexp, stored_features, stored_logits
from detectors.posthoc.threads import map_blocks
from detectors.registry import register_detector
from pipelines.params import Params, param


def normalised(h: np.ndarray) -> np.ndarray:
    """Rows over their L2 norm in float32 (a zero row stays zero, as torch's F.normalize)."""
    h = np.asarray(h, dtype=np.float32)
    return h / np.maximum(np.linalg.norm(h, axis=1, keepdims=True), np.float32(1e-12))


def bank_rows(n: int, fraction: float, k: int, seed: int) -> np.ndarray:
    """The rows banked: a random int(n * fraction) of n (the reference's subsample), at least k, all when fraction is
    1, in increasing order."""
    if fraction >= 1.0:
        return np.arange(n)
    size = min(n, max(int(n * fraction), k))
    return np.sort(np.random.default_rng(seed).permutation(n)[:size])


def top_k_mean(queries: np.ndarray, bank: np.ndarray, k: int) -> np.ndarray:
    """Mean of the k largest inner products of each query row with the bank rows (float32 products, float64 mean)."""
    sims = queries @ bank.T
    if k < sims.shape[1]:
        sims = np.partition(sims, sims.shape[1] - k, axis=1)[:, -k:]
    return sims.mean(axis=1, dtype=np.float64)


@register_detector("nnguide")
class NNGuide(Detector):
    """s(x) = mean of the k largest <f(x)/||f(x)||, E(z) f(z)/||f(z)||> over the bank z, times E(x) = logsumexp(z)."""

    label = "NNGuide"
    reference_code = "roomo7time/nnguide ood_detectors/nnguide.py"
    family = "posthoc"
    inputs = frozenset({"features", "logits"})
    paper = "Park et al., Nearest Neighbor Guidance for Out-of-Distribution Detection, ICCV 2023"

    @dataclass(frozen=True)
    class Params(Params):
        k: int = param(10, "nearest bank rows averaged (configs/detector/nnguide.yaml:4)", ge=1)
        bank_fraction: float = param(0.01, "fraction of the training rows banked (the official 1%, "
                                     "dataloaders/factory.py:185; at least k rows; 1: all, as pytorch-ood)",
                                     gt=0, le=1)
        seed: int = param(0, "seed of the banked rows' draw")

    def _fit(self, id_train: FeatureSet, *, id_val=None, ood_val=None) -> None:
        h = stored_features(id_train, self.name)
        k = self.params["k"]
        if len(h) < k:
            raise ValueError(f"nnguide: k={k} needs at least {k} training rows, got {len(h)}")
        rows = bank_rows(len(h), self.params["bank_fraction"], k, self.params["seed"])
        energy = logsumexp(stored_logits(id_train, self.name)[rows], axis=1)  # the banked rows only, in float64
        self.bank = (normalised(h[rows]) * energy[:, None].astype(np.float32)).astype(np.float32)

    def _score(self, batch) -> np.ndarray:
        """Per block of rows (`threads.map_blocks`: read-only views, on a thread per core): the normalised rows'
        products with the bank and their top-k mean while the block is in cache, and the block's float64 energy in
        this thread meanwhile; row by row the same arithmetic (and bits) as on the whole array."""
        h, z = stored_features(batch, self.name), stored_logits(batch, self.name)
        if len(z) != len(h):
            raise ValueError(f"nnguide: {len(h)} feature rows but {len(z)} logit rows")
        out = np.empty(len(h))
        for part, guidance in map_blocks(lambda block: top_k_mean(normalised(block), self.bank, self.params["k"]), h,
                                         np.float32):
            out[part] = guidance * logsumexp(z[part], axis=1)
        return out

    def state(self) -> dict[str, np.ndarray]:
        return {**super().state(), "bank": self.bank}

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        super().load_state(state)
        self.bank = state["bank"]
