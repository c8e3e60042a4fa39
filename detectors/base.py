"""The Detector protocol and the containers detectors read: FeatureSet, LinearHead, ImageSet."""
from __future__ import annotations

import inspect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar, Sequence

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
    """Cached model outputs for N samples: penultimate `features [N,D]`, `logits [N,C]`, `labels [N]` (any may be None)."""

    features: np.ndarray | None = None
    logits: np.ndarray | None = None
    labels: np.ndarray | None = None

    def __post_init__(self) -> None:
        # memory-mapped arrays (np.memmap, e.g. FeatureCache.load(mmap=True)) stay mapped in their stored dtype:
        # detectors read them in chunks (detectors.posthoc.streaming)
        self.features = as_numpy(self.features)
        self.logits = as_numpy(self.logits)
        self.labels = as_numpy(self.labels)
        if self.features is not None and self.features.dtype not in (np.float32, np.float64) and not memory_mapped(self.features):
            self.features = self.features.astype(np.float32)
        if self.logits is not None and self.logits.dtype not in (np.float32, np.float64) and not memory_mapped(self.logits):
            self.logits = self.logits.astype(np.float32)
        sizes = {name: len(v) for name, v in (("features", self.features), ("logits", self.logits), ("labels", self.labels)) if v is not None}
        if len(set(sizes.values())) > 1:
            raise ValueError(f"FeatureSet arrays disagree on the number of samples: {sizes}")

    def __len__(self) -> int:
        for v in (self.features, self.logits, self.labels):
            if v is not None:
                return len(v)
        return 0

    def subset(self, index: Any) -> "FeatureSet":
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
            raise ValueError(f"LinearHead needs weight [C,D] and bias [C], got {self.weight.shape} and {self.bias.shape}")

    def __call__(self, features: np.ndarray) -> np.ndarray:
        return features @ self.weight.T.astype(features.dtype, copy=False) + self.bias.astype(features.dtype, copy=False)


@dataclass
class ImageSet:
    """Images for detectors that read pixels: PIL images in memory, or a manifest's rows loaded lazily.

    `keys` identify the images for caches (manifest file names, or positions); `labels` are optional class indices.
    """

    images: Sequence[Any] | None = None
    manifest: Any = None
    labels: np.ndarray | None = None
    cache_key: str | None = None
    keys: list[str] = field(default_factory=list)

    def __post_init__(self) -> None:
        if (self.images is None) == (self.manifest is None):
            raise ValueError("ImageSet takes either `images` or `manifest`, exactly one")
        if self.manifest is not None:
            self.keys = [r["file_name"] for r in self.manifest.rows]
            if self.labels is None:
                self.labels = self.manifest.labels()
            if self.cache_key is None:
                self.cache_key = f"{self.manifest.root.name}-{self.manifest.fingerprint()}"
        else:
            self.keys = [str(i) for i in range(len(self.images))]
        self.labels = as_numpy(self.labels)

    @classmethod
    def from_manifest(cls, manifest: Any, **conditions: Any) -> "ImageSet":
        """The rows of `manifest` matching `conditions` (e.g. split="test", role="id")."""
        return cls(manifest=manifest.select(**conditions) if conditions else manifest)

    def __len__(self) -> int:
        return len(self.images) if self.images is not None else len(self.manifest)

    def load(self, index: int):
        """The RGB PIL image at `index`."""
        from pipelines.data import load_image, to_rgb

        if self.images is not None:
            return to_rgb(self.images[index])
        return load_image(self.manifest.path(self.manifest.rows[index]))

    def batches(self, batch_size: int):
        """Yield (start, list of PIL images) batches in order."""
        for start in range(0, len(self), batch_size):
            yield start, [self.load(i) for i in range(start, min(start + batch_size, len(self)))]


FIT_INPUTS = ("head", "id_val", "ood_val", "aux")
"""Optional inputs of `Detector.fit` besides the ID training data."""
RUNTIME_INPUTS = ("classifier", "class_names", "cache_dir", "device", "precision", "work_dir")
"""Runtime objects and settings a runner hands to a detector's constructor (never saved in its config.json)."""


def declared_inputs(cls: type["Detector"]) -> tuple[frozenset[str], frozenset[str]]:
    """(fit_inputs, needs) of a detector class from its `fit` and constructor signatures and its defaults."""
    fit_params = inspect.signature(cls.fit).parameters
    init_params = set(inspect.signature(cls.__init__).parameters) | set(cls.defaults)
    return frozenset(p for p in FIT_INPUTS if p in fit_params), frozenset(p for p in RUNTIME_INPUTS if p in init_params)


def check_scores(scores: Any, who: str = "detector") -> np.ndarray:
    """float64 [N] scores; NaN or infinite values raise a clear error."""
    out = as_numpy(scores, np.float64).reshape(-1)
    bad = ~np.isfinite(out)
    if bad.any():
        raise FloatingPointError(f"{who} produced {int(bad.sum())} non-finite score(s) (first at index {int(np.flatnonzero(bad)[0])})")
    return out


class Detector:
    """Base class of every detector. Scores: float64 [N], HIGHER = MORE IN-DISTRIBUTION.

    Subclasses set `name`, `family`, `inputs`, `defaults` (hyperparameters of the paper / OpenOOD v1.5) and
    `search_space` (values swept by `detectors.select`). Learned state lives in `state()` / `load_state()`
    as a dict of arrays so that `save_pretrained` / `from_pretrained` round-trip it through safetensors.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    inputs: ClassVar[frozenset[str]] = frozenset()
    paper: ClassVar[str] = ""
    defaults: ClassVar[dict[str, Any]] = {}
    search_space: ClassVar[dict[str, list[Any]]] = {}
    needs_head: ClassVar[bool] = False
    fit_inputs: ClassVar[frozenset[str]] = frozenset()  # what fit() reads besides id_train (FIT_INPUTS), set at registration
    needs: ClassVar[frozenset[str]] = frozenset()  # runtime objects the runner passes in (RUNTIME_INPUTS), set at registration
    fits_from_shards: ClassVar[bool] = False  # statistics that are sums: under accelerate each process fits its shard

    def __init__(self, **params: Any) -> None:
        unknown = set(params) - set(self.defaults)
        if unknown:
            raise TypeError(f"{self.name}: unknown parameter(s) {sorted(unknown)}; known: {sorted(self.defaults)}")
        self.params: dict[str, Any] = {**self.defaults, **params}
        self.head: LinearHead | None = None
        self.fitted = False

    def __getattr__(self, key: str) -> Any:
        params = self.__dict__.get("params")
        if params is not None and key in params:
            return params[key]
        raise AttributeError(f"{type(self).__name__!s} has no attribute {key!r}")

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    # -- protocol -------------------------------------------------------------------------------------------
    def fit(self, id_train: Any, *, head: LinearHead | None = None, id_val: Any = None, ood_val: Any = None) -> "Detector":
        """Learn whatever the method needs from ID training data (and ID/OOD validation data where it uses them)."""
        if head is not None:
            self.head = head if isinstance(head, LinearHead) else LinearHead(*head)
        if self.needs_head and self.head is None:
            raise ValueError(f"{self.name} needs the classifier's linear head: fit(..., head=LinearHead(W, b))")
        self._fit(id_train, id_val=id_val, ood_val=ood_val)
        self.fitted = True
        return self

    def _fit(self, id_train: Any, *, id_val: Any = None, ood_val: Any = None) -> None:
        """Method-specific fitting; the default has nothing to learn."""

    def score(self, batch: Any) -> np.ndarray:
        """float64 [N] scores, higher = more in-distribution."""
        return check_scores(self._score(batch), self.name)

    def _score(self, batch: Any) -> np.ndarray:
        raise NotImplementedError

    # -- state ----------------------------------------------------------------------------------------------
    def state(self) -> dict[str, np.ndarray]:
        """Learned arrays to save (override in detectors that learn something)."""
        out = {}
        if self.head is not None:
            out = {"head.weight": self.head.weight, "head.bias": self.head.bias}
        return out

    def load_state(self, state: dict[str, np.ndarray]) -> None:
        """Restore what `state()` returned."""
        if "head.weight" in state:
            self.head = LinearHead(state["head.weight"], state["head.bias"])

    def save_pretrained(self, folder: str | os.PathLike) -> Path:
        """Write `config.json` (name and parameters) and `model.safetensors` (learned state)."""
        from safetensors.numpy import save_file

        from pipelines.io import atomic_path, atomic_write_json

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "config.json", {"name": self.name, "family": self.family, "params": self.params, "fitted": self.fitted})
        state = {k: np.ascontiguousarray(v) for k, v in self.state().items()}
        with atomic_path(folder / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"detector": self.name})
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **overrides: Any) -> "Detector":
        """Rebuild a detector saved with `save_pretrained` (the registry picks the class from `config.json`)."""
        from safetensors.numpy import load_file

        from detectors.registry import detector_class

        folder = Path(folder)
        config_path = folder / "config.json"
        if not config_path.is_file():
            raise FileNotFoundError(f"{config_path} not found: not a saved detector folder")
        config = json.loads(config_path.read_text())
        klass = detector_class(config["name"]) if cls is Detector else cls
        det = klass(**{**config["params"], **overrides})
        weights = folder / "model.safetensors"
        if weights.is_file():
            det.load_state(load_file(str(weights)))
        det.fitted = bool(config.get("fitted", True))
        return det

    @classmethod
    def accepts(cls, param: str) -> bool:
        """True when the constructor or `defaults` takes `param`."""
        return param in cls.defaults or param in inspect.signature(cls.__init__).parameters
