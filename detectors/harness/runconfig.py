"""The evaluation config as one typed value (README: Evaluation): `EvalConfig.from_dict(raw, where)` or
`EvalConfig.from_yaml(path, overrides)` is the only parse, built on `pipelines.params.Config`.

Every section is a frozen dataclass with defaults, ranges and one-line docs; every fault (an unknown key with its
closest match, a wrong type, a value out of range, a local model path that does not exist, an unknown detector or
parameter) is one `ConfigError` naming the dotted key, before any model loads. A detector entry is resolved to its
registered class once, and its `params` are converted and checked by that class (`Detector.check_params`) once.
"""
from __future__ import annotations

import importlib
from typing import Any, Literal

from detectors.base import Detector
from detectors.harness.protocols import PROTOCOLS, TIE_RULES
from detectors.harness.results import METRICS
from detectors.registry import FAMILIES, detector_class
from pipelines.errors import ConfigError
from pipelines.fingerprint import IDENTITY_MODES
from pipelines.params import REQUIRED, Config, config, convert, param, plain
from pipelines.pixels import PixelSettings
from pipelines.runtime import PRECISIONS, check_device, check_model_ref
from pipelines.sources import Source
from pipelines.training.loop import CHECKPOINT_CHOICES
from pipelines.zoo import CLASSIFIER_NETWORKS

__all__ = ["ConfigError", "DetectorSpec", "EvalConfig", "FewShot", "Head", "RuleSpec", "Select", "Source", "Transfer",
           "typed_params"]

DOC = "README.md, section 'Evaluation'"
Family = Literal[FAMILIES]  # type: ignore[valid-type]
Metric = Literal[METRICS]  # type: ignore[valid-type]
Protocol = Literal[tuple(PROTOCOLS)]  # type: ignore[valid-type]
TieRule = Literal[TIE_RULES]  # type: ignore[valid-type]
Checkpoint = Literal[CHECKPOINT_CHOICES]  # type: ignore[valid-type]
CacheHash = Literal[IDENTITY_MODES]  # type: ignore[valid-type]
Precision = Literal[PRECISIONS]  # type: ignore[valid-type]
ModelNetwork = Literal[CLASSIFIER_NETWORKS]  # type: ignore[valid-type]
FEATURE_INPUTS = frozenset({"features", "logits"})
SHARD_FIT_ROWS = 1_000_000  # ID train rows from which, with several processes, sum-statistics fits are sharded
"""The inputs of a feature-level detector (scored on cached features / logits, or a rule on a trained model's)."""


def typed_params(cls: type[Detector], raw: dict[str, Any], where: str) -> dict[str, Any]:
    """`raw` as `cls`'s parameters: each known field converted to its annotated type (`1` -> `1.0` for a float), then
    `cls.check_params` (unknown names, types, ranges, the detector's own value checks); a fault is one ConfigError
    naming `where.<parameter>`."""
    hints = cls.Params.hints()
    values = {k: convert(v, hints[k], f"{where}.{k}") if k in hints else v for k, v in raw.items()}
    try:
        cls.check_params(values)
    except ValueError as err:
        raise ConfigError(f"{where}.{param_named(err, values)}: {named(err, cls.name)}", doc=DOC) from None
    return values


def named(err: Exception, name: str) -> str:
    """The error's message, starting with the detector's name once."""
    text = str(err)
    return text if text.startswith(f"{name}:") else f"{name}: {text}"


STRIP = "`'\",.;[]()"


def param_named(err: Exception, params: dict[str, Any]) -> str:
    """The parameter an error names (its first word that is a parameter), else 'value'."""
    words = str(err).replace(":", " ").replace("=", " ").split()
    return next((w.strip(STRIP) for w in words if w.strip(STRIP) in params), "value")


def _key(where: str, key: str) -> str:
    return f"{where}.{key}" if where else key


def _detector(name: str, where: str) -> type[Detector]:
    try:
        return detector_class(name)
    except KeyError as err:
        raise ConfigError(f"{where}: {err.args[0]}", doc=DOC) from None


def params_outside(cls: type[Config], raw: Any, where: str) -> None:
    """One ConfigError for a detector's parameter written beside `name` (`{name: knn, k: 10}`), saying to write it
    under `params:`; nothing when every key is the entry's own or the name is not a detector."""
    if not isinstance(raw, dict) or not isinstance(raw.get("name"), str):
        return
    stray = [k for k in raw if k not in cls.fields()]
    try:
        known = detector_class(raw["name"]).Params.hints()
    except (KeyError, AttributeError):
        return
    misplaced = {k: raw[k] for k in stray if k in known}
    if misplaced:
        first = next(iter(misplaced))
        shown = ", ".join(f"{k}: {v!r}" if isinstance(v, str) else f"{k}: {v}" for k, v in misplaced.items())
        raise ConfigError(f"{where}.{first}: unknown key; {first!r} is a parameter of {raw['name']}: write it under "
                          f"params ({{name: {raw['name']}, params: {{{shown}}}}})", doc=DOC)


@config
class RuleSpec(Config):
    """A post-hoc rule re-scoring a training-time method's trained model (a bare name: its defaults)."""

    DOC = DOC
    SHORTHAND = "name"

    name: str = param(REQUIRED, "a feature-level post-hoc detector (msp, ebo, vim, knn, ...)")
    params: dict[str, Any] = param({}, "the rule's parameters over its defaults (and the protocol's)")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "rule") -> RuleSpec:
        params_outside(cls, raw, where)
        made = super().from_dict(raw, where)
        rule = _detector(made.name, f"{where}.name")
        if rule.family != "posthoc" or not frozenset(rule.inputs) <= FEATURE_INPUTS:
            raise ConfigError(f"{where}: {made.name!r} is not a feature-level post-hoc detector", doc=DOC)
        return cls(name=rule.name, params=typed_params(rule, made.params, f"{where}.params"))


@config
class DetectorSpec(Config):
    """A detector entry (a bare name: its defaults): registry name, parameters, a saved state folder, a label, and
    post-hoc `rules` that re-score a training-time method's trained model (rows `<label>+<rule>`)."""

    DOC = DOC
    SHORTHAND = "name"

    name: str = param(REQUIRED, "the registered detector name (detectors.available())")
    params: dict[str, Any] = param({},
                                   "parameters over the detector's defaults (and the protocol's); checked by its "
                                   "Params")
    load: str | None = param(None, "a folder written by save_pretrained, or a released weight file of the method (the "
                                   "Open-Insect zoo's <method>_<region>.pth, pipelines.zoo): loaded instead of fitting")
    label: str | None = param(None, "the method name of its result rows (default: name)")
    rules: list[RuleSpec] = param([], "post-hoc rules re-scoring a training-time method's trained model")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "detector") -> DetectorSpec:
        params_outside(cls, raw, where)
        made = super().from_dict(raw, where)
        det = _detector(made.name, f"{where}.name")
        if made.rules and det.family != "training":
            raise ConfigError(f"{where}.rules: only training-time methods re-score with post-hoc rules; {det.name} is "
                              f"{det.family}", doc=DOC)
        return cls(name=det.name, params=typed_params(det, made.params, f"{where}.params"), load=made.load,
                   label=made.label, rules=made.rules)

    @property
    def method(self) -> str:
        return self.label or self.name

    def methods(self) -> list[str]:
        """The method labels this spec writes: itself, then one per rule."""
        return [self.method, *(f"{self.method}+{r.name}" for r in self.rules)]


@config
class Select(Config):
    """Hyperparameter sweeps on OOD validation (ID val against OOD val, on cached features)."""

    DOC = DOC

    ood_val: Source | None = param(None,
                                   "the OOD-validation rows of the sweeps (split default val); null: top-level ood_val")
    metric: Metric = param("auroc", "the validation metric the sweep maximises (fpr95: minimises)")
    ties: TieRule | None = param(None, "which of several points tied at the best metric is kept: last (the reference's "
                                       "ood_evaluator.py) or first; null: the protocol's "
                                       "(detectors.harness.protocols.TIES)")


@config
class Transfer(Config):
    """Threshold transfer: a threshold at `tpr` on `source`, precision / recall on each target."""

    DOC = DOC

    source: str = param(REQUIRED, "the OOD set the threshold is set on")
    tpr: float = param(0.95, "the true-positive rate the threshold keeps on the source", gt=0, le=1)
    positive: Literal["ood", "id"] = param("ood", "which side counts as positive")
    targets: list[str] = param(REQUIRED, "OOD or field sets the threshold is transferred to")


@config
class Head(Config):
    """Score with one head of a multi-granularity classifier."""

    DOC = DOC

    levels: str = param(REQUIRED, "the saved multi-granularity head folder (pipelines.training.MultiGranularity)")
    level: str = param(REQUIRED, "the level whose head scores (e.g. genus)")


@config
class FewShot(Config):
    """The few-shot sweep of prompt-learning detectors (shots x seeds) on the run's splits."""

    DOC = DOC

    model: str | None = param(None, "the CLIP model (hub id or folder); null: the CLIP default", check=check_model_ref)
    methods: dict[str, dict[str, Any]] | None = param(None, "method -> parameter overrides; null: locoop and idlike")
    shots: list[int] | None = param(None, "shots per class; null: 1, 2, 4, 8, 16")
    seeds: list[int] | None = param(None, "seeds of each shots value; null: [1]")
    device: str | None = param(None, "torch device of the sweep (cpu, cuda, cuda:N, auto)", check=check_device)
    plot: str | None = param(None, "the figure path; null: out/fewshot.png")
    class_names: list[str] | None = param(None, "class names of the prompts; null: the run's")
    class_names_file: str | None = param(None, "a file with one class name a line; null: the run's")
    out_dir: str | None = param(None, "where prompts are saved; null: out/fewshot")
    cache_dir: str | None = param(None, "the CLIP feature cache; null: cache_dir/clip")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        for key in ("shots", "seeds"):
            values = getattr(self, key)
            if values is not None and (not values or min(values) < (1 if key == "shots" else 0)):
                raise ValueError(f"{key} must be a non-empty list of {'positive' if key == 'shots' else 'non-negative'}"
                                 f" integers, got {values!r}")


@config
class EvalConfig(Config):
    """Everything the evaluation runner needs (README: Evaluation)."""

    DOC = DOC

    id: str = param(REQUIRED, "the ID manifest folder (train / val / test rows)")
    ood: list[Source] = param(REQUIRED, "test OOD manifests (split default test); every ood_set is a column")
    out: str = param(REQUIRED, "the output folder")
    model: str | None = param(None, "the classifier (hub id or local folder with weights)", check=check_model_ref)
    model_network: ModelNetwork | None = param(None, "the OpenOOD network of a released `model:` weight file (the "
                                                     "Open-Insect zoo, pipelines.zoo); null: its file name's "
                                                     "(<method>_<region>.pth), else its keys'")
    checkpoint: Checkpoint | None = param(None, "which checkpoint of a train_classifier folder (its checkpoints.json) "
                                                "runs: last or best (ID-val top-1); null: the protocol's "
                                                "(detectors.harness.protocols.CHECKPOINTS), a folder without best/ its "
                                                "last")
    detectors: Literal["all"] | list[DetectorSpec] = param("all", "'all' (every detector of `families`) or a list of "
                                                           "names / {name, params, load, label, rules}")
    families: list[Family] = param(["posthoc"], "the families `detectors: all` means")
    cache_dir: str | None = param(None, "feature caches (shared across runs and processes); null: out/cache")
    cache_hash: CacheHash = param("stat", "image identity in every cache key: stat (size + mtime) or content (sha256)")
    batch_size: int = param(64, "images per feature-extraction batch", ge=1)
    chunk_rows: int | None = param(None, "rows per chunk of streamed fits; null: OODFORGE_CHUNK_ROWS or 16384", ge=1)
    shard_fit_rows: int = param(SHARD_FIT_ROWS, "ID train rows from which, with several processes, a detector whose "
                                                "statistics are sums fits per-process shards together (below: its "
                                                "unit runs on one rank, bitwise one process's result)", ge=1)
    device: str | None = param(None, "torch device: cpu, cuda, cuda:N or auto (null: auto)", check=check_device)
    precision: Precision = param("auto", "feature-extraction precision (auto: bf16 on GPU, fp32 on CPU)")
    num_workers: int | None = param(None, "image-loading worker processes; null: every core but one beside a GPU, 0 "
                                          "on a CPU-only machine (pipelines.pixels.default_workers)", ge=0)
    sweep_pixel_mb: float = param(1024, "memory (MiB) for the validation images' preprocessed pixels, kept across the "
                                        "grid points of an image-level sweep (ODIN, ...); 0: preprocess at every point",
                                  ge=0)
    select: Select | None = param(None, "sweep each selectable detector on OOD validation")
    ood_val: Source | None = param(None, "OOD validation (split default val): fit inputs, sweeps and rule choice")
    threshold_transfer: list[Transfer] = param([], "threshold-transfer rules")
    field: list[Source] = param([], "field sets (split default test): their own ID rows and one novel OOD set")
    class_names: list[str] | None = param(None, "class names by label; null: the ID rows' class_name")
    aux: Source | None = param(None, "auxiliary outliers (split default train; the `auxiliary` set when present)")
    fewshot: FewShot | None = param(None, "the few-shot prompt-learning sweep")
    head: Head | None = param(None, "score with one head of a multi-granularity classifier")
    plugins: list[str] = param([], "modules imported first (your own @register_detector classes)")
    protocol: Protocol = (param("openood_v1.5",
                                "the reference protocol merged into every unit (detectors.harness.protocols)"))
    pixels: PixelSettings = param(PixelSettings(), "how images become pixels: evaluation transform, fit pixels, EXIF "
                                                   "orientation, JPEG draft (pipelines.pixels; null keys: the "
                                                   "protocol's)")

    @classmethod
    def from_dict(cls, raw: Any, where: str = "") -> EvalConfig:
        """The typed config of a mapping; errors name the key (`ood[0].group: ...`), after `where` when given."""
        if not isinstance(raw, dict):
            raise ConfigError(f"{where or 'config'}: expected a mapping of keys at the top level, got "
                              f"{type(raw).__name__}", doc=DOC)
        for i, module in enumerate(convert(raw.get("plugins", []), list[str], _key(where, "plugins"))):
            try:  # before the detector entries are resolved: they may name the plugins' detectors
                importlib.import_module(module)
            except ImportError as err:
                raise ConfigError(f"{_key(where, 'plugins')}[{i}]: cannot import {module!r} ({err})", doc=DOC) from None
        return super().from_dict(raw, where)

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if not self.ood:
            raise ConfigError("ood: give at least one OOD manifest (the test OOD sets)", doc=DOC)
        if self.detectors != "all" and not self.detectors:
            raise ConfigError("detectors: give at least one detector (or `all`)", doc=DOC)
        if self.select is not None and self.select.ood_val is None and self.ood_val is None:
            raise ConfigError("select.ood_val: required without a top-level `ood_val` (the OOD-validation rows of the "
                              "sweeps)", doc=DOC)
        seen: set[str] = set()
        for method in (m for spec in self.specs() for m in spec.methods()):
            if method in seen:
                raise ConfigError(f"detectors: method {method!r} appears twice; give one a `label`", doc=DOC)
            seen.add(method)

    def specs(self) -> list[DetectorSpec]:
        """The detector entries (`all`: every registered detector of `families` that runs from its name alone,
        `Detector.runs_by_name`; the ensemble is named with its members)."""
        if self.detectors != "all":
            return list(self.detectors)
        from detectors.registry import available, detector_class

        return [DetectorSpec(name=n) for fam in self.families for n in available(fam)
                if detector_class(n).runs_by_name]

    def sources(self) -> dict[str, Source]:
        """The validation and auxiliary selections by key (select.ood_val, ood_val, aux)."""
        found = {"select.ood_val": self.select.ood_val if self.select else None, "ood_val": self.ood_val,
                 "aux": self.aux}
        return {k: v for k, v in found.items() if v is not None}

    def dump(self) -> dict[str, Any]:
        """The config as YAML-ready data, keys at their default left out (`from_dict(dump())` is equal)."""
        defaults = self.defaults()
        return {k: v for k, v in self.to_dict().items() if k not in defaults or v != plain(defaults[k])}
