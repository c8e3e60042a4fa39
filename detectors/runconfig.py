"""The runner's config and its validation: every key is checked before any model loads (the runner's "plan" step).

`EvalConfig.from_dict` / `from_yaml` read the mapping; `EvalConfig.validate()` checks types, allowed keys and values,
detector names and parameters, and raises `ConfigError` with one line that names the key and what is allowed.
"""
from __future__ import annotations

import importlib
import inspect
from dataclasses import dataclass
from dataclasses import field as dc_field
from pathlib import Path
from typing import Any

import yaml

from detectors.protocols import PROTOCOLS, protocol_params
from detectors.registry import available, detector_class
from detectors.tables import METRICS
from pipelines.cli import check_keys
from pipelines.errors import ConfigError
from pipelines.runtime import PRECISIONS

FAMILIES = ("posthoc", "clip", "generative", "training")
SOURCE_KEYS = {"manifest", "group", "split", "sets"}
SPEC_KEYS = {"name", "params", "load", "label", "rules"}
SELECT_KEYS = {"ood_val", "metric"}
HEAD_KEYS = {"levels", "level"}
TRANSFER_KEYS = {"source", "tpr", "positive", "targets"}
FEWSHOT_KEYS = {"model", "methods", "shots", "seeds", "device", "plot", "class_names", "class_names_file", "out_dir",
                "cache_dir", "train_split", "test_split"}
CACHE_HASHES = ("stat", "content")



@dataclass
class Source:
    """A manifest selection: which split to read, an optional group override and optional OOD-set filter."""

    manifest: str
    group: str | None = None
    split: str = "test"
    sets: list[str] | None = None


OODSource = Source  # the name used for `ood:` entries


@dataclass
class DetectorSpec:
    """A detector entry: registry name, parameters, optional saved state folder, label, and post-hoc `rules` that
    re-score a training-time method's trained model (one result row set per rule, method `<label>+<rule>`)."""

    name: str
    params: dict[str, Any] = dc_field(default_factory=dict)
    load: str | None = None
    label: str | None = None
    rules: list[str] = dc_field(default_factory=list)

    @property
    def method(self) -> str:
        return self.label or self.name

    def methods(self) -> list[str]:
        """The method labels this spec writes: itself, then one per rule."""
        return [self.method, *(f"{self.method}+{r}" for r in self.rules)]


@dataclass
class EvalConfig:
    """Everything the runner needs (README: Evaluation). Unknown keys are an error."""

    id: str
    ood: list[Source]
    out: str
    model: str | None = None
    detectors: Any = "all"
    families: list[str] = dc_field(default_factory=lambda: ["posthoc"])
    cache_dir: str | None = None
    cache_hash: str = "stat"  # image identity in cache keys: "stat" (size + mtime) or "content" (sha256 of the bytes)
    batch_size: int = 64
    chunk_rows: int | None = None  # rows per chunk of streamed fits (default detectors.posthoc.streaming.CHUNK_ROWS)
    device: str | None = None
    precision: str = "auto"
    num_workers: int = 0
    select: dict[str, Any] | None = None
    ood_val: dict[str, Any] | None = None  # OOD validation rows given to every detector's fit (OpenGAN's epoch choice)
    threshold_transfer: list[dict[str, Any]] = dc_field(default_factory=list)
    field: list[dict[str, Any]] = dc_field(default_factory=list)  # field sets: their own ID and novel rows
    class_names: list[str] | None = None
    aux: dict[str, Any] | None = None
    fewshot: dict[str, Any] | None = None
    head: dict[str, str] | None = None
    plugins: list[str] = dc_field(default_factory=list)  # modules imported first (custom @register_detector classes)
    protocol: str = "openood_v1.5"  # PROTOCOLS: the reference's hyperparameter defaults and fits

    @classmethod
    def from_dict(cls, raw: Any, source: str = "config") -> "EvalConfig":
        if not isinstance(raw, dict):
            raise ConfigError(f"{source}: expected a mapping at the top level, got {type(raw).__name__}")
        check_keys(raw, list(inspect.signature(cls).parameters), source)
        for key in ("id", "ood", "out"):
            if key not in raw:
                raise ConfigError(f"{source}: missing required key '{key}'")
        ood = raw["ood"]
        if not isinstance(ood, list):
            raise ConfigError(f"{source}: 'ood' must be a list of manifest folders or {{manifest, group, split, sets}} mappings")
        sources = [_source(entry, f"ood[{i}]") for i, entry in enumerate(ood)]
        return cls(**{**raw, "ood": sources})

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EvalConfig":
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
        return cls.from_dict(raw, str(path))

    # -- validation (before any model loads) ----------------------------------------------------------------
    def validate(self) -> list[DetectorSpec]:
        """Check every key; import `plugins`; return the detector specs. Raises ConfigError naming the key."""
        _check_list_of_str(self.plugins, "plugins")
        for module in self.plugins:
            try:
                importlib.import_module(module)
            except ImportError as err:
                raise ConfigError(f"plugins: cannot import {module!r} ({err})") from None
        _check_list_of_str(self.families, "families", allowed=FAMILIES)
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol: {self.protocol!r} is not one of {list(PROTOCOLS)}")
        if self.cache_hash not in CACHE_HASHES:
            raise ConfigError(f"cache_hash: {self.cache_hash!r} is not one of {list(CACHE_HASHES)}")
        for key in ("batch_size", "chunk_rows"):
            value = getattr(self, key)
            if (value is not None or key == "batch_size") and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ConfigError(f"{key}: a positive integer, got {value!r}")
        if self.precision not in PRECISIONS:
            raise ConfigError(f"precision: one of {list(PRECISIONS)}, got {self.precision!r}")
        specs = detector_specs(self)
        if self.select is not None:
            _check_mapping(self.select, "select", SELECT_KEYS)
            if "ood_val" not in self.select and self.ood_val is None:
                raise ConfigError("select: missing key(s) ['ood_val'] (the OOD-validation rows of the sweeps; or give a "
                                  "top-level `ood_val`)")
            if "ood_val" in self.select:
                _source(self.select["ood_val"], "select.ood_val")
            if self.select.get("metric", "auroc") not in METRICS:
                raise ConfigError(f"select.metric: {self.select['metric']!r} is not one of {list(METRICS)}")
        if self.ood_val is not None:
            _source(self.ood_val, "ood_val")
        if self.aux is not None:
            _source(self.aux, "aux")
        self.field_sources()
        if self.head is not None:
            _check_mapping(self.head, "head", HEAD_KEYS, required=tuple(HEAD_KEYS))
        if not isinstance(self.threshold_transfer, list):
            raise ConfigError("threshold_transfer: a list of {source, tpr, positive, targets} mappings")
        for i, rule in enumerate(self.threshold_transfer):
            where = f"threshold_transfer[{i}]"
            _check_mapping(rule, where, TRANSFER_KEYS, required=("source", "targets"))
            _check_list_of_str(rule["targets"], f"{where}.targets")
            tpr = rule.get("tpr", 0.95)
            if not isinstance(tpr, (int, float)) or not 0 < tpr <= 1:
                raise ConfigError(f"{where}.tpr: a number in (0, 1], got {tpr!r}")
            if rule.get("positive", "ood") not in ("ood", "id"):
                raise ConfigError(f"{where}.positive: 'ood' or 'id', got {rule['positive']!r}")
        if self.fewshot is not None:
            _check_mapping(self.fewshot, "fewshot", FEWSHOT_KEYS)
        if self.class_names is not None:
            _check_list_of_str(self.class_names, "class_names")
        return specs

    def field_sources(self) -> list[Source]:
        """The `field:` entries as sources (split `test` unless given)."""
        return [_source(entry, f"field[{i}]") for i, entry in enumerate(self.field)]

    def sources(self) -> dict[str, Source]:
        """Every non-test manifest selection of the config by its key (select.ood_val, ood_val, aux)."""
        found = {}
        if self.select and "ood_val" in self.select:
            found["select.ood_val"] = _source(self.select["ood_val"], "select.ood_val", split="val")
        if self.ood_val:
            found["ood_val"] = _source(self.ood_val, "ood_val", split="val")
        if self.aux:
            found["aux"] = _source(self.aux, "aux", split="train")
        return found


def _source(entry: Any, where: str, split: str = "test") -> Source:
    if isinstance(entry, Source):
        return entry
    if isinstance(entry, str):
        return Source(entry, split=split)
    _check_mapping(entry, where, SOURCE_KEYS, required=("manifest",))
    if entry.get("sets") is not None:
        _check_list_of_str(entry["sets"], f"{where}.sets")
    return Source(**{"split": split, **entry})


def _check_mapping(value: Any, where: str, allowed: set[str], required: tuple[str, ...] = ()) -> None:
    if not isinstance(value, dict):
        raise ConfigError(f"{where}: a mapping with keys {sorted(allowed)}, got {type(value).__name__} {value!r}")
    unknown = set(value) - allowed
    if unknown:
        raise ConfigError(f"{where}: unknown key(s) {sorted(unknown)}; allowed: {sorted(allowed)}")
    missing = [k for k in required if k not in value]
    if missing:
        raise ConfigError(f"{where}: missing key(s) {missing}")


def _check_list_of_str(value: Any, where: str, allowed: tuple[str, ...] | None = None) -> None:
    if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
        shown = f"the string {value!r} (write [{value}])" if isinstance(value, str) else repr(value)
        raise ConfigError(f"{where}: a list of names, got {shown}")
    if allowed is not None:
        bad = [v for v in value if v not in allowed]
        if bad:
            raise ConfigError(f"{where}: unknown {bad}; allowed: {list(allowed)}")


def detector_specs(config: EvalConfig) -> list[DetectorSpec]:
    """Expand `detectors:` ('all', or a list of names / {name, params, load, label, rules}) with every name and
    parameter checked against the registry; method labels must be unique."""
    if config.detectors == "all":
        specs = [DetectorSpec(n) for fam in config.families for n in available(fam)]
    elif isinstance(config.detectors, list):
        specs = [_spec(entry, f"detectors[{i}]") for i, entry in enumerate(config.detectors)]
    else:
        shown = f"the string {config.detectors!r} (write [{config.detectors}])" if isinstance(config.detectors, str) else repr(config.detectors)
        raise ConfigError(f"detectors: 'all' or a list of names / {{name, params, load, label, rules}} mappings, got {shown}")
    for spec in specs:
        spec.params = {**protocol_params(config.protocol, spec.name), **spec.params}
    seen: set[str] = set()
    for spec in specs:
        for method in spec.methods():
            if method in seen:
                raise ConfigError(f"detectors: method {method!r} appears twice; give one a `label`")
            seen.add(method)
    return specs


def _spec(entry: Any, where: str) -> DetectorSpec:
    if isinstance(entry, str):
        entry = {"name": entry}
    _check_mapping(entry, where, SPEC_KEYS, required=("name",))
    try:
        cls = detector_class(entry["name"])
    except KeyError as err:
        raise ConfigError(f"{where}.name: {err.args[0]}") from None
    params = entry.get("params") or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{where}.params: a mapping of parameter values, got {params!r}")
    allowed = set(cls.defaults) | {p for p in inspect.signature(cls.__init__).parameters if p not in ("self", "params")}
    unknown = set(params) - allowed
    if unknown:
        raise ConfigError(f"{where}.params: unknown parameter(s) {sorted(unknown)} for {cls.name}; allowed: {sorted(allowed)}")
    rules = entry.get("rules") or []
    _check_list_of_str(rules, f"{where}.rules")
    if rules and cls.family != "training":
        raise ConfigError(f"{where}.rules: only training-time methods re-score with post-hoc rules; {cls.name} is {cls.family}")
    for rule in rules:
        try:
            rule_cls = detector_class(rule)
        except KeyError as err:
            raise ConfigError(f"{where}.rules: {err.args[0]}") from None
        if rule_cls.family != "posthoc" or not rule_cls.inputs <= {"features", "logits"}:
            raise ConfigError(f"{where}.rules: {rule!r} is not a feature-level post-hoc detector")
    return DetectorSpec(entry["name"], dict(params), entry.get("load"), entry.get("label"), list(rules))
