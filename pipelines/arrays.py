"""Arrays the layers share: `FeatureSet` (cached model outputs), `LinearHead` (a classifier's last layer),
`as_numpy`."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch


def as_numpy(x: Any, dtype: Any = None) -> np.ndarray | None:
    """numpy view of an array-like or torch tensor (moved to CPU, bf16/fp16 upcast); None stays None."""
    if x is None:
        return None
    if isinstance(x, torch.Tensor):
        x = x.detach().cpu()
        if x.dtype in (torch.bfloat16, torch.float16):
            x = x.float()
        x = x.numpy()
    arr = np.asarray(x)
    return arr.astype(dtype, copy=False) if dtype is not None else arr


def memory_mapped(x: Any) -> bool:
    """True for an np.memmap or any view of one."""
    while x is not None:
        if isinstance(x, np.memmap):
            return True
        x = getattr(x, "base", None)
    return False


@dataclass
class FeatureSet:
    """Cached model outputs for N samples: penultimate `features [N,D]`, `logits [N,C]`, `labels [N]` (any may be
    None)."""

    features: np.ndarray | None = None
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        # memory-mapped arrays (np.memmap, e.g. FeatureCache.load(mmap=True)) stay mapped in their stored dtype:
        # detectors read them in chunks (detectors.posthoc.streaming)
        self.features = as_numpy(self.features)
        self.logits = as_numpy(self.logits)
        self.labels = as_numpy(self.labels)
        if (self.features is not None and self.features.dtype not in (np.float32, np.float64)
                and not memory_mapped(self.features)):
            self.features = self.features.astype(np.float32)
        if (self.logits is not None and self.logits.dtype not in (np.float32, np.float64)
                and not memory_mapped(self.logits)):
            self.logits = self.logits.astype(np.float32)
        sizes = {name: len(v) for name, v in (("features", self.features), ("logits", self.logits),
                                              ("labels", self.labels)) if v is not None}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"FeatureSet arrays disagree on the number of samples: {sizes}")

    def __len__(self) -> int:
        for v in (self.features, self.logits, self.labels):
            if v is not None:
                return len(v)
        return 0

    def subset(self, index: Any) -> FeatureSet:
        """Rows `index` (a slice, boolean mask or integer array)."""
        pick = lambda v: None if v is None else v[index]  # noqa: E731
        return FeatureSet(pick(self.features), pick(self.logits), pick(self.labels))

    def require(self, *names: str, who: str = "detector") -> None:
        """Raise a clear error when a needed array is missing."""
        missing = [n for n in names if getattr(self, n) is None]
        if missing:
            raise ValueError(f"{who} needs {', '.join(missing)} in the FeatureSet, which has none")


@dataclass
class LinearHead:
    """The classifier's last linear layer: logits = features @ weight.T + bias."""

    weight: np.ndarray
    bias: np.ndarray

    def __post_init__(self) -> None:
        self.weight = as_numpy(self.weight, np.float64)
        self.bias = as_numpy(self.bias, np.float64)
        if self.weight.ndim != 2 or self.bias.shape != (self.weight.shape[0],):
            raise ValueError(f"LinearHead needs weight [C,D] and bias [C], got {self.weight.shape} and "
                             f"{self.bias.shape}")

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return (features @ self.weight.T.astype(features.dtype, copy=False)
                + self.bias.astype(features.dtype, copy=False))
