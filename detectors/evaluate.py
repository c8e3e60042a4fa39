"""The evaluation runner: manifests + feature caches + detectors -> results table and per-sample scores.

A YAML/dict config (see `EvalConfig`) names the classifier, the ID manifest (train/val/test), the OOD manifests with their
group, the detectors and the output folder. Feature caches are built once and reused; every detector is fitted, scored on
ID test and each OOD set, and timed. Writes `results.csv` (DESIGN.md schema), `scores.parquet` (one row per sample and
method), `failures.json` and, when asked, `threshold_transfer.csv`.
"""
from __future__ import annotations

import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from detectors.base import Detector, FeatureSet, ImageSet
from detectors.metrics import evaluate as compute_metrics
from detectors.metrics import precision_recall_at, threshold_at_tpr
from detectors.registry import available, detector_class
from detectors.selection import select
from pipelines.data import Manifest, read_manifest
from pipelines.io import atomic_path, atomic_write_json
from pipelines.runtime import partial_state

FEATURE_INPUTS = frozenset({"features", "logits"})
RESULT_COLUMNS = ["method", "family", "ood_set", "group", "auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out", "n_id", "n_ood", "seconds"]
CONFIG_KEYS = {"model", "id", "ood", "detectors", "families", "out", "cache_dir", "batch_size", "device", "precision",
               "num_workers", "select", "threshold_transfer", "class_names", "aux", "fewshot", "head"}


@dataclass
class OODSource:
    """One OOD manifest: which split to read, an optional group override and optional set filter."""

    manifest: str
    group: str | None = None
    split: str = "test"
    sets: list[str] | None = None


@dataclass
class EvalConfig:
    """Everything the runner needs; `from_yaml` reads the same keys from a file (unknown keys are an error)."""

    id: str
    ood: list[OODSource]
    out: str
    model: str | None = None
    detectors: Any = "all"
    families: list[str] = field(default_factory=lambda: ["posthoc"])
    cache_dir: str | None = None
    batch_size: int = 64
    device: str | None = None
    precision: str = "auto"
    num_workers: int = 0
    select: dict[str, Any] | None = None
    threshold_transfer: list[dict[str, Any]] = field(default_factory=list)
    class_names: list[str] | None = None
    aux: dict[str, Any] | None = None
    fewshot: dict[str, Any] | None = None  # detectors.clip.fewshot.sweep config: model, manifest, methods, shots, seeds
    head: dict[str, str] | None = None  # {levels: MultiGranularity folder, level: name}: score with that label head

    @classmethod
    def from_dict(cls, raw: dict[str, Any], source: str = "config") -> "EvalConfig":
        unknown = set(raw) - CONFIG_KEYS
        if unknown:
            raise ValueError(f"{source}: unknown key(s) {sorted(unknown)}; known: {sorted(CONFIG_KEYS)}")
        for key in ("id", "ood", "out"):
            if key not in raw:
                raise ValueError(f"{source}: missing required key '{key}'")
        ood = []
        for i, entry in enumerate(raw["ood"]):
            entry = {"manifest": entry} if isinstance(entry, str) else entry
            try:
                ood.append(OODSource(**entry))
            except TypeError as err:
                raise ValueError(f"{source}: ood[{i}]: {err}") from None
        return cls(**{**raw, "ood": ood})

    @classmethod
    def from_yaml(cls, path: str | Path) -> "EvalConfig":
        with open(path, encoding="utf-8") as fh:
            raw = yaml.safe_load(fh) or {}
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: expected a mapping at the top level")
        return cls.from_dict(raw, str(path))


@dataclass
class DetectorSpec:
    """A detector entry of the config: registry name, parameters, optional saved state folder and fit keywords."""

    name: str
    params: dict[str, Any] = field(default_factory=dict)
    load: str | None = None
    label: str | None = None

    @property
    def method(self) -> str:
        return self.label or self.name


def detector_specs(config: EvalConfig) -> list[DetectorSpec]:
    """Expand `detectors:` (`all`, names, or mappings with name/params/load/label)."""
    if config.detectors == "all":
        return [DetectorSpec(n) for fam in config.families for n in available(fam)]
    specs = []
    for entry in config.detectors:
        spec = DetectorSpec(entry) if isinstance(entry, str) else DetectorSpec(**entry)
        detector_class(spec.name)  # unknown names fail before any work
        specs.append(spec)
    return specs


@dataclass
class Split:
    """One evaluated population: its manifest rows and, lazily, features / images."""

    name: str
    manifest: Manifest
    group: str | None = None
    features: FeatureSet | None = None
    index: np.ndarray | None = None


class Runner:
    """Runs a config; public for notebooks (`Runner(config).run()`)."""

    def __init__(self, config: EvalConfig):
        self.config = config
        self.out = Path(config.out)
        self.cache_dir = Path(config.cache_dir) if config.cache_dir else self.out / "cache"
        self.specs = detector_specs(config)
        self.classifier = None
        self.head = None
        self.failures: list[dict[str, Any]] = []

    # -- data -----------------------------------------------------------------------------------------------
    def _id_splits(self) -> dict[str, Split]:
        manifest = read_manifest(self.config.id)
        splits = {s: Split(f"id_{s}", manifest.select(role="id", split=s)) for s in ("train", "val", "test")}
        if not len(splits["test"].manifest):
            raise ValueError(f"{self.config.id}: no ID rows with split 'test'")
        if not len(splits["train"].manifest):
            raise ValueError(f"{self.config.id}: no ID rows with split 'train' (detectors are fitted on them)")
        return splits

    def _ood_splits(self) -> list[Split]:
        out = []
        for src in self.config.ood:
            manifest = read_manifest(src.manifest).select(role="ood", split=src.split)
            sets = src.sets or manifest.ood_sets()
            if not sets:
                raise ValueError(f"{src.manifest}: no OOD rows with split '{src.split}'")
            for name in sets:
                part = manifest.select(ood_set=name)
                if not len(part):
                    raise ValueError(f"{src.manifest}: OOD set '{name}' has no rows with split '{src.split}'")
                group = src.group or part.rows[0].get("group")
                out.append(Split(name, part, group))
        return out

    def _needs_features(self) -> bool:
        return any(reads_features(detector_class(s.name)) for s in self.specs)

    def _load_classifier(self):
        from pipelines.classifier import ImageClassifier

        if self.classifier is None:
            if not self.config.model:
                raise ValueError("config key 'model' (classifier hub id or folder) is needed by the chosen detectors")
            self.classifier = ImageClassifier.from_pretrained(self.config.model)
        return self.classifier

    def _features(self, split: Split) -> None:
        from pipelines.features import cache_path, extract_features

        clf = self._load_classifier()
        cache = extract_features(clf, split.manifest, batch_size=self.config.batch_size, device=self.config.device,
                                 precision=self.config.precision, num_workers=self.config.num_workers,
                                 cache=cache_path(self.cache_dir, clf.model_id, split.manifest, split.name), desc=split.name)
        split.features, split.index = cache.to_featureset(), cache.index
        self.head = cache.head()
        self.failures += [{**f, "split": split.name} for f in cache.failures]

    # -- detectors ------------------------------------------------------------------------------------------
    def _build(self, spec: DetectorSpec, class_names: list[str] | None) -> Detector:
        cls = detector_class(spec.name)
        params = dict(spec.params)
        if cls.accepts("classifier") and "classifier" not in params and self.config.model:
            params["classifier"] = self._load_classifier()
        if cls.accepts("class_names") and "class_names" not in params and class_names:
            params["class_names"] = class_names
        if cls.accepts("cache_dir") and "cache_dir" not in params:
            params["cache_dir"] = str(self.cache_dir / cls.family)
        if spec.load:
            return cls.from_pretrained(spec.load, **params)
        return cls(**params)

    def _fit(self, det: Detector, spec: DetectorSpec, id_splits: dict[str, Split], aux: Any) -> None:
        images = not reads_features(type(det))
        train = ImageSet(manifest=id_splits["train"].manifest) if images else id_splits["train"].features
        val_split = id_splits["val"]
        val = None
        if len(val_split.manifest):
            val = ImageSet(manifest=val_split.manifest) if images else val_split.features
        kwargs: dict[str, Any] = {"id_val": val}
        if not images:
            kwargs["head"] = self.head
        if aux is not None and "aux" in inspect.signature(det.fit).parameters:
            kwargs["aux"] = aux
        det.fit(train, **kwargs)

    def _batch(self, det: Detector, split: Split):
        return split.features if reads_features(type(det)) else ImageSet(manifest=split.manifest)

    def run(self) -> pd.DataFrame:
        """Fit and score every detector; write the output files; return the results table."""
        cfg = self.config
        self.out.mkdir(parents=True, exist_ok=True)
        id_splits = self._id_splits()
        ood_splits = self._ood_splits()
        if self._needs_features():
            for split in [*id_splits.values(), *ood_splits]:
                if len(split.manifest):
                    self._features(split)
            if cfg.head:
                self._use_level_head([s for s in [*id_splits.values(), *ood_splits] if s.features is not None])
        class_names = cfg.class_names or _class_names(id_splits["train"].manifest)
        aux = self._aux_features()
        rows, score_frames, scores_by_method = [], [], {}
        test = id_splits["test"]
        for spec in self.specs:
            start = time.perf_counter()
            det = self._selected(spec, id_splits) if cfg.select and _selectable(spec) else self._build(spec, class_names)
            if not det.fitted:
                self._fit(det, spec, id_splits, aux)
            id_scores = det.score(self._batch(det, test))
            fit_seconds = time.perf_counter() - start
            per_set = {}
            score_frames.append(_score_frame(spec.method, det.family, "id", "id", "id", _positions(test, det), id_scores))
            for split in ood_splits:
                t0 = time.perf_counter()
                ood_scores = det.score(self._batch(det, split))
                metrics = compute_metrics(id_scores, ood_scores)
                per_set[split.name] = ood_scores
                rows.append({"method": spec.method, "family": det.family, "ood_set": split.name, "group": split.group,
                             **metrics, "n_id": len(id_scores), "n_ood": len(ood_scores),
                             "seconds": fit_seconds + time.perf_counter() - t0})
                score_frames.append(_score_frame(spec.method, det.family, "ood", split.name, split.group or "",
                                                 _positions(split, det), ood_scores))
            scores_by_method[spec.method] = (id_scores, per_set, {s.name: s for s in ood_splits})
        results = pd.DataFrame(rows, columns=RESULT_COLUMNS)
        if not partial_state().is_main_process:  # under accelerate every process scores; one writes
            return results
        _write_csv(results, self.out / "results.csv")
        scores = pd.concat(score_frames, ignore_index=True) if score_frames else pd.DataFrame()
        with atomic_path(self.out / "scores.parquet") as tmp:
            scores.to_parquet(tmp, index=False)
        atomic_write_json(self.out / "failures.json", self.failures)
        if cfg.threshold_transfer:
            _write_csv(self._threshold_transfer(scores_by_method), self.out / "threshold_transfer.csv")
        if cfg.fewshot:
            self._fewshot(id_splits, ood_splits, class_names)
        return results

    def _fewshot(self, id_splits: dict[str, Split], ood_splits: list[Split], class_names: list[str] | None) -> None:
        """Few-shot sweep of prompt-learning detectors (shots x seeds) on the run's ID and OOD splits
        -> fewshot.csv and fewshot.png (config keys: model, methods, shots, seeds, device, plot)."""
        from detectors.clip.fewshot import class_names_from, plot_fewshot, sweep_sets

        sweep_config = {"out_dir": str(self.out / "fewshot"), "cache_dir": str(self.cache_dir / "clip"), **self.config.fewshot}
        given = sweep_config.get("class_names") or sweep_config.get("class_names_file")
        names = class_names_from(sweep_config) if given else class_names
        if not names:
            raise ValueError("fewshot: class names are needed (config `class_names`, or `class_name` fields in the ID manifest)")
        rows = sweep_sets(sweep_config, ImageSet(manifest=id_splits["train"].manifest), ImageSet(manifest=id_splits["test"].manifest),
                          {s.name: ImageSet(manifest=s.manifest) for s in ood_splits}, {s.name: s.group for s in ood_splits}, names)
        _write_csv(pd.DataFrame(rows), self.out / "fewshot.csv")
        plot_fewshot(rows, str(sweep_config.get("plot", self.out / "fewshot.png")))

    def _use_level_head(self, splits: list[Split]) -> None:
        """Score with one head of a multi-granularity classifier: its logits, and ID labels from its level's field."""
        from detectors.base import LinearHead
        from pipelines.training import MultiGranularity

        spec = self.config.head or {}
        if set(spec) != {"levels", "level"}:
            raise ValueError(f"config 'head' takes exactly the keys levels (a MultiGranularity folder) and level, got {sorted(spec)}")
        objective = MultiGranularity.from_pretrained(spec["levels"])
        self.head = LinearHead(*objective.level_head(spec["level"]))
        field_name = objective.levels[spec["level"]]
        vocab = {v: i for i, v in enumerate(objective.vocab[spec["level"]])}
        for split in splits:
            rows = [split.manifest.rows[i] for i in split.index]
            labels = np.array([vocab.get(r.get(field_name), -1) if r["role"] == "id" else -1 for r in rows], dtype=np.int64)
            features = split.features.features
            split.features = FeatureSet(features, self.head(features.astype(np.float64)).astype(np.float32), labels)

    def _aux_features(self) -> FeatureSet | None:
        if not self.config.aux:
            return None
        split = Split("aux", read_manifest(self.config.aux["manifest"]).select(split=self.config.aux.get("split", "train")))
        self._features(split)
        # auxiliary rows are OOD (label -1); their own class index (e.g. species, for Extended) is `aux_label`
        labels = np.array([split.manifest.rows[i].get("aux_label", -1) for i in split.index], dtype=np.int64)
        return FeatureSet(split.features.features, split.features.logits, labels)

    def _selected(self, spec: DetectorSpec, id_splits: dict[str, Split]) -> Detector:
        sel = self.config.select or {}
        manifest = read_manifest(sel["ood_val"]["manifest"]).select(role="ood", split=sel["ood_val"].get("split", "val"))
        ood_val = Split("ood_val", manifest)
        self._features(ood_val)
        det, params, table = select(spec.name, id_splits["val"].features, ood_val.features, id_train=id_splits["train"].features,
                                    head=self.head, metric=sel.get("metric", "auroc"), fixed=spec.params)
        _write_csv(pd.DataFrame(table), self.out / "selection" / f"{spec.method}.csv")
        return det

    def _threshold_transfer(self, scores_by_method: dict[str, Any]) -> pd.DataFrame:
        """Threshold at `tpr` on a source OOD set (or ID test with positive: id), precision/recall of OOD on targets."""
        rows = []
        for rule in self.config.threshold_transfer:
            source, tpr, positive = rule["source"], float(rule.get("tpr", 0.95)), rule.get("positive", "ood")
            for method, (id_scores, per_set, splits) in scores_by_method.items():
                if positive == "id":
                    threshold = threshold_at_tpr(id_scores, tpr, "id")
                else:
                    if source not in per_set:
                        raise ValueError(f"threshold_transfer: source '{source}' is not an evaluated OOD set ({sorted(per_set)})")
                    threshold = threshold_at_tpr(per_set[source], tpr, "ood")
                for target in rule["targets"]:
                    if target not in per_set:
                        raise ValueError(f"threshold_transfer: target '{target}' is not an evaluated OOD set ({sorted(per_set)})")
                    row = {"method": method, "source": source, "target": target, "tpr": tpr,
                           **precision_recall_at(threshold, id_scores, per_set[target])}
                    species = [r.get("species") for r in splits[target].manifest.rows]
                    if all(s is not None for s in species):
                        flagged = per_set[target] < threshold
                        row["species_detected"] = float(pd.Series(flagged).groupby(pd.Series(species)).any().mean())
                    rows.append(row)
        return pd.DataFrame(rows)


def reads_features(cls: type[Detector]) -> bool:
    """True for detectors scored on cached features/logits (FeatureSet), False for those reading pixels (ImageSet)."""
    return cls.inputs <= FEATURE_INPUTS


def _selectable(spec: DetectorSpec) -> bool:
    """Post-hoc-style detectors with a sweep (training-time methods need auxiliary data and are not swept here)."""
    cls = detector_class(spec.name)
    return reads_features(cls) and bool(cls.search_space) and spec.load is None and cls.family != "training"


def _class_names(manifest: Manifest) -> list[str] | None:
    names: dict[int, str] = {}
    for row in manifest.rows:
        name = row.get("class_name") or row.get("category")
        if name is not None:
            names.setdefault(row["label"], str(name))
    if not names:
        return None
    return [names.get(i, str(i)) for i in range(max(names) + 1)]


def _positions(split: Split, det: Detector) -> np.ndarray:
    if reads_features(type(det)) and split.index is not None:
        return split.index
    return np.arange(len(split.manifest))


def _score_frame(method: str, family: str, role: str, ood_set: str, group: str, index: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"method": method, "family": family, "role": role, "ood_set": ood_set, "group": group,
                         "index": np.asarray(index, dtype=np.int64), "score": scores})


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def run_config(config: EvalConfig | dict[str, Any] | str | Path) -> pd.DataFrame:
    """Run the evaluation described by a config object, mapping or YAML path; returns the results table."""
    if isinstance(config, (str, Path)):
        config = EvalConfig.from_yaml(config)
    elif isinstance(config, dict):
        config = EvalConfig.from_dict(config)
    return Runner(config).run()


def dump_config(config: EvalConfig, path: str | Path) -> None:
    """Write a config back as YAML (for the record next to the results)."""
    raw = {k: v for k, v in config.__dict__.items() if v not in (None, [], {})}
    raw["ood"] = [{k: v for k, v in o.__dict__.items() if v is not None} for o in config.ood]
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(json.loads(json.dumps(raw, default=str)), sort_keys=False))
