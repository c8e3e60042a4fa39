"""The Detector protocol and the containers detectors read: FeatureSet, LinearHead (from pipelines.arrays), ImageSet."""
from __future__ import annotations

import inspect
import json
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

import pipelines.params
from pipelines.arrays import FeatureSet, LinearHead, as_numpy, memory_mapped
from pipelines.checkpoints import check_safetensors

__all__ = ["FIT_INPUTS", "RUNTIME_INPUTS", "Detector", "FeatureSet", "ImageSet", "LinearHead", "as_numpy",
           "check_scores", "memory_mapped"]

@dataclass
class ImageSet:
    """Images for detectors that read pixels: PIL images in memory, or a manifest's rows loaded lazily.

    `keys` identify the images for caches (manifest file names, or positions); `labels` are optional class indices.
    `pixels` is the transform its rows are made with when not the classifier's evaluation pixels (the fit pixels of ID
    train rows, `pipelines.pixels`), drawn per (`seed`, row `offset + i`); `num_workers` loader workers make them
    (None: `pipelines.pixels.default_workers()`).
    """

    images: Sequence[Any] | None = None
    manifest: Any = None
    labels: np.ndarray | None = None
    cache_key: str | None = None
    keys: list[str] = field(default_factory=list)
    pixels: Any = None
    seed: int = 0
    num_workers: int | None = 0
    offset: int = 0

    def __post_init__(self) -> None:
        if (self.images is None) == (self.manifest is None):
            raise ValueError("ImageSet takes either `images` or `manifest`, exactly one")
        if self.manifest is not None:
            self.keys = [r["file_name"] for r in self.manifest.rows]
            if self.labels is None:
                self.labels = self.manifest.labels()
            if self.cache_key is None:
                self.cache_key = f"{self.manifest.root.name}-{self.manifest.fingerprint()}"
                if self.pixels is not None:  # rows made with their own pixels: another content
                    from pipelines.fingerprint import combine

                    self.cache_key += "-" + combine(self.pixels_identity())[:12]
        else:
            self.keys = [str(i) for i in range(len(self.images))]
        self.labels = as_numpy(self.labels)

    @classmethod
    def from_manifest(cls, manifest: Any, **conditions: Any) -> ImageSet:
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

    def pixels_identity(self) -> Any:
        """What decides its own pixels (None: the classifier's evaluation pixels decide)."""
        if self.pixels is None:
            return None
        return {"pixels": self.pixels.identity() if hasattr(self.pixels, "identity") else repr(self.pixels),
                "seed": self.seed}

    def pixel_batches(self, pixels: Any, batch_size: int):
        """Yield (start, tensor [b,3,H,W]) batches in order, not yet normalised: `self.pixels` or else `pixels` (a
        `pipelines.pixels` transform) of each image, made in `num_workers` loader workers for manifest rows. A row that
        does not load raises `ImageLoadError` (runners probe their rows first)."""
        import torch

        from pipelines.data import ImageLoadError
        from pipelines.features import ManifestPixels, pixel_loader

        pixels = self.pixels if self.pixels is not None else pixels
        if self.images is not None:
            for start in range(0, len(self), batch_size):
                rows = range(start, min(start + batch_size, len(self)))
                yield start, torch.stack([pixels(self.images[i], np.random.default_rng([self.seed, self.offset + i]))
                                          for i in rows])
            return
        dataset = ManifestPixels(self.manifest, list(range(len(self))), pixels, self.seed, self.offset)
        start = 0
        for positions, x, failed in pixel_loader(dataset, batch_size, self.num_workers):
            if failed:
                position, reason = failed[0]
                raise ImageLoadError(self.manifest.path(self.manifest.rows[position]), reason)
            yield start, x
            start += len(positions)

    def rows(self, start: int, stop: int) -> ImageSet:
        """The images start..stop (manifest-backed or in memory), with their labels and pixels."""
        labels = None if self.labels is None else self.labels[start:stop]
        common = dict(labels=labels, pixels=self.pixels, seed=self.seed, num_workers=self.num_workers,
                      offset=self.offset + start)
        if self.images is not None:
            return ImageSet(images=list(self.images[start:stop]), **common)
        return ImageSet(manifest=type(self.manifest)(self.manifest.root, self.manifest.rows[start:stop]), **common)


FIT_INPUTS = ("head", "id_val", "ood_val", "aux")
"""Optional inputs of `Detector.fit` besides the ID training data (a detector declares those it reads in
`fit_inputs`)."""
RUNTIME_INPUTS = ("classifier", "class_names", "cache_dir", "device", "precision", "work_dir")
"""Runtime objects and settings a runner hands to a detector's constructor (declared in `needs`; never saved in its
config.json, except CLIP class names, which its prompts are made of)."""
PROTOCOL_FIT = ("head", "id_val", "ood_val")
"""What the base `Detector.fit` accepts: every detector takes these, whether or not it reads them."""


def check_scores(scores: Any, who: str = "detector") -> np.ndarray:
    """float64 [N] scores; NaN or infinite values raise a clear error."""
    out = as_numpy(scores, np.float64).reshape(-1)
    bad = ~np.isfinite(out)
    if bad.any():
        raise FloatingPointError(f"{who} produced {int(bad.sum())} non-finite score(s) (first at index "
                                 f"{int(np.flatnonzero(bad)[0])})")
    return out


class Detector:
    """Base class of every detector. Scores: float64 [N], HIGHER = MORE IN-DISTRIBUTION.

    Subclasses set `name`, `family`, `label`, `inputs`, a frozen dataclass `Params` of hyperparameters (the paper's /
    OpenOOD v1.5's defaults, types and ranges: `pipelines.params`), `fit_inputs` (what `fit` reads, a subset of
    FIT_INPUTS), `needs` (runtime objects the constructor takes, a subset of RUNTIME_INPUTS), `search_space`
    (OpenOOD v1.5's sweep, used by `detectors.select`), and where a protocol's reference differs, `grids` and
    `protocol_defaults`: every fact about a method is on its class. The registry checks these declarations against
    `fit` and `__init__`. `self.params` is a dict of every parameter, the one way to read them (`self.params[k]`: the
    mapping that is saved, loaded and recorded; no attribute stands for a parameter); `hyperparameters` leaves the
    runtime settings out. Learned state lives in `state()` / `load_state()` as a dict of arrays so that
    `save_pretrained` / `from_pretrained` round-trip it through safetensors.
    """

    name: ClassVar[str] = ""
    family: ClassVar[str] = ""
    inputs: ClassVar[frozenset[str]] = frozenset()
    paper: ClassVar[str] = ""
    label: ClassVar[str] = ""
    """The method's name in rendered tables (the papers' spelling), set on each registered class itself."""
    reference_code: ClassVar[str] = ""
    aliases: ClassVar[dict[str, str]] = {}
    """Names other libraries give the method -> whose names they are ("pytorch-ood's", "OpenOOD's"): `detectors.build`
    and configs resolve them in any case, with a one-time note; read from the class itself, never a parent."""
    """The reference code its defaults and grids are read from (repository and file; lines in docs/references.md)."""
    Params: ClassVar[type[pipelines.params.Params]] = pipelines.params.Params
    defaults: ClassVar[dict[str, Any]] = {}  # derived from Params (every field's default)
    search_space: ClassVar[dict[str, list[Any]]] = {}
    grids: ClassVar[dict[str, dict[str, list[Any]] | None]] = {}
    """protocol -> the grid that protocol's reference sweeps where it is not `search_space`: `{}` runs the defaults
    (APS off), None runs them without a grid though `detectors.select` still sweeps `search_space` (no postprocessor
    config). `detectors.harness.protocols` reads it; a protocol without an entry takes its parent's
    (`open-insects` and `exact` take `openood_v1.5`'s)."""
    protocol_defaults: ClassVar[dict[str, dict[str, Any]]] = {}
    """protocol -> the parameter defaults that protocol's reference runs where they differ from `Params`' (a config's
    own `params` win; a protocol without an entry takes its parent's, as `grids`)."""
    needs_head: ClassVar[bool] = False
    fit_inputs: ClassVar[frozenset[str]] = frozenset()
    needs: ClassVar[frozenset[str]] = frozenset()
    fits_from_shards: ClassVar[bool] = False  # statistics that are sums: under accelerate each process fits its shard
    trains_across_processes: ClassVar[bool] = False  # fit trains with accelerate on every process together (DDP)
    class_of: ClassVar[Callable[[str], type[Detector]] | None] = None  # set by detectors.registry (no import here)
    runs_by_name: ClassVar[bool] = True
    """Whether the detector runs from its name and defaults alone; `detectors: all` takes only those (a deep ensemble's
    members are the user's own trained classifiers: named in its entry, never guessed)."""
    keeps_batches: ClassVar[bool] = False
    """Scores images slowly: with a `work_dir` (a runtime input, then in `needs`), `score` of a manifest's images keeps
    each finished batch (`pipelines.batches`), so a killed rerun resumes within a set."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.defaults = cls.Params.defaults()
        if cls.keeps_batches:
            cls.needs = frozenset(cls.needs) | {"work_dir"}

    def __init__(self, **params: Any) -> None:
        self.batches_dir = params.pop("work_dir", None) if self.keeps_batches else None
        try:
            self.refuse_unknown(params, set(self.Params.fields()))
        except ValueError as err:
            raise TypeError(str(err)) from None
        self.params: dict[str, Any] = self._validated(params).as_dict()
        self.head: LinearHead | None = None
        self.fitted = False

    @classmethod
    def _validated(cls, params: dict[str, Any], dims: dict[str, int] | None = None) -> pipelines.params.Params:
        try:
            values = cls.Params(**params)
            if dims:
                values.check(dims)
        except ValueError as err:
            raise ValueError(f"{cls.name}: {err}") from None
        return values

    @classmethod
    def check_params(cls, params: dict[str, Any], dims: dict[str, int] | None = None) -> None:
        """Raise ValueError naming the parameter and what is allowed: unknown names, wrong types, values out of range
        (bounds on the feature dimension D or the number of classes C apply when `dims` = {"features": D,
        "classes": C} gives them)."""
        cls.refuse_unknown(params, set(cls.Params.fields()) | cls.init_arguments(), shown=set(cls.Params.fields()))
        cls._validated({k: v for k, v in params.items() if k in cls.Params.fields()}, dims)

    @classmethod
    def refuse_unknown(cls, params: dict[str, Any], known: set[str], shown: set[str] | None = None) -> None:
        """The one unknown-parameter check: ValueError naming the unknown names and the known ones (`shown`: those to
        list, the parameters without the runtime objects a runner passes)."""
        unknown = set(params) - known
        if unknown:
            listed = sorted(known if shown is None else shown)
            raise ValueError(f"{cls.name}: unknown parameter(s) {sorted(unknown)}; known: {listed}")

    @classmethod
    def check_files(cls, params: dict[str, Any]) -> None:
        """Raise ValueError naming every model file the parameters name and lack (nothing is loaded). The plan calls it
        after `check_params`; most detectors need no file."""

    @classmethod
    def init_arguments(cls) -> set[str]:
        """Keyword arguments the constructor takes besides the Params fields (runtime objects: classifier, model
        ...)."""
        named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        taken = {p for p, v in inspect.signature(cls.__init__).parameters.items() if p != "self" and v.kind in named}
        return taken | ({"work_dir"} if cls.keeps_batches else set())

    @property
    def hyperparameters(self) -> dict[str, Any]:
        """The parameters that decide the scores (runtime settings left out): what `config.json` and results rows
        record."""
        runtime = self.Params.runtime()
        return {k: v for k, v in self.params.items() if k not in runtime}

    def effective_params(self) -> dict[str, Any]:
        """`hyperparameters` with the values a fit settled filled in (a None default resolved, a fitted temperature):
        what a results row records."""
        return {**self.hyperparameters, **self.resolved_params()}

    def resolved_params(self) -> dict[str, Any]:
        """Parameters whose value the fit decided (override where a default is resolved from the data)."""
        return {}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.params.items())
        return f"{type(self).__name__}({args})"

    # -- protocol -------------------------------------------------------------------------------------------
    def fit(self, id_train: Any, *, head: LinearHead | None = None, id_val: Any = None,
            ood_val: Any = None) -> Detector:
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
        """float64 [N] scores, higher = more in-distribution (a manifest's images in kept batches: `keeps_batches`)."""
        if self.batches_dir is not None and isinstance(batch, ImageSet) and batch.manifest is not None:
            return check_scores(self._kept_scores(batch), self.name)
        return check_scores(self._score(batch), self.name)

    def _kept_scores(self, batch: ImageSet) -> np.ndarray:
        """`_score` batch by batch (the detector's batch size, times the processes sharing it), each batch's scores
        kept in `work_dir` under the detector's identity and the images' (`pipelines.batches`)."""
        from pipelines.batches import kept_batches
        from pipelines.collectives import sharing
        from pipelines.fingerprint import images_fingerprint

        size = self.__dict__.get("batch_size", self.params.get("batch_size"))  # a constructor argument or a parameter
        chunk = int(size or 1) * sharing()
        identity = {**self.batch_identity(), "images": images_fingerprint(batch.manifest)}
        if batch.pixels is not None:  # rows made with their own pixels (fit pixels), not the classifier's
            identity["pixels"] = batch.pixels_identity()
        return kept_batches(self.batches_dir, identity, batch.keys, chunk,
                            lambda start, stop: self._score(batch.rows(start, stop)))

    def batch_identity(self) -> dict[str, Any]:
        """What decides this detector's scores of given images, for its kept batches: name, every parameter, the
        learned state and the classifier's weights and preprocessing (detectors with other models add theirs)."""
        import hashlib

        from pipelines.fingerprint import preprocessing_fingerprint, weights_fingerprint

        state = [[k, str(v.dtype), list(v.shape), hashlib.sha256(np.ascontiguousarray(v).tobytes()).hexdigest()]
                 for k, v in sorted((k, as_numpy(v)) for k, v in self.state().items())]
        identity: dict[str, Any] = {"detector": self.name, "params": self.params, "state": state,
                                    **{k: str(self.__dict__[k]) for k in ("device", "precision") if k in self.__dict__}}
        classifier = self.__dict__.get("classifier")
        if classifier is not None and hasattr(classifier, "state_dict"):
            identity["classifier"] = [weights_fingerprint(classifier), preprocessing_fingerprint(classifier)]
        return identity

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
        """Write `config.json` (name and hyperparameters, runtime settings left out) and `model.safetensors` (learned
        state)."""
        from safetensors.numpy import save_file

        from pipelines.io import atomic_path, atomic_write_json

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write_json(folder / "config.json",
                          {"name": self.name, "family": self.family, "params": self.hyperparameters,
                                                   "fitted": self.fitted})
        state = {k: np.ascontiguousarray(v) for k, v in self.state().items()}
        with atomic_path(folder / "model.safetensors") as tmp:
            save_file(state, str(tmp), metadata={"detector": self.name})
        return folder

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike, **overrides: Any) -> Detector:
        """Rebuild a detector saved with `save_pretrained`; `overrides` add runtime objects (classifier, device ...) or
        change parameters. On `Detector` itself the class is the one `config.json` names (`detectors.load`). A released
        weight file (`pipelines.zoo`: the Open-Insect model zoo's `<method>_<region>.pth`) loads through
        `from_released`."""
        from safetensors.numpy import load_file

        from pipelines.zoo import is_released_file

        if is_released_file(folder) and cls is not Detector:
            return cls.from_released(folder, **overrides)
        config = read_config(folder)
        klass = cls
        if cls is Detector:
            if Detector.class_of is None:
                raise RuntimeError("no detector registry loaded: use detectors.load(folder)")
            klass = Detector.class_of(config["name"])
        det = klass(**{**config["params"], **overrides})
        weights = Path(folder) / "model.safetensors"
        if weights.is_file():
            check_safetensors(weights)  # a header that does not fit the file: one line, not a SafetensorError
            det.load_state(load_file(str(weights)))
        det.fitted = bool(config.get("fitted", True))
        return det

    @classmethod
    def from_released(cls, path: str | os.PathLike, **overrides: Any) -> Detector:
        """The detector fitted from a released weight file of its method, evaluation only (no training); a method
        with a released network overrides this and `check_released`."""
        raise ValueError(f"{cls.name}: {os.fspath(path)} is a released weight file, but no released network loads as "
                         f"{cls.name} (load a folder written by save_pretrained)")

    @classmethod
    def check_released(cls, path: str | os.PathLike) -> None:
        """Check a released weight file as `from_released` reads it (names, tensors, keys); a method with a released
        network checks without building models, any other refuses as `from_released` does."""
        cls.from_released(path)

    @classmethod
    def accepts(cls, param: str) -> bool:
        """True when the constructor takes `param` (a Params field or a constructor argument)."""
        return param in cls.Params.fields() or param in cls.init_arguments()


def read_config(folder: str | os.PathLike) -> dict[str, Any]:
    """The `config.json` of a saved detector folder, with a clear error when there is none."""
    config_path = Path(folder) / "config.json"
    if not config_path.is_file():
        raise FileNotFoundError(f"{config_path} not found: not a saved detector folder")
    return json.loads(config_path.read_text())
