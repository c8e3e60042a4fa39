"""The evaluation runner: manifests + feature caches + detectors -> results table and per-sample scores.

Four steps, each its own unit of work:
1. **plan** — the whole config is validated (`detectors.runconfig`), every detector is built once with its parameters and
   every manifest is read and checked (duplicate OOD set names, OOD-val rows that are test rows, ID rows in `aux`),
   before any model loads;
2. **features** — one content-addressed feature cache per split (`pipelines.fingerprint`: the weights actually loaded,
   preprocessing, precision, rows and image files), reused by every feature-level detector; images that fail to load
   are recorded and left out of every detector's ID and OOD populations alike;
3. **units** — one per detector spec (`detectors.units`): fit, score, write its rows and scores atomically; a finished
   unit is skipped on rerun, a failing one is recorded in `failures.json` and the others go on;
4. **report** — `results.csv`, `scores.parquet`, `failures.json` and `threshold_transfer.csv` from what the units wrote.
"""
from __future__ import annotations

import contextlib
import copy
import inspect
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from detectors.base import Detector, FeatureSet, ImageSet, LinearHead
from detectors.metrics import evaluate as compute_metrics
from detectors.posthoc.streaming import across_processes, chunk_rows, process_rows
from detectors.registry import build, detector_class
from detectors.runconfig import ConfigError, DetectorSpec, EvalConfig, OODSource, Source, detector_specs
from detectors.selection import select
from detectors.transfer import transfer_table
from detectors.units import UnitResult, UnitStore
from pipelines.data import ImageLoadError, Manifest, load_image, read_manifest
from pipelines.fingerprint import (combine, images_fingerprint, preprocessing_fingerprint, source_identity,
                                  weights_fingerprint)
from pipelines.io import atomic_path, atomic_write_json
from pipelines.runtime import partial_state, resolve_device, resolve_dtype

__all__ = ["EvalConfig", "OODSource", "DetectorSpec", "ConfigError", "Runner", "run_config", "dump_config", "reads_features",
           "detector_specs", "RESULT_COLUMNS"]

FEATURE_INPUTS = frozenset({"features", "logits"})
RESULT_COLUMNS = ["method", "family", "base", "rule", "ood_set", "group", "auroc", "fpr95", "fpr95_id", "aupr_in", "aupr_out",
                  "n_id", "n_ood", "seconds"]
FEATURES_VERSION = "features-v2"


@dataclass
class Split:
    """One evaluated population: its manifest rows and, once known, its usable rows and features."""

    name: str
    manifest: Manifest
    group: str | None = None
    role: str = "ood"  # id | ood | field_id | field_ood | aux | ood_val
    features: FeatureSet | None = None
    index: np.ndarray | None = None  # positions (in `manifest`) of the rows that loaded
    key: str = ""  # content key of the rows and image files (and of the features, once extracted)

    def images(self) -> ImageSet:
        """The rows that loaded, as an ImageSet for pixel-reading detectors."""
        return ImageSet(manifest=Manifest(self.manifest.root, [self.manifest.rows[i] for i in self.positions()]))

    def positions(self) -> np.ndarray:
        return self.index if self.index is not None else np.arange(len(self.manifest))


class Runner:
    """Runs a config; public for notebooks (`Runner(config).run()`). Construction is the plan step."""

    def __init__(self, config: EvalConfig):
        self.config = config
        self.specs = config.validate()
        self.out = Path(config.out)
        self.cache_dir = Path(config.cache_dir) if config.cache_dir else self.out / "cache"
        self.store = UnitStore(self.out)
        self.classifier = None
        self.head: LinearHead | None = None
        self.image_failures: list[dict[str, Any]] = []
        self.detector_failures: list[dict[str, Any]] = []
        for i, spec in enumerate(self.specs):
            _check_buildable(spec, f"detectors[{i}]")
        self.id_splits = self._id_splits()
        self.ood_splits = self._ood_splits()
        self.field_splits = self._field_splits()
        self.extra = self._extra_splits()
        self._check_transfer_names()

    # -- plan: data ------------------------------------------------------------------------------------------
    def _id_splits(self) -> dict[str, Split]:
        manifest = read_manifest(self.config.id)
        splits = {s: Split(f"id_{s}", manifest.select(role="id", split=s), role="id") for s in ("train", "val", "test")}
        if not len(splits["test"].manifest):
            raise ValueError(f"{self.config.id}: no ID rows with split 'test'")
        if not len(splits["train"].manifest):
            raise ValueError(f"{self.config.id}: no ID rows with split 'train' (detectors are fitted on them)")
        return splits

    def _ood_splits(self) -> list[Split]:
        out: list[Split] = []
        seen: dict[str, str] = {}
        for i, src in enumerate(self.config.ood):
            for name, part in _sets_of(src, f"ood[{i}]").items():
                if name in seen:
                    raise ConfigError(f"ood[{i}]: OOD set {name!r} is also given by {seen[name]}; set names must be unique "
                                      "(use `sets:` to pick)")
                seen[name] = f"ood[{i}] ({src.manifest})"
                out.append(Split(name, part, src.group or part.rows[0].get("group")))
        return out

    def _field_splits(self) -> list[Split]:
        out = []
        taken = {s.name for s in self.ood_splits}
        for i, src in enumerate(self.config.field_sources()):
            manifest = read_manifest(src.manifest).select(split=src.split)
            novel = _sets_of(src, f"field[{i}]")
            if len(novel) != 1:
                raise ConfigError(f"field[{i}]: a field set has one novel set, found {sorted(novel)}; pick one with `sets:`")
            (name, part), = novel.items()
            if name in taken:
                raise ConfigError(f"field[{i}]: set name {name!r} is already an OOD set")
            known = manifest.select(role="id")
            out += [Split(name, known, "field", role="field_id"), Split(name, part, "field", role="field_ood")]
        return out

    def _extra_splits(self) -> dict[str, Split]:
        """select.ood_val, ood_val and aux selections, checked to be disjoint from the test OOD rows (and aux from ID)."""
        test_files = {str(s.manifest.path(r).resolve()) for s in self.ood_splits for r in s.manifest.rows}
        extra = {}
        for key, src in self.config.sources().items():
            manifest = _aux_rows(src) if key == "aux" else _merged(_sets_of(src, key))
            overlap = [r["file_name"] for r in manifest.rows if str(manifest.path(r).resolve()) in test_files]
            if overlap:
                raise ConfigError(f"{key}: {len(overlap)} row(s) are test OOD rows (first: {overlap[0]!r}); "
                                  "validation and auxiliary data must be disjoint from the evaluated OOD sets")
            extra[key] = Split(key, manifest, role="aux" if key == "aux" else "ood_val")
        return extra

    def _check_transfer_names(self) -> None:
        names = {s.name for s in self.ood_splits} | {s.name for s in self.field_splits}
        for i, rule in enumerate(self.config.threshold_transfer):
            if rule.get("positive", "ood") == "ood" and rule["source"] not in names:
                raise ConfigError(f"threshold_transfer[{i}].source: {rule['source']!r} is not an evaluated OOD set {sorted(names)}")
            for target in rule["targets"]:
                if target not in names:
                    raise ConfigError(f"threshold_transfer[{i}].targets: {target!r} is not an evaluated OOD or field set {sorted(names)}")

    def _all_splits(self) -> list[Split]:
        return [*self.id_splits.values(), *self.ood_splits, *self.field_splits, *self.extra.values()]

    # -- features ------------------------------------------------------------------------------------------
    def _needs_features(self) -> bool:
        return any(reads_features(detector_class(s.name)) or s.rules for s in self.specs)

    def _device(self):
        return resolve_device(self.config.device) if self.config.device else partial_state().device

    def _load_classifier(self):
        from pipelines.classifier import ImageClassifier

        if self.classifier is None:
            if not self.config.model:
                raise ConfigError("model: a classifier hub id or folder is needed by the chosen detectors")
            clf = ImageClassifier.from_pretrained(self.config.model).to(self._device()).eval()
            dtype = resolve_dtype(self.config.precision, self._device())
            self._model_key = combine(FEATURES_VERSION, weights_fingerprint(clf), preprocessing_fingerprint(clf), str(dtype))
            self.classifier = clf
        return self.classifier

    def _features(self, split: Split) -> None:
        from pipelines.features import FeatureCache, cache_path, extract_features

        clf = self._load_classifier()
        key = combine(self._model_key, images_fingerprint(split.manifest, self.config.cache_hash))
        path = cache_path(self.cache_dir, f"{split.role}-{split.name}", key)
        cache = extract_features(clf, split.manifest, batch_size=self.config.batch_size, device=str(self._device()),
                                 precision=self.config.precision, num_workers=self.config.num_workers, key=key,
                                 cache=path, desc=split.name)
        state = partial_state()
        if state.num_processes > 1:
            state.wait_for_everyone()  # the main process has written the file
        if path.is_file():  # detectors stream memory-mapped caches in chunks (paper-scale ID train sets)
            cache = FeatureCache.load(path, mmap=True)
        split.features, split.index, split.key = cache.to_featureset(), cache.index, key
        self.head = cache.head()
        self._record_failures(split, cache.failures)
        if split.role == "aux":  # auxiliary rows are OOD (label -1); their own class index (Extended) is `aux_label`
            labels = np.array([split.manifest.rows[i].get("aux_label", -1) for i in split.index], dtype=np.int64)
            split.features = FeatureSet(split.features.features, split.features.logits, labels)

    def _probe(self, split: Split) -> None:
        """Pixel-only runs: find the rows whose image loads (cached per image-set key), so failures are excluded alike."""
        split.key = combine("probe-v1", images_fingerprint(split.manifest, self.config.cache_hash))
        path = self.cache_dir / "probe" / f"{split.role}-{split.name}-{split.key}.json"
        if path.is_file():
            failures = json.loads(path.read_text())
        else:
            failures = []
            for pos, row in enumerate(split.manifest.rows):
                try:
                    load_image(split.manifest.path(row))
                except ImageLoadError as err:
                    failures.append({"index": pos, "file": row["file_name"], "reason": err.reason})
            if partial_state().is_main_process:
                atomic_write_json(path, failures)
        bad = {f["index"] for f in failures}
        split.index = np.array([i for i in range(len(split.manifest)) if i not in bad], dtype=np.int64)
        self._record_failures(split, failures)

    def _record_failures(self, split: Split, failures: list[dict[str, Any]]) -> None:
        self.image_failures += [{**f, "split": split.name, "role": split.role} for f in failures]

    def _prepare(self) -> None:
        splits = [s for s in self._all_splits() if len(s.manifest)]
        if self._needs_features():
            for split in splits:
                self._features(split)
            if self.config.head:
                self._use_level_head(splits)
        else:
            for split in splits:
                self._probe(split)

    def _use_level_head(self, splits: list[Split]) -> None:
        """Score with one head of a multi-granularity classifier: its logits, and ID labels from its level's field, on
        every split (aux, validation and field sets included)."""
        from pipelines.training import MultiGranularity

        spec = self.config.head or {}
        objective = MultiGranularity.from_pretrained(spec["levels"])
        if spec["level"] not in objective.levels:
            raise ConfigError(f"head.level: {spec['level']!r} is not a level of {spec['levels']} {sorted(objective.levels)}")
        self.head = LinearHead(*objective.level_head(spec["level"]))
        field_name = objective.levels[spec["level"]]
        vocab = {v: i for i, v in enumerate(objective.vocab[spec["level"]])}
        for split in splits:
            rows = [split.manifest.rows[i] for i in split.index]
            if split.role == "aux":
                labels = split.features.labels
            else:
                labels = np.array([vocab.get(r.get(field_name), -1) if r["role"] == "id" else -1 for r in rows], dtype=np.int64)
            features = split.features.features
            split.features = FeatureSet(features, self.head(features.astype(np.float64)).astype(np.float32), labels)
            split.key = combine(split.key, "head", spec["levels"], spec["level"])

    # -- units -----------------------------------------------------------------------------------------------
    def _build(self, spec: DetectorSpec, class_names: list[str] | None) -> Detector:
        cls = detector_class(spec.name)
        params = dict(spec.params)
        runtime = {"class_names": class_names, "cache_dir": str(self.cache_dir / cls.family), "device": self.config.device,
                   "precision": None if self.config.precision == "auto" else self.config.precision}
        if cls.accepts("classifier") and "classifier" not in params and self.config.model:
            # a training-time method fine-tunes its classifier: it gets its own copy, the others share one
            clf = self._load_classifier()
            params["classifier"] = copy.deepcopy(clf) if cls.family == "training" else clf
        for key, value in runtime.items():
            if value is not None and key not in params and cls.accepts(key):
                params[key] = value
        if spec.load:
            return cls.from_pretrained(spec.load, **params)
        return cls(**params)

    def _data(self, det: Detector, split: Split) -> Any:
        return split.features if reads_features(type(det)) else split.images()

    def _fit(self, det: Detector, aux: Split | None) -> None:
        kwargs: dict[str, Any] = {}
        val = self.id_splits["val"]
        kwargs["id_val"] = self._data(det, val) if len(val.manifest) else None
        accepted = inspect.signature(det.fit).parameters
        if reads_features(type(det)):
            kwargs["head"] = self.head
        ood_val = self.extra.get("ood_val") or self.extra.get("select.ood_val")
        if ood_val is not None and "ood_val" in accepted:
            kwargs["ood_val"] = self._data(det, ood_val)
        if aux is not None and "aux" in accepted:
            kwargs["aux"] = self._data(det, aux)
        train = self._data(det, self.id_splits["train"])
        if type(det).fits_from_shards and partial_state().num_processes > 1:
            # each process fits its contiguous share of the rows; the sums are reduced exactly over the processes
            shard = lambda fs: fs.subset(process_rows(len(fs))) if isinstance(fs, FeatureSet) else fs  # noqa: E731
            with across_processes():
                det.fit(shard(train), **{k: shard(v) for k, v in kwargs.items()})
            return
        det.fit(train, **kwargs)

    def _run_key(self) -> str:
        """What every unit's result depends on besides its own spec: the splits' content keys, head, selection, set
        groups, the model source, precision and device (computed once the features are prepared)."""
        cfg = self.config
        return combine("unit-v1", [s.key for s in self._all_splits()], cfg.head, cfg.select,
                       [(s.name, s.group) for s in self.ood_splits], source_identity(cfg.model), cfg.precision, cfg.device)

    def _run_unit(self, spec: DetectorSpec, class_names: list[str] | None) -> UnitResult:
        start = time.perf_counter()
        if self.config.select and _selectable(spec):
            det = self._selected(spec)
        else:
            det = self._build(spec, class_names)
        if not det.fitted:
            self._fit(det, self.extra.get("aux"))
        base = spec.method if det.family == "training" else ""  # training methods: the base of their post-hoc rules
        rows, frames = self._score_all(det, spec.method, base, "", start)
        for rule in spec.rules:
            rule_rows, rule_frames = self._score_rule(det, spec, rule)
            rows += rule_rows
            frames += rule_frames
        return UnitResult(pd.DataFrame(rows, columns=RESULT_COLUMNS), pd.concat(frames, ignore_index=True))

    def _score_all(self, det: Detector, method: str, base: str, rule: str, start: float,
                   transform: Any = None) -> tuple[list[dict[str, Any]], list[pd.DataFrame]]:
        """Score ID test, every OOD set and every field set; rows per OOD set with the fit time in `seconds`."""
        def data(split: Split) -> Any:
            return transform(split.features) if transform is not None else self._data(det, split)

        test = self.id_splits["test"]
        id_scores = det.score(data(test))
        fit_seconds = time.perf_counter() - start
        frames = [_score_frame(method, det.family, "id", "id", "id", test.positions(), id_scores)]
        rows = []
        for split in self.ood_splits:
            t0 = time.perf_counter()
            ood_scores = det.score(data(split))
            rows.append({"method": method, "family": det.family, "base": base, "rule": rule, "ood_set": split.name,
                         "group": split.group, **compute_metrics(id_scores, ood_scores), "n_id": len(id_scores),
                         "n_ood": len(ood_scores), "seconds": fit_seconds + time.perf_counter() - t0})
            frames.append(_score_frame(method, det.family, "ood", split.name, split.group or "", split.positions(), ood_scores))
        for split in self.field_splits:
            if len(split.positions()):
                frames.append(_score_frame(method, det.family, split.role, split.name, "field", split.positions(),
                                           det.score(data(split))))
        return rows, frames

    def _score_rule(self, det: Detector, spec: DetectorSpec, rule: str) -> tuple[list[dict[str, Any]], list[pd.DataFrame]]:
        """A post-hoc rule fitted and scored on the trained model's outputs (`transform`, `trained_head`)."""
        if not hasattr(det, "transform"):
            raise TypeError(f"{spec.name}: rules need a training-time detector with transform() and trained_head")
        start = time.perf_counter()
        scorer = build(rule)
        val = self.id_splits["val"]
        scorer.fit(det.transform(self.id_splits["train"].features), head=det.trained_head,
                   id_val=det.transform(val.features) if val.features is not None else None)
        return self._score_all(scorer, f"{spec.method}+{rule}", spec.method, rule, start, transform=det.transform)

    def _selected(self, spec: DetectorSpec) -> Detector:
        sel = self.config.select or {}
        ood_val = self.extra["select.ood_val"]
        det, _, table = select(spec.name, self.id_splits["val"].features, ood_val.features, id_train=self.id_splits["train"].features,
                               head=self.head, metric=sel.get("metric", "auroc"), fixed=spec.params)
        if partial_state().is_main_process:
            _write_csv(pd.DataFrame(table), self.out / "selection" / f"{spec.method}.csv")
        return det

    # -- run ---------------------------------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        """Prepare features, run every unit (skipping finished ones), write the outputs; return the results table."""
        cfg = self.config
        main = partial_state().is_main_process
        self.out.mkdir(parents=True, exist_ok=True)
        self._prepare()
        class_names = cfg.class_names or _class_names(self.id_splits["train"].manifest)
        done: list[UnitResult] = []
        with chunk_rows(cfg.chunk_rows) if cfg.chunk_rows else contextlib.nullcontext():
            self._run_units(class_names, done, main)
        results = _results(done)
        if main:
            self._write_outputs(done, final=True)
            if cfg.fewshot:
                try:
                    self._fewshot(class_names)
                except Exception as err:  # noqa: BLE001 - recorded like a failing detector
                    self.detector_failures.append(self.store.fail("fewshot", "", err))
                    self._write_outputs(done, final=False)
        return results

    def _run_units(self, class_names: list[str] | None, done: list[UnitResult], main: bool) -> None:
        """Each detector spec in turn: a finished unit is read back, a failing one recorded; outputs after each."""
        run_key = self._run_key()
        for spec in self.specs:
            key = combine(run_key, spec.__dict__)
            found = self.store.finished(spec.method, key)
            if found is None:
                try:
                    found = self._run_unit(spec, class_names)
                except Exception as err:  # noqa: BLE001 - one failing detector is recorded, the others go on
                    if main:
                        self.detector_failures.append(self.store.fail(spec.method, key, err))
                    print(f"[oodforge] detector {spec.method} failed: {type(err).__name__}: {err} "
                          f"(see {self.store.folder(spec.method) / 'traceback.txt'})")
                    continue
                if main:
                    self.store.write(spec.method, key, found, {"method": spec.method})
            done.append(found)
            if main:
                self._write_outputs(done, final=False)

    def _write_outputs(self, done: list[UnitResult], final: bool) -> None:
        _write_csv(_results(done), self.out / "results.csv")
        atomic_write_json(self.out / "failures.json", {"images": self.image_failures, "detectors": self.detector_failures})
        if not final:
            return
        scores = pd.concat([u.scores for u in done], ignore_index=True) if done else pd.DataFrame(columns=SCORE_COLUMNS)
        with atomic_path(self.out / "scores.parquet") as tmp:
            scores.to_parquet(tmp, index=False)
        if self.config.threshold_transfer and done:
            species = {s.name: {int(i): s.manifest.rows[i].get("species") for i in s.positions()}
                       for s in self.field_splits if s.role == "field_ood"}
            _write_csv(transfer_table(self.config.threshold_transfer, scores, species), self.out / "threshold_transfer.csv")

    def _fewshot(self, class_names: list[str] | None) -> None:
        """Few-shot sweep of prompt-learning detectors (shots x seeds) on the run's ID and OOD splits
        -> fewshot.csv and fewshot.png (config keys: model, methods, shots, seeds, device, plot)."""
        from detectors.clip.fewshot import class_names_from, plot_fewshot, sweep_sets

        sweep_config = {"out_dir": str(self.out / "fewshot"), "cache_dir": str(self.cache_dir / "clip"), **self.config.fewshot}
        given = sweep_config.get("class_names") or sweep_config.get("class_names_file")
        names = class_names_from(sweep_config) if given else class_names
        if not names:
            raise ConfigError("fewshot: class names are needed (config `class_names`, or `class_name` fields in the ID manifest)")
        rows = sweep_sets(sweep_config, self.id_splits["train"].images(), self.id_splits["test"].images(),
                          {s.name: s.images() for s in self.ood_splits}, {s.name: s.group for s in self.ood_splits}, names)
        _write_csv(pd.DataFrame(rows), self.out / "fewshot.csv")
        plot_fewshot(rows, str(sweep_config.get("plot", self.out / "fewshot.png")))


SCORE_COLUMNS = ["method", "family", "role", "ood_set", "group", "index", "score"]


def _sets_of(src: Source, where: str) -> dict[str, Manifest]:
    """The OOD sets of a source (role ood rows of its split, `sets` honoured), each with rows."""
    manifest = read_manifest(src.manifest).select(role="ood", split=src.split)
    names = src.sets or manifest.ood_sets()
    if not names:
        raise ConfigError(f"{where}: {src.manifest} has no OOD rows with split {src.split!r}")
    found = {}
    for name in names:
        part = manifest.select(ood_set=name)
        if not len(part):
            raise ConfigError(f"{where}: OOD set {name!r} has no rows with split {src.split!r} in {src.manifest} "
                              f"(sets there: {manifest.ood_sets()})")
        found[name] = part
    return found


def _merged(parts: dict[str, Manifest]) -> Manifest:
    return Manifest(next(iter(parts.values())).root, [r for p in parts.values() for r in p.rows])


def _aux_rows(src: Source) -> Manifest:
    """Auxiliary (outlier-exposure) rows: the `auxiliary` set by default when the manifest has one; never ID rows."""
    manifest = read_manifest(src.manifest).select(split=src.split)
    sets = src.sets or (["auxiliary"] if "auxiliary" in manifest.ood_sets() else None)
    if sets:
        manifest = Manifest(manifest.root, [r for r in manifest.rows if r["role"] == "ood" and r["ood_set"] in sets])
    n_id = sum(r["role"] == "id" for r in manifest.rows)
    if n_id:
        raise ConfigError(f"aux: {src.manifest} split {src.split!r} holds {n_id} ID rows (role id); auxiliary data must be "
                          f"outliers only: pick its sets with `sets:` (sets there: {manifest.ood_sets()})")
    if not len(manifest):
        raise ConfigError(f"aux: no rows in {src.manifest} with split {src.split!r} and sets {sets}")
    return manifest


def _check_buildable(spec: DetectorSpec, where: str) -> None:
    """Build the detector once with its configured parameters (no model loads) so bad values fail in the plan."""
    if spec.load:
        if not (Path(spec.load) / "config.json").is_file():
            raise ConfigError(f"{where}.load: {spec.load} is not a saved detector folder (no config.json)")
        return
    try:
        detector_class(spec.name)(**spec.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.params: {spec.name}: {err}") from None


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


def _score_frame(method: str, family: str, role: str, ood_set: str, group: str, index: np.ndarray, scores: np.ndarray) -> pd.DataFrame:
    return pd.DataFrame({"method": method, "family": family, "role": role, "ood_set": ood_set, "group": group,
                         "index": np.asarray(index, dtype=np.int64), "score": scores})


def _results(done: list[UnitResult]) -> pd.DataFrame:
    frames = [u.rows for u in done if len(u.rows)]
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=RESULT_COLUMNS)
    results[["base", "rule"]] = results[["base", "rule"]].fillna("")
    return results


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
