"""Step 1 of an evaluation: a `Plan`'s data prepared once for every unit (`PreparedRun`).

One content-addressed feature cache per split (`pipelines.fingerprint`), memory-mapped, or an image probe in
pixel-only runs; images that fail to load are recorded and left out of every detector's populations alike; test sets
none of whose rows loaded are recorded and left out; each detector's value checks run again on the feature and class
counts. Units read a `PreparedRun` and never change it: its only filled-on-use parts are memos of values the prepared
data determine (the classifier, loaded when a unit first needs it; each split's `ImageSet` and predicted classes).
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from detectors.base import Detector, FeatureSet, ImageSet, LinearHead
from detectors.harness.plan import FEATURES_VERSION, Plan, Split, check_spec, reads_features
from detectors.harness.runconfig import ConfigError
from pipelines.collectives import peer_guard
from pipelines.data import Manifest
from pipelines.fingerprint import combine, images_fingerprint, preprocessing_fingerprint, weights_fingerprint
from pipelines.io import atomic_write_json
from pipelines.runtime import partial_state, resolve_device, resolve_dtype

log = logging.getLogger(__name__)

ID_TRAIN, ID_VAL, ID_TEST, AUX = "id-id_train", "id-id_val", "id-id_test", "aux-aux"  # split ids (plan.py)


@dataclass(frozen=True)
class Prepared:
    """A split's prepared data: its features (None in pixel-only runs), the rows that loaded, and a content key."""

    features: FeatureSet | None
    index: np.ndarray
    key: str


class RunModel:
    """The run's classifier with its pixels and feature key, loaded on first use (a pixel-only run whose units are all
    finished loads none); the plan refuses a run whose detectors need one without `model`."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.classifier: Any = None
        self.pixels: Any = None  # the run's pixels (pipelines.pixels.RunPixels)
        self.key = ""

    def device(self) -> Any:
        device = self.plan.runtime.device
        return resolve_device(device) if device else partial_state().device

    def load(self) -> Any:
        if self.classifier is None:
            from pipelines.pixels import run_pixels

            rt = self.plan.runtime
            clf = _classifier(rt.model, rt.model_network).to(self.device()).eval()
            self.pixels = run_pixels(clf, self.plan.protocol, rt.pixels, clf.record)
            clf.pixels = self.pixels.eval  # every evaluation pixel path makes them (pipelines.pixels)
            dtype = resolve_dtype(rt.precision, self.device())
            self.key = combine(FEATURES_VERSION, weights_fingerprint(clf), preprocessing_fingerprint(clf), str(dtype))
            self.classifier = clf
        return self.classifier

    def fit_pixels(self, split_id: str) -> Any:
        """The pixels of a split's rows when they are not the evaluation pixels: the protocol's fit pixels of ID train
        rows (`pipelines.pixels.PROTOCOL_PIXELS`), else None."""
        if split_id != ID_TRAIN or not self.plan.runtime.model:
            return None
        self.load()
        return self.pixels.fit


@dataclass
class PreparedRun:
    """What every unit of a run reads: the plan, each non-empty split's `Prepared` by split id, the classifier's head,
    the recorded image and set failures and the sets left out."""

    plan: Plan
    data: dict[str, Prepared]
    model: RunModel
    head: LinearHead | None = None
    image_failures: list[dict[str, Any]] = field(default_factory=list)
    set_failures: list[dict[str, Any]] = field(default_factory=list)  # test sets with no loadable row
    left_out: frozenset[str] = frozenset()
    _images: dict[str, ImageSet] = field(default_factory=dict, repr=False)
    _predicted: dict[str, list[str] | None] = field(default_factory=dict, repr=False)

    def split_data(self, det: Detector, split_id: str) -> Any:
        """What `det` reads of a split: its FeatureSet, or its loaded rows as an ImageSet; None for an empty split."""
        prepared = self.data.get(split_id)
        if prepared is None:
            return None
        if reads_features(det):
            return prepared.features
        if split_id not in self._images:
            split = self.plan.split(split_id)
            rows = [split.manifest.rows[i] for i in prepared.index]
            fit = self.model.fit_pixels(split_id)
            self._images[split_id] = ImageSet(manifest=Manifest(split.manifest.root, rows),
                                              labels=self.labels(split_id),
                                              pixels=fit, seed=self.model.pixels.seed if fit is not None else 0,
                                              num_workers=self.plan.runtime.num_workers)
        return self._images[split_id]

    def plain_images(self, split_id: str) -> ImageSet:
        """A split's loaded rows as an ImageSet of their own (no pixels, no labels given: the manifest's)."""
        split, prepared = self.plan.split(split_id), self.data[split_id]
        return ImageSet(manifest=Manifest(split.manifest.root, [split.manifest.rows[i] for i in prepared.index]))

    def labels(self, split_id: str) -> np.ndarray:
        """The split's labels as the features carry them (level labels with `head:`), else the manifest's."""
        prepared = self.data[split_id]
        if prepared.features is not None and prepared.features.labels is not None:
            return np.asarray(prepared.features.labels)
        split = self.plan.split(split_id)
        return np.array([split.manifest.rows[i]["label"] for i in prepared.index], dtype=np.int64)

    def predicted_names(self, split_id: str) -> list[str] | None:
        """The run classifier's predicted class of each row of the split (class names where the plan has one per
        logit, else the index as text); None without cached logits."""
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

    def has_rows(self, split_id: str) -> bool:
        return split_id in self.data and len(self.data[split_id].index) > 0

    def train_rows(self) -> int:
        train = self.data.get(ID_TRAIN)
        return 0 if train is None else len(train.index)


def prepare(plan: Plan) -> PreparedRun:
    """Every non-empty split prepared (features, or an image probe in pixel-only runs; the rows of a feature
    extraction are split across the processes and gathered), the empty test sets left out and the detectors'
    value checks run again on the data's sizes."""
    model = RunModel(plan)
    run = PreparedRun(plan, {}, model)
    with peer_guard("the feature extraction"):
        run.data = _prepare_splits(run)
    _leave_out_empty_sets(run)
    _check_dims(run)
    return run


def _prepare_splits(run: PreparedRun) -> dict[str, Prepared]:
    plan = run.plan
    splits = [s for s in plan.splits if len(s.manifest)]
    if not plan.needs_features:
        return {s.id: _probe(run, s) for s in splits}
    data = {s.id: _features(run, s) for s in splits}
    if plan.head:
        data = _level_head(run, splits, data)
    return data


def _record_failures(run: PreparedRun, split: Split, failures: list[dict[str, Any]]) -> None:
    run.image_failures += [{**f, "split": split.name, "role": split.role} for f in failures]


def _features(run: PreparedRun, split: Split) -> Prepared:
    """The split's feature cache (built once, content-keyed), memory-mapped; records its unreadable images."""
    from pipelines.features import FeatureCache, cache_path, extract_features

    plan, model = run.plan, run.model
    rt = plan.runtime
    clf = model.load()
    fit = model.fit_pixels(split.id)  # ID train rows: the protocol's fit pixels (train: seeded draws per row)
    key = combine(model.key, split.data_key or images_fingerprint(split.manifest, rt.cache_hash),
                  *([model.pixels.fit_identity()] if fit is not None else []))
    path = cache_path(plan.cache_dir, split.id, key)
    cache = extract_features(clf, split.manifest, batch_size=rt.batch_size, device=str(model.device()),
                             precision=rt.precision, num_workers=rt.num_workers, key=key, cache=path,
                             desc=split.name, pixels=fit, seed=model.pixels.seed)
    state = partial_state()
    if state.num_processes > 1:
        state.wait_for_everyone()  # the main process has written the file
    if path.is_file():  # detectors stream memory-mapped caches in chunks (paper-scale ID train sets)
        cache = FeatureCache.load(path, mmap=True)
    run.head = cache.head()
    _record_failures(run, split, cache.failures)
    features = cache.to_featureset()
    if split.role == "aux":  # auxiliary rows are OOD (label -1); their own class index (Extended) is `aux_label`
        labels = np.array([split.manifest.rows[i].get("aux_label", -1) for i in cache.index], dtype=np.int64)
        features = FeatureSet(features.features, features.logits, labels)
    return Prepared(features, np.asarray(cache.index, dtype=np.int64), key)


def _probe(run: PreparedRun, split: Split) -> Prepared:
    """Pixel-only runs: find the rows whose image loads (cached per image-set key), so failures are excluded alike."""
    rt = run.plan.runtime
    key = combine("probe-v1", split.data_key or images_fingerprint(split.manifest, rt.cache_hash))
    path = run.plan.cache_dir / "probe" / f"{split.id}-{key}.json"
    if path.is_file():
        failures = json.loads(path.read_text())
    else:
        from pipelines.features import ManifestPixels, pixel_loader

        rows = split.manifest.rows
        dataset = ManifestPixels(split.manifest, list(range(len(rows))), _Probe())
        failures = [{"index": pos, "file": rows[pos]["file_name"], "reason": reason}
                    for _, _, failed in pixel_loader(dataset, rt.batch_size, rt.num_workers)
                    for pos, reason in failed]
        if partial_state().is_main_process:
            atomic_write_json(path, failures)
    bad = {f["index"] for f in failures}
    _record_failures(run, split, failures)
    return Prepared(None, np.array([i for i in range(len(split.manifest)) if i not in bad], dtype=np.int64), key)


def _level_head(run: PreparedRun, splits: list[Split], data: dict[str, Prepared]) -> dict[str, Prepared]:
    """Score with one head of a multi-granularity classifier: its logits, and ID labels from its level's field, on
    every split (aux, validation and field sets included)."""
    from pipelines.training import MultiGranularity

    spec = run.plan.head
    objective = MultiGranularity.from_pretrained(spec.levels)
    if spec.level not in objective.levels:
        raise ConfigError(f"head.level: {spec.level!r} is not a level of {spec.levels} {sorted(objective.levels)}")
    run.head = LinearHead(*objective.level_head(spec.level))
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
        logits = run.head(features.astype(np.float64)).astype(np.float32)
        out[split.id] = Prepared(FeatureSet(features, logits, labels), prepared.index,
                                 combine(prepared.key, "head", spec.levels, spec.level))
    return out


def _leave_out_empty_sets(run: PreparedRun) -> None:
    """Test OOD and field sets none of whose rows loaded: recorded in failures.json (`sets`) and left out, so the
    other sets are scored."""
    left_out = set()
    for split in run.plan.of_role("ood", "field_ood"):
        prepared = run.data.get(split.id)
        if prepared is None or not len(prepared.index):
            left_out.add(split.id)
            reason = f"none of its {len(split.manifest)} image(s) could be loaded (see `images`)"
            run.set_failures.append({"split": split.name, "role": split.role, "config": split.where,
                                     "reason": reason})
            log.warning("[oodforge] warning: %s set %r: %s; left out", split.where, split.name, reason)
    run.left_out = frozenset(left_out)


def _check_dims(run: PreparedRun) -> None:
    """Each detector's value checks again, now that the feature and class counts are known."""
    train = run.data.get(ID_TRAIN)
    if train is None or train.features is None:
        return
    fs = train.features
    dims = {"features": None if fs.features is None else int(fs.features.shape[1]),
            "classes": None if fs.logits is None else int(fs.logits.shape[1])}
    for unit in run.plan.units:
        if unit.kind in ("detector", "select"):
            check_spec(unit.detector, unit.params, unit.load, unit.where, dims)


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
