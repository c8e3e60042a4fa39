"""The evaluation runner: a `Plan` (detectors.harness.plan) -> feature caches -> units -> results table and per-sample
scores.

Four steps:
1. **plan** — `make_plan(config)`: the whole config checked, every detector built once, every manifest read and
   checked (duplicate set names, leaks by path and by content), unit keys from content, before any model loads;
2. **features** — one content-addressed feature cache per split (`pipelines.fingerprint`), returned as values
   (`Prepared`); images that fail to load are recorded and left out of every detector's populations alike;
3. **units** — `detector`, `select`, `rule` and `fewshot` units (`detectors.harness.units`): fit, score, write rows and
scores
   atomically; a finished unit is skipped on rerun, a failing one recorded in `failures.json` and the others go on;
4. **outputs** — `results.csv`, `ood_metrics.csv`, `scores.parquet`, `failures.json`, `threshold_transfer.csv`,
   `rule_selection.csv`.
"""
from __future__ import annotations

import contextlib
import copy
import dataclasses
import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from detectors.base import RUNTIME_INPUTS, Detector, FeatureSet, ImageSet, LinearHead
from detectors.harness.distribute import EVERY, assign
from detectors.harness.openset import (
    OOD_METRICS_FILE,
    KnownClasses,
    from_logits,
    ood_csv_table,
    oosa_threshold,
    openset_columns,
    predictions,
)
from detectors.harness.plan import (
    FEATURES_VERSION,
    Plan,
    Split,
    Unit,
    check_spec,
    key_record,
    make_plan,
    reads_features,
    safe_name,
)
from detectors.harness.protocols import OOSA_SCORER
from detectors.harness.results import LOWER_IS_BETTER, PREDICTION, RESULT_COLUMNS, SCORE_COLUMNS, SCORE_OPTIONAL
from detectors.harness.runconfig import ConfigError, DetectorSpec, EvalConfig, Source
from detectors.harness.sanity import (
    accuracy_warnings,
    head_warning,
    id_classes,
    one_class_warning,
    protocol_warning,
    small_set_warnings,
)
from detectors.harness.selection import defaults_note, select
from detectors.harness.transfer import transfer_table
from detectors.harness.units import UnitResult, UnitStore
from detectors.metrics import evaluate as compute_metrics
from detectors.posthoc.pixels import pixel_memo
from detectors.posthoc.streaming import across_processes, chunk_rows, process_rows
from pipelines import rankfiles
from pipelines.batches import clear_kept_batches
from pipelines.collectives import (
    PeerFailed,
    PeerLost,
    all_gather,
    alone,
    fail_together,
    host,
    is_peer_lost,
    main_decides,
    peer_guard,
    peer_line,
)
from pipelines.data import Manifest
from pipelines.errors import UserInputError
from pipelines.fingerprint import (
    combine,
    image_identity,
    images_fingerprint,
    preprocessing_fingerprint,
    weights_fingerprint,
)
from pipelines.io import atomic_path, atomic_write_json, remove_orphan_temps
from pipelines.locks import output_lock
from pipelines.runtime import partial_state, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

RANKS_FOLDER = ".ranks"  # under units/: each process's done mark and heartbeat (pipelines.rankfiles)

__all__ = ["EvalConfig", "Source", "DetectorSpec", "ConfigError", "Plan", "make_plan", "Runner", "run_config",
           "dump_config", "reads_features", "RESULT_COLUMNS", "SCORE_COLUMNS"]



@dataclass(frozen=True)
class Prepared:
    """A split's prepared data: its features (None in pixel-only runs), the rows that loaded, and a content key."""

    features: FeatureSet | None
    index: np.ndarray
    key: str


@dataclass
class Scored:
    """What scoring a detector gave: its result rows and per-sample score frames."""

    rows: list[dict[str, Any]]
    frames: list[pd.DataFrame]


class Runner:
    """Executes a Plan (`Runner(make_plan(config)).run()`); a config, mapping or path is planned once first."""

    def __init__(self, plan: Plan | EvalConfig | dict[str, Any] | str | os.PathLike):
        self.plan = plan if isinstance(plan, Plan) else make_plan(plan)
        self.store = UnitStore(self.plan.out)
        self.classifier = None
        self.head: LinearHead | None = None
        self.data: dict[str, Prepared] = {}
        self.image_failures: list[dict[str, Any]] = []
        self.set_failures: list[dict[str, Any]] = []  # test sets with no loadable row: recorded, left out
        self._left_out: set[str] = set()
        self.detector_failures: list[dict[str, Any]] = []
        self.reused = 0
        self._trained: dict[str, Detector] = {}
        self._images: dict[str, ImageSet] = {}
        self._selected_on: dict[str, str] = {}  # swept units: the metric and the validation splits that chose
        self._theta_scorers: dict[str, Detector] = {}  # swept units: another scorer picking the OOSA threshold
        self._predicted: dict[str, list[str] | None] = {}  # split id -> the classifier's predicted class per row
        self.pixels = None  # the run's pixels (pipelines.pixels.RunPixels), set with the classifier
        self._together = False  # the running unit runs on every rank together (detectors.harness.distribute)
        self._writes = True  # this process writes the running unit's files (its rank, or the main one)
        self.units_seconds = 0.0  # wall time of the units (main process: until every rank's are done)

    # -- features ------------------------------------------------------------------------------------------
    def _device(self):
        device = self.plan.runtime.device
        return resolve_device(device) if device else partial_state().device

    def _load_classifier(self):
        if self.classifier is None:  # the plan refuses a run whose detectors need one without `model`
            from pipelines.pixels import run_pixels

            rt = self.plan.runtime
            clf = _classifier(rt.model, rt.model_network).to(self._device()).eval()
            self.pixels = run_pixels(clf, self.plan.protocol, self.plan.runtime.pixels, clf.record)
            clf.pixels = self.pixels.eval  # every evaluation pixel path makes them (pipelines.pixels)
            dtype = resolve_dtype(self.plan.runtime.precision, self._device())
            self._model_key = combine(FEATURES_VERSION, weights_fingerprint(clf), preprocessing_fingerprint(clf),
                                      str(dtype))
            self.classifier = clf
        return self.classifier

    def _fit_pixels(self, split_id: str) -> Any:
        """The pixels of a split's rows when they are not the evaluation pixels: the protocol's fit pixels of ID train
        rows (`pipelines.pixels.PROTOCOL_PIXELS`), else None."""
        if split_id != "id-id_train" or not self.plan.runtime.model:
            return None
        self._load_classifier()
        return self.pixels.fit

    def _features(self, split: Split) -> Prepared:
        """The split's feature cache (built once, content-keyed), memory-mapped; records its unreadable images."""
        from pipelines.features import FeatureCache, cache_path, extract_features

        rt = self.plan.runtime
        clf = self._load_classifier()
        fit = self._fit_pixels(split.id)  # ID train rows: the protocol's fit pixels (train: seeded draws per row)
        key = combine(self._model_key, split.data_key or images_fingerprint(split.manifest, rt.cache_hash),
                      *([self.pixels.fit_identity()] if fit is not None else []))
        path = cache_path(self.plan.cache_dir, split.id, key)
        cache = extract_features(clf, split.manifest, batch_size=rt.batch_size, device=str(self._device()),
                                 precision=rt.precision, num_workers=rt.num_workers, key=key, cache=path,
                                 desc=split.name, pixels=fit, seed=self.pixels.seed)
        state = partial_state()
        if state.num_processes > 1:
            state.wait_for_everyone()  # the main process has written the file
        if path.is_file():  # detectors stream memory-mapped caches in chunks (paper-scale ID train sets)
            cache = FeatureCache.load(path, mmap=True)
        self.head = cache.head()
        self._record_failures(split, cache.failures)
        features = cache.to_featureset()
        if split.role == "aux":  # auxiliary rows are OOD (label -1); their own class index (Extended) is `aux_label`
            labels = np.array([split.manifest.rows[i].get("aux_label", -1) for i in cache.index], dtype=np.int64)
            features = FeatureSet(features.features, features.logits, labels)
        return Prepared(features, np.asarray(cache.index, dtype=np.int64), key)

    def _probe(self, split: Split) -> Prepared:
        """Pixel-only runs: find the rows whose image loads (cached per image-set key), so failures are excluded
        alike."""
        key = combine("probe-v1", split.data_key or images_fingerprint(split.manifest, self.plan.runtime.cache_hash))
        path = self.plan.cache_dir / "probe" / f"{split.id}-{key}.json"
        if path.is_file():
            failures = json.loads(path.read_text())
        else:
            from pipelines.features import ManifestPixels, pixel_loader

            rows = split.manifest.rows
            dataset = ManifestPixels(split.manifest, list(range(len(rows))), _Probe())
            failures = [{"index": pos, "file": rows[pos]["file_name"], "reason": reason}
                        for _, _, failed in pixel_loader(dataset, self.plan.runtime.batch_size,
                                                         self.plan.runtime.num_workers)
                        for pos, reason in failed]
            if partial_state().is_main_process:
                atomic_write_json(path, failures)
        bad = {f["index"] for f in failures}
        self._record_failures(split, failures)
        return Prepared(None, np.array([i for i in range(len(split.manifest)) if i not in bad], dtype=np.int64), key)

    def _record_failures(self, split: Split, failures: list[dict[str, Any]]) -> None:
        self.image_failures += [{**f, "split": split.name, "role": split.role} for f in failures]

    def prepare(self) -> dict[str, Prepared]:
        """Every non-empty split's prepared data by split id (features, or an image probe in pixel-only runs)."""
        splits = [s for s in self.plan.splits if len(s.manifest)]
        if not self.plan.needs_features:
            return {s.id: self._probe(s) for s in splits}
        data = {s.id: self._features(s) for s in splits}
        if self.plan.head:
            data = self._level_head(splits, data)
        return data

    def _level_head(self, splits: list[Split], data: dict[str, Prepared]) -> dict[str, Prepared]:
        """Score with one head of a multi-granularity classifier: its logits, and ID labels from its level's field, on
        every split (aux, validation and field sets included)."""
        from pipelines.training import MultiGranularity

        spec = self.plan.head
        objective = MultiGranularity.from_pretrained(spec.levels)
        if spec.level not in objective.levels:
            raise ConfigError(f"head.level: {spec.level!r} is not a level of {spec.levels} {sorted(objective.levels)}")
        self.head = LinearHead(*objective.level_head(spec.level))
        field_name = objective.levels[spec.level]
        vocab = {v: i for i, v in enumerate(objective.vocab[spec.level])}
        out = {}
        for split in splits:
            prepared = data[split.id]
            rows = [split.manifest.rows[i] for i in prepared.index]
            if split.role == "aux":
                labels = prepared.features.labels
            else:
                labels = np.array([vocab.get(r.get(field_name), -1) if r["role"] == "id" else -1 for r in rows],
                                  dtype=np.int64)
            features = prepared.features.features
            logits = self.head(features.astype(np.float64)).astype(np.float32)
            out[split.id] = Prepared(FeatureSet(features, logits, labels), prepared.index,
                                     combine(prepared.key, "head", spec.levels, spec.level))
        return out

    def _check_dims(self) -> None:
        """Each detector's value checks again, now that the feature and class counts are known."""
        train = self.data.get("id-id_train")
        if train is None or train.features is None:
            return
        fs = train.features
        dims = {"features": None if fs.features is None else int(fs.features.shape[1]),
                "classes": None if fs.logits is None else int(fs.logits.shape[1])}
        for unit in self.plan.units:
            if unit.kind in ("detector", "select"):
                check_spec(unit.detector, unit.params, unit.load, unit.where, dims)

    # -- data given to detectors ---------------------------------------------------------------------------
    def _split_data(self, det: Detector, split_id: str) -> Any:
        """What `det` reads of a split: its FeatureSet, or its loaded rows as an ImageSet; None for an empty split."""
        prepared = self.data.get(split_id)
        if prepared is None:
            return None
        if reads_features(det):
            return prepared.features
        if split_id not in self._images:
            split = self.plan.split(split_id)
            rows = [split.manifest.rows[i] for i in prepared.index]
            fit = self._fit_pixels(split_id)
            self._images[split_id] = ImageSet(manifest=Manifest(split.manifest.root, rows),
                                              labels=self._labels(split_id),
                                              pixels=fit, seed=self.pixels.seed if fit is not None else 0,
                                              num_workers=self.plan.runtime.num_workers)
        return self._images[split_id]

    def _labels(self, split_id: str) -> np.ndarray:
        """The split's labels as the features carry them (level labels with `head:`), else the manifest's."""
        prepared = self.data[split_id]
        if prepared.features is not None and prepared.features.labels is not None:
            return np.asarray(prepared.features.labels)
        split = self.plan.split(split_id)
        return np.array([split.manifest.rows[i]["label"] for i in prepared.index], dtype=np.int64)

    def _fit_kwargs(self, det: Detector) -> dict[str, Any]:
        """The optional fit inputs `det`'s class declares (`fit_inputs`): ID val, head, OOD val, aux."""
        wants = type(det).fit_inputs
        kwargs: dict[str, Any] = {}
        if "id_val" in wants:
            kwargs["id_val"] = self._split_data(det, "id-id_val")
        if "head" in wants and reads_features(det):
            kwargs["head"] = self.head
        ood_val = self.plan.ood_val
        if "ood_val" in wants and ood_val is not None:
            kwargs["ood_val"] = self._split_data(det, ood_val.id)
        if "aux" in wants and self.plan.split("aux-aux") is not None:
            kwargs["aux"] = self._split_data(det, "aux-aux")
        return kwargs

    def _fit(self, det: Detector) -> None:
        kwargs = self._fit_kwargs(det)
        train = self._split_data(det, "id-id_train")
        if type(det).fits_from_shards and self._together and partial_state().num_processes > 1:
            # each process fits its contiguous share of the rows; the sums are reduced exactly over the processes
            shard = lambda fs: fs.subset(process_rows(len(fs))) if isinstance(fs, FeatureSet) else fs  # noqa: E731
            with across_processes():
                det.fit(shard(train), **{k: shard(v) for k, v in kwargs.items()})
            return
        det.fit(train, **kwargs)

    def _build(self, unit: Unit) -> Detector:
        """The detector of a unit (its resolved parameters), with the runtime objects its class `needs` (a training
        method gets its own copy of the classifier, which it fine-tunes; the others share one)."""
        cls, method = unit.detector, unit.method
        params = dict(unit.params)
        rt = self.plan.runtime
        runtime = {"class_names": list(self.plan.class_names) if self.plan.class_names else None,
                   "cache_dir": str(self.plan.cache_dir / cls.family), "device": rt.device,
                   "precision": None if rt.precision == "auto" else rt.precision,
                   "work_dir": str(self.store.folder(method) / "work")}
        if "classifier" in cls.needs and "classifier" not in params and rt.model:
            clf = self._load_classifier()
            params["classifier"] = copy.deepcopy(clf) if cls.family == "training" else clf
        for key, value in runtime.items():
            if value is not None and key not in params and key in cls.needs:
                params[key] = value
        if unit.load:
            return cls.from_pretrained(unit.load, **params)
        return cls(**params)

    # -- units -----------------------------------------------------------------------------------------------
    def _run_unit(self, unit: Unit) -> UnitResult:
        if unit.kind == "fewshot":
            self._fewshot()
            return UnitResult(pd.DataFrame(columns=RESULT_COLUMNS), pd.DataFrame(columns=SCORE_COLUMNS))
        if unit.kind == "rule":
            return self._rule_unit(unit)
        start = time.perf_counter()
        det = self._selected(unit) if unit.kind == "select" else self._build(unit)
        if not det.fitted:
            self._fit(det)
        if unit.rules:
            self._trained[unit.method] = det
        training = det.family == "training"
        mode = str(det.params.get("mode", "")) if training else ""
        known = self._known(det, det if training else None)
        scored = self._score_all(det, unit.method, det.family, mode, unit.method if training else "", "", start, known)
        validation = self._validation(det, unit.method, "") if training else None
        return _result(scored, validation)

    def _rule_unit(self, unit: Unit) -> UnitResult:
        """A post-hoc rule fitted and scored on the trained model's outputs (`transform`, `trained_head`)."""
        trained = self._parent(unit)
        if not hasattr(trained, "transform"):
            raise TypeError(f"{unit.parent.method}: rules need a training-time detector with transform() and "
                            "trained_head")
        start = time.perf_counter()
        scorer = unit.detector(**unit.params)  # the rule's resolved parameters (protocol merged)
        view = lambda split_id: _transformed(trained, self._split_data(trained, split_id))  # noqa: E731
        scorer.fit(view("id-id_train"), head=trained.trained_head, id_val=view("id-id_val"))
        mode = str(trained.params.get("mode", ""))
        scored = self._score_all(scorer, unit.method, "training", mode, unit.parent.method, unit.rule, start,
                                 self._known(scorer, trained), view=view)
        return _result(scored, self._validation(scorer, unit.parent.method, unit.rule, view))

    def _parent(self, unit: Unit) -> Detector:
        """The trained detector a rule re-scores: kept from its unit in this run, else fitted again (not rewritten)."""
        parent = unit.parent
        if parent.method not in self._trained:
            det = self._build(parent)
            if not det.fitted:
                self._fit(det)
            self._trained[parent.method] = det
        return self._trained[parent.method]

    def _selected(self, unit: Unit) -> Detector:
        """The protocol's validation sweep (`unit.parts["sweep"]`, ID val against OOD val) on cached features or, for
        image-level detectors, on the validation images; the best point's detector, fitted."""
        sel = self.plan.select
        probe = self._build(unit)  # what the detector reads and its fit inputs, for every point alike
        fit_kwargs = {k: v for k, v in self._fit_kwargs(probe).items() if k != "id_val"}
        fit_kwargs["id_val"] = self._split_data(probe, "id-id_val")
        make = lambda params: self._build(dataclasses.replace(unit, params=params))  # noqa: E731
        sets = ",".join(sorted({r["ood_set"] for r in self.plan.split(sel.split).manifest.rows}))
        try:
            with pixel_memo(self.plan.runtime.sweep_pixel_mb):  # image-level sweeps preprocess the images once
                det, _, table = select(unit.name, fit_kwargs["id_val"], self._split_data(probe, sel.split),
                                       id_train=self._split_data(probe, "id-id_train"), space=unit.parts["sweep"],
                                       metric=sel.metric, fixed=dict(unit.params), make=make, fit_kwargs=fit_kwargs,
                                       ties=sel.ties)
            self._selected_on[unit.method] = f"{sel.metric}: id_val vs ood_val[{sets}]"
        except ValueError as err:  # no grid point fits these features (e.g. NECO's dims on D = 64): the defaults run
            det, table = probe, [{"error": str(err)}]
            self._selected_on[unit.method] = "defaults: no grid point fits the data"
        if self._writes:  # which split chose: ID val against these OOD-validation sets
            frame = pd.DataFrame(table).assign(metric=sel.metric, id_val="id_val", ood_val=sets)
            _write_csv(frame, self.plan.out / "selection" / f"{safe_name(unit.method)}.csv")
        if OOSA_SCORER[self.plan.protocol] == "defaults" and probe is not det and probe.params != det.params:
            self._theta_scorers[unit.method] = probe  # the reference picks the threshold before its sweep
        return det

    def _known(self, det: Detector, trained: Detector | None) -> KnownClasses:
        """ID test and val predictions of the classifier the rows score with (`detectors.harness.openset`): the trained
        model's logits (`transform`) for training methods and their rules, the run classifier's cached logits for
        detectors that use it, a detector's own `predict` (CLIP's class prompts), else none (NaN columns). Val
        predictions only where OOD validation rows choose the OOSA threshold."""
        ood_val = self.plan.ood_val
        val = ood_val is not None and ood_val.id in self.data
        return KnownClasses(self._predictions(det, trained, "id-id_test"),
                            self._predictions(det, trained, "id-id_val") if val else None)

    def _predictions(self, det: Detector, trained: Detector | None, split_id: str) -> Any:
        prepared = self.data.get(split_id)
        if prepared is None or not len(prepared.index):
            return None
        labels = self._labels(split_id)
        if trained is not None and hasattr(trained, "transform"):
            return from_logits(self._trained_logits(trained, split_id), labels)
        if prepared.features is not None and (reads_features(det) or "classifier" in type(det).needs):
            return from_logits(prepared.features.logits, labels)
        if hasattr(det, "predict"):
            return predictions(det.predict(self._split_data(det, split_id)), labels)
        return None

    def _trained_logits(self, trained: Detector, split_id: str) -> np.ndarray | None:
        """A split's logits by a trained model: `transform` of what it reads; a method that reads images only to score
        (RotPred in heads mode) but transforms features is given the cached features."""
        data = self._split_data(trained, split_id)
        features = self.data[split_id].features
        if isinstance(data, ImageSet) and features is not None:
            try:
                return trained.transform(data).logits
            except (TypeError, ValueError, AttributeError):
                return trained.transform(features).logits
        return trained.transform(data).logits

    def _oosa_threshold(self, method: str, det: Detector, view: Any, val: Any) -> float | None:
        """The OOSA threshold on ID val against OOD val (None without both or predictions), scored by the row's
        detector or, for a swept unit under a `defaults` protocol (`OOSA_SCORER`), at its parameters before the
        sweep."""
        scorer = self._theta_scorers.pop(method, det)
        ood_val = self.plan.ood_val
        if val is None or ood_val is None or ood_val.id not in self.data or not len(self.data[ood_val.id].index):
            return None
        if not scorer.fitted:
            try:
                self._fit(scorer)
            except ValueError as err:  # the defaults do not fit these data (the sweep skipped such points too)
                log.info("%s: OOSA threshold from the selected point (its defaults do not fit: %s)", method, err)
                scorer = det
        get = view or (lambda split_id: self._split_data(scorer, split_id))
        return oosa_threshold(scorer.score(get("id-id_val")), scorer.score(get(ood_val.id)), val)

    def _validation(self, det: Detector, base: str, rule: str, view: Any = None) -> dict[str, Any] | None:
        """The unit's metric on ID val against OOD val (rule selection reads it); None without both."""
        ood_val = self.plan.ood_val
        if ood_val is None or "id-id_val" not in self.data or ood_val.id not in self.data:
            return None
        get = view or (lambda split_id: self._split_data(det, split_id))
        metric = self.plan.select.metric if self.plan.select else "auroc"
        value = compute_metrics(det.score(get("id-id_val")), det.score(get(ood_val.id)))[metric]
        sets = sorted({r["ood_set"] for r in ood_val.manifest.rows})
        return {"base": base, "rule": rule, "metric": metric, "value": float(value), "ood_val": ",".join(sets),
                "n_id_val": int(len(self.data["id-id_val"].index)), "n_ood_val": int(len(self.data[ood_val.id].index))}

    def _score_all(self, det: Detector, method: str, family: str, mode: str, base: str, rule: str, start: float,
                   known: KnownClasses, view: Any = None) -> Scored:
        """Score ID test, every OOD set and every field set; rows per OOD set with the fit time in `seconds` and the
        open-set columns (`known`: the scoring classifier's predictions)."""
        get = view or (lambda split_id: self._split_data(det, split_id))
        frame = lambda split, role, group, scores: self._score_frame(method, family, role, split, group, scores)  # noqa: E731
        test = self.plan.split("id-id_test")
        id_scores = det.score(get(test.id))
        fit_seconds = time.perf_counter() - start
        params = _params_json(det)
        theta = self._oosa_threshold(method, det, view, known.val)
        frames, rows = [frame(test, "id", "id", id_scores)], []
        for split in (s for s in self.plan.of_role("ood") if s.id not in self._left_out):
            t0 = time.perf_counter()
            ood_scores = det.score(get(split.id))
            rows.append({"method": method, "family": family, "mode": mode, "protocol": self.plan.protocol,
                         "checkpoint": self.plan.checkpoint, "base": base,
                         "rule": rule, "ood_set": split.name, "group": split.group,
                         **compute_metrics(id_scores, ood_scores), "id_acc": known.accuracy,
                         **openset_columns(id_scores, ood_scores, known, theta, self.plan.protocol),
                         "n_id": len(id_scores), "n_ood": len(ood_scores),
                         "seconds": fit_seconds + time.perf_counter() - t0, "params": params,
                         "selected_on": self._selected_on.get(method, "")})
            frames.append(frame(split, "ood", split.group or "", ood_scores))
        for split in self.plan.of_role("field_id", "field_ood"):
            if split.id in self.data and len(self.data[split.id].index):
                frames.append(frame(split, split.role, "field", det.score(get(split.id))))
        return Scored(rows, frames)

    def _score_frame(self, method: str, family: str, role: str, split: Split, group: str,
                     scores: np.ndarray) -> pd.DataFrame:
        index = self.data[split.id].index
        name = "id" if role == "id" else split.name
        frame = pd.DataFrame({"method": method, "family": family, "role": role, "ood_set": name, "group": group,
                              "index": np.asarray(index, dtype=np.int64), "score": scores,
                              "file_name": [split.manifest.rows[i]["file_name"] for i in index],
                              "manifest": split.source})
        predicted = self._predicted_names(split.id)
        return frame.assign(**{PREDICTION: predicted}) if predicted is not None else frame

    def _predicted_names(self, split_id: str) -> list[str] | None:
        """The run classifier's predicted class of each row of the split (`PREDICTION`; class names where the plan
        has one per logit), computed once per split; None without cached logits."""
        if split_id not in self._predicted:
            features = self.data[split_id].features
            logits = None if features is None else features.logits
            found = None
            if logits is not None and len(logits):
                top = np.asarray(logits).argmax(1)
                names = list(self.plan.class_names or [])
                found = ([names[i] for i in top] if len(names) == np.asarray(logits).shape[1]
                         else [str(i) for i in top])
            self._predicted[split_id] = found
        return self._predicted[split_id]

    # -- run ---------------------------------------------------------------------------------------------------
    def run(self) -> pd.DataFrame:
        """Prepare features, run every unit (skipping finished ones), write the outputs; return the results table.
        Every cache key identifies images by the plan's `cache_hash`."""
        with image_identity(self.plan.runtime.cache_hash), \
                output_lock(self.plan.out, "evaluate", partial_state().is_main_process):  # one writer per output folder
            return self._run()

    def _leave_out_empty_sets(self) -> None:
        """Test OOD and field sets none of whose rows loaded: recorded in failures.json (`sets`) and left out, so the
        other sets are scored."""
        for split in self.plan.of_role("ood", "field_ood"):
            prepared = self.data.get(split.id)
            if prepared is None or not len(prepared.index):
                self._left_out.add(split.id)
                reason = f"none of its {len(split.manifest)} image(s) could be loaded (see `images`)"
                self.set_failures.append({"split": split.name, "role": split.role, "config": split.where,
                                          "reason": reason})
                log.warning("[oodforge] warning: %s set %r: %s; left out", split.where, split.name, reason)

    def _run(self) -> pd.DataFrame:
        state = partial_state()
        main, rank = state.is_main_process, state.process_index
        self.plan.out.mkdir(parents=True, exist_ok=True)
        ranks = self.store.root / RANKS_FOLDER
        if main:  # the temp files a killed run's writes left (a live writer's stay), an earlier run's done marks
            remove_orphan_temps(self.plan.out)
            if not self.plan.cache_dir.resolve().is_relative_to(self.plan.out.resolve()):
                remove_orphan_temps(self.plan.cache_dir)
            rankfiles.clear(ranks)
        rankfiles.check_shared({"out": self.plan.out, "cache_dir": self.plan.cache_dir})
        with peer_guard("the feature extraction"):  # its rows are split across the processes and gathered
            self.data = self.prepare()
        self._leave_out_empty_sets()
        self._check_dims()
        if main:
            self._warn_data()
        note = defaults_note(self.plan)
        if note and main:
            log.info(note)
        # the main process alone reads which units are finished; every rank follows its answer
        finished = self._finished() if main else {}
        pending = set(main_decides(lambda: [u.method for u in self.plan.units if u.method not in finished],
                                   "the finished units' check"))
        where = assign(self.plan.units, pending, state.num_processes, self._train_rows(),
                       self.plan.runtime.shard_fit_rows)
        ran: dict[str, UnitResult | None] = {}  # what this process ran: a result, or None for a failure
        failures: dict[str, dict[str, Any]] = {}
        rows = self.plan.runtime.chunk_rows
        # units run together first (each ends in a collective), then each rank's own: no collective waits on a
        # rank's long unit
        order = [u for u in self.plan.units if where.get(u.method) == EVERY] + \
                [u for u in self.plan.units if where.get(u.method) == rank]
        started = time.perf_counter()
        with chunk_rows(rows) if rows else contextlib.nullcontext(), rankfiles.Heartbeat(ranks, rank):
            for unit in order:
                together = where[unit.method] == EVERY
                ran[unit.method] = self._unit(unit, together, main or not together, failures)
                if unit.kind == "rule" and unit.method == unit.parent.rules[-1]:
                    self._trained.pop(unit.parent.method, None)  # its last rule ran: the trained model can go
                if main:
                    self._write_outputs(self._in_order(finished, ran), final=False)
            mine = sorted(m for m in ran if where[m] == rank)
            rankfiles.mark_done(ranks, rank, {"units": mine, "failures": failures})
        if not main:
            return _results([])
        for mark in rankfiles.wait_for_ranks(ranks, state.num_processes, what="its units")[1:]:
            failures.update(mark["failures"])
            ran.update({m: self._read_back(m) for m in mark["units"] if m not in mark["failures"]})
        self.units_seconds = time.perf_counter() - started
        self.detector_failures += [failures[u.method] for u in self.plan.units if u.method in failures]
        done = self._in_order(finished, ran)
        self._write_outputs(done, final=True)
        self._console_summary()
        results = _results(done)
        self._warn_results(results)
        return results

    def _id_classes(self) -> int | None:
        """The number of ID classes of the ID train (else test) rows; None without either."""
        for split_id in ("id-id_train", "id-id_test"):
            if split_id in self.data:
                return id_classes(self._labels(split_id))
        return None

    def _warn_data(self) -> None:
        """One line each for a head that is not one output per ID class, an ID set of one class and a classifier
        trained under another protocol (`sanity`)."""
        classes = self._id_classes()
        train = self.data.get("id-id_train")
        logits = None if train is None or train.features is None else train.features.logits
        lines = [one_class_warning(classes or 0), protocol_warning(self.plan.runtime.model, self.plan.protocol)]
        if classes and logits is not None:
            lines.append(head_warning(int(np.asarray(logits).shape[1]), classes, str(self.plan.runtime.model)))
        for line in filter(None, lines):
            log.warning("[oodforge] warning: %s", line)

    def _warn_results(self, results: pd.DataFrame) -> None:
        """One line each for an ID accuracy at chance or zero and a set too small for AUROC to resolve 10 points."""
        classes = self._id_classes() or 0
        n_test = len(self._labels("id-id_test")) if "id-id_test" in self.data else 0
        for line in [*accuracy_warnings(results, classes, n_test), *small_set_warnings(results)]:
            log.warning("[oodforge] warning: %s", line)

    def _read_back(self, method: str) -> UnitResult:
        """A unit another rank ran and wrote, read back by the main process."""
        unit = next(u for u in self.plan.units if u.method == method)
        found = self.store.finished(unit.method, unit.key)
        if found is None:
            raise UserInputError(f"{self.store.folder(method)}: another process wrote unit {method!r}, but the main "
                                 f"process on {host()} cannot read it: `out` must be a folder every process sees")
        return found

    def _finished(self) -> dict[str, UnitResult]:
        """The units finished with their current key, read back (main process)."""
        found = {u.method: self.store.finished(u.method, u.key) for u in self.plan.units}
        self.reused = sum(r is not None for r in found.values())
        return {m: r for m, r in found.items() if r is not None}

    def _in_order(self, finished: dict[str, UnitResult], ran: dict[str, UnitResult | None]) -> list[UnitResult]:
        """The finished and the newly run units' results in plan order (failed units left out)."""
        results = {**finished, **ran}
        return [r for r in (results.get(u.method) for u in self.plan.units) if r is not None]

    def _train_rows(self) -> int:
        train = self.data.get("id-id_train")
        return 0 if train is None else len(train.index)

    def _unit(self, unit: Unit, together: bool, writes: bool, failures: dict[str, dict[str, Any]]) -> UnitResult | None:
        """Run a unit and write it (`writes`: this process is its rank, or the main one of a unit run together); a
        failing one is recorded in `failures` (None). A unit run together fails on every rank together: a rank that
        raised says so in one exchange (`fail_together`), which the others meet at the collective they are in
        (`PeerFailed`) or at the agreement after the unit, so none waits for a collective another left."""
        self._together, self._writes = together, writes
        error: BaseException | None = None
        try:
            with contextlib.nullcontext() if together else alone():
                found = self._run_unit(unit)
        except Exception as err:  # noqa: BLE001 - one failing unit is recorded, the others go on
            if together and is_peer_lost(err) and not isinstance(err, PeerFailed):
                raise PeerLost(peer_line(err, f"unit {unit.method}")) from err
            error, found = err, None
        finally:
            self._together, self._writes = False, True
        if together:  # one exchange per rank: at the collective where a peer's failure was met, else here
            if error is None:
                try:
                    all_gather(None, f"unit {unit.method}")
                except PeerFailed as err:
                    error = err
            elif not isinstance(error, PeerFailed):
                fail_together(f"{type(error).__name__}: {error}", f"unit {unit.method}")
        if error is not None:
            if writes:
                failures[unit.method] = self.store.fail(unit.method, unit.key, error)
            log.warning("[oodforge] detector %s failed: %s: %s (see %s)", unit.method, type(error).__name__, error,
                        self.store.folder(unit.method) / "traceback.txt")
            return None
        if writes:
            self.store.write(unit.method, unit.key, found, {"method": unit.method, "kind": unit.kind,
                                                            "key_parts": key_record(unit, self.plan)})
            clear_kept_batches(self.store.folder(unit.method) / "work")  # the unit's scores are written: not needed
        return found

    def _console_summary(self) -> None:
        log.info("units: %d run in %.1f s on %d process(es)", len(self.plan.units) - self.reused, self.units_seconds,
                 partial_state().num_processes)
        if self.reused:
            log.info("resumed: %d of %d units up to date", self.reused, len(self.plan.units))
        n_images, n_units, n_sets = len(self.image_failures), len(self.detector_failures), len(self.set_failures)
        failures = self.plan.out / "failures.json"
        if n_sets:
            log.info("%d set%s left out (no loadable image) -> %s", n_sets, "s" if n_sets > 1 else "", failures)
        if n_images:
            log.info("%d image%s unreadable -> %s", n_images, "s" if n_images > 1 else "", failures)
        if n_units:
            log.info("%d detector%s failed -> %s", n_units, "s" if n_units > 1 else "", failures)

    def _write_outputs(self, done: list[UnitResult], final: bool) -> None:
        out = self.plan.out
        results = _results(done)
        _write_csv(results, out / "results.csv")
        _write_csv(ood_csv_table(results), out / OOD_METRICS_FILE)  # the reference's ood.csv columns
        atomic_write_json(out / "failures.json", {"images": self.image_failures, "sets": self.set_failures,
                                                  "detectors": self.detector_failures})
        if not final:
            return
        scores = pd.concat([u.scores for u in done], ignore_index=True) if done else pd.DataFrame(columns=SCORE_COLUMNS)
        with atomic_path(out / "scores.parquet") as tmp:
            scores.to_parquet(tmp, index=False)
        validation = [v for u in done for v in (u.validation or [])]
        if validation:
            _write_csv(rule_selection(validation), out / "rule_selection.csv")
        if self.plan.transfer and len(scores):
            species = {s.name: {int(i): s.manifest.rows[i].get("species") for i in self.data[s.id].index}
                       for s in self.plan.of_role("field_ood") if s.id in self.data}
            rules = [t.to_dict() for t in self.plan.transfer]
            _write_csv(transfer_table(rules, scores, species), out / "threshold_transfer.csv")

    def _fewshot(self) -> None:
        """Few-shot sweep of prompt-learning detectors (shots x seeds) on the run's ID and OOD splits
        -> fewshot.csv and fewshot.png (config keys: model, methods, shots, seeds, device, plot)."""
        from detectors.clip.fewshot import class_names_from, plot_fewshot, sweep_sets

        out = self.plan.out
        given_keys = {k: v for k, v in self.plan.fewshot.to_dict().items() if v is not None}
        sweep_config = {"out_dir": str(out / "fewshot"), "cache_dir": str(self.plan.cache_dir / "clip"), **given_keys}
        given = sweep_config.get("class_names") or sweep_config.get("class_names_file")
        names = (class_names_from(sweep_config) if given
                 else (list(self.plan.class_names) if self.plan.class_names else None))
        if not names:
            raise ConfigError("fewshot: class names are needed (config `class_names`, or `class_name` fields in the ID "
                              "manifest)")
        images = lambda split: self._split_data_images(split)  # noqa: E731
        ood = self.plan.of_role("ood")
        rows = sweep_sets(sweep_config, images("id-id_train"), images("id-id_test"),
                          {s.name: images(s.id) for s in ood}, {s.name: s.group for s in ood}, names)
        if self._writes:  # the sweep runs on every rank together; the main process writes it
            _write_csv(pd.DataFrame(rows), out / "fewshot.csv")
            plot_fewshot(rows, str(sweep_config.get("plot", out / "fewshot.png")))

    def _split_data_images(self, split_id: str) -> ImageSet:
        split, prepared = self.plan.split(split_id), self.data[split_id]
        return ImageSet(manifest=Manifest(split.manifest.root, [split.manifest.rows[i] for i in prepared.index]))


class _Probe:
    """A pixel transform that only checks a file decodes: the whole JPEG stream read at the coarsest DCT scale (a
    truncated or corrupt file fails as in a full decode), nothing kept."""

    def load(self, path: Any, rng: Any = None) -> Any:
        import torch

        from pipelines.decode import Decode, Region, decode

        decode(path, Decode(draft=True), lambda width, height: Region((0, 0, width, height), (1, 1)))
        return torch.zeros(0, dtype=torch.uint8)


def _classifier(model: str, network: str | None) -> Any:
    """The run's classifier: an OpenOOD v1.5 checkpoint (`*.ckpt`, `pipelines.openood_checkpoints`), a released
    Open-Insect weight file (`pipelines.zoo`, `network` naming its network where the file name does not), else a
    transformers image classifier (hub id or folder)."""
    from pipelines.openood_checkpoints import is_openood_checkpoint, load_openood_classifier
    from pipelines.zoo import load_classifier

    return load_openood_classifier(model) if is_openood_checkpoint(model) else load_classifier(model, network)


def _transformed(trained: Detector, data: Any) -> Any:
    return None if data is None else trained.transform(data)


def _params_json(det: Detector) -> str:
    """The hyperparameters that ran, as JSON: what the fit settled included (`effective_params`, runtime settings
    already left out), and the runtime inputs some detectors also keep as parameters (CLIP's class names) left out."""
    params = {k: v for k, v in det.effective_params().items() if k not in RUNTIME_INPUTS}
    return json.dumps(params, sort_keys=True, default=str)


def _result(scored: Scored, validation: dict[str, Any] | None) -> UnitResult:
    frames = [f for f in scored.frames if len(f)]
    scores = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=[*SCORE_COLUMNS, *SCORE_OPTIONAL])
    return UnitResult(pd.DataFrame(scored.rows, columns=list(RESULT_COLUMNS)), scores,
                      [validation] if validation is not None else None)


def rule_selection(validation: list[dict[str, Any]]) -> pd.DataFrame:
    """Per training method, its own score and each rule on (ID val, OOD val); `chosen` marks the best by the metric."""
    table = pd.DataFrame(validation)
    table["chosen"] = False
    for _, rows in table.groupby("base", sort=False):
        sign = -1.0 if LOWER_IS_BETTER.get(rows["metric"].iloc[0], False) else 1.0
        table.loc[(sign * rows["value"]).fillna(-np.inf).idxmax(), "chosen"] = True  # one per base, NaN never first
    return table


def _results(done: list[UnitResult]) -> pd.DataFrame:
    frames = [u.rows for u in done if len(u.rows)]
    results = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(columns=list(RESULT_COLUMNS))
    text = ["mode", "checkpoint", "base", "rule", "selected_on"]  # rows of units written before `checkpoint`: empty
    results = results.reindex(columns=[*results.columns, *(c for c in text if c not in results)])
    results[text] = results[text].fillna("")
    return results


def _write_csv(frame: pd.DataFrame, path: Path) -> None:
    with atomic_path(path) as tmp:
        frame.to_csv(tmp, index=False)


def run_config(config: Plan | EvalConfig | dict[str, Any] | str | Path) -> pd.DataFrame:
    """Run the evaluation described by a plan, config object, mapping or YAML path; returns the results table."""
    return Runner(config if isinstance(config, Plan) else make_plan(config)).run()


def dump_config(config: EvalConfig, path: str | Path) -> None:
    """Write a config back as YAML (for the record next to the results): `EvalConfig.dump()`, keys at their default
    left out."""
    with atomic_path(path) as tmp:
        tmp.write_text(yaml.safe_dump(config.dump(), sort_keys=False))
