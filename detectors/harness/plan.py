"""The runner's plan as a value: `make_plan(config)` reads the typed config (`EvalConfig`, parsed once), resolves
every source into splits, guards against leaks, and lists fully resolved units with their content keys, before any
model loads.

`Runner(plan)` (detectors.harness.evaluate) executes a `Plan` and never reads the config; `scripts/evaluate.py
--dry-run` prints `Plan.describe()`. A unit holds its detector class and its parameters with the protocol merged in
(rule units too). Its key (`unit_key`, the one recipe) is computed from content only: the files of the classifier and of
every folder a detector loads (hashed byte by byte, so weights rewritten in place with size and mtime kept give a new
key), the rows and image files of only the splits the unit reads (`unit_reads`, from its class's `fit_inputs`),
`class_names` where it reads them, and every runtime setting that decides a result. `unit.json` records the key's
parts so that a reuse can be audited.
"""
from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from detectors.base import Detector
from detectors.harness.protocols import CHECKPOINTS, TIES, protocol_params, unit_sweep
from detectors.harness.released import check_released_classes
from detectors.harness.runconfig import (
    FEATURE_INPUTS,
    SHARD_FIT_ROWS,
    ConfigError,
    DetectorSpec,
    EvalConfig,
    FewShot,
    Head,
    Source,
    Transfer,
    named,
    param_named,
)
from detectors.registry import detector_class
from pipelines.checkpoints import checkpoint_folder, read_checkpoint_index
from pipelines.data import Manifest, read_manifest
from pipelines.errors import UserInputError
from pipelines.fingerprint import combine, file_identity, images_fingerprint
from pipelines.io import safe_name
from pipelines.pixels import PixelSettings
from pipelines.runtime import runtime_device
from pipelines.zoo import files_read, is_released_file

PLAN_VERSION = "unit-v3"
FEATURES_VERSION = "features-v3"  # v3: pixels made by pipelines.pixels (the reference transform under open-insects)
TEST_ROLES = ("ood", "field_id", "field_ood")
LOCATION_PARAMS = ("cache_dir", "work_dir")  # where things are kept, not what they are: left out of unit keys


def reads_features(det: type[Detector] | Detector) -> bool:
    """True for detectors scored on cached features/logits (FeatureSet), False for those reading pixels (ImageSet).
    Pass the instance where you have one: a full-mode training detector reads images, its heads mode features."""
    return frozenset(det.inputs) <= FEATURE_INPUTS


# -- values -------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Split:
    """One evaluated population: its selected manifest rows, role, group and the folder they came from."""

    name: str
    role: str  # id | ood | field_id | field_ood | aux | ood_val
    manifest: Manifest = field(compare=False)
    group: str | None = None
    source: str = ""
    data_key: str = ""  # rows + image files (pipelines.fingerprint.images_fingerprint)
    where: str = ""  # the config key it came from (ood[0], aux, ...)

    @property
    def id(self) -> str:
        """`<role>-<name>`, unique within a plan and safe as a file name part."""
        return f"{self.role}-{safe_name(self.name)}"


@dataclass(frozen=True)
class Runtime:
    """Settings that decide how (not what) the runner computes, plus the classifier source."""

    model: str | None
    device: str | None  # None: auto (the first CUDA device, else the CPU)
    precision: str
    batch_size: int
    num_workers: int | None
    chunk_rows: int | None
    cache_hash: str
    sweep_pixel_mb: float
    pixels: PixelSettings = PixelSettings()
    model_network: str | None = None  # a released `model:` file's network (pipelines.zoo), None: its name's / keys'
    shard_fit_rows: int = SHARD_FIT_ROWS  # from these ID train rows on, sum-statistics fits are sharded (distribute)


@dataclass(frozen=True)
class Unit:
    """One unit of work, fully resolved: `detector` (fit and score), `select` (a validation sweep, then score),
    `rule` (a post-hoc rule on a training method's trained model, `parent`) or `fewshot` (the prompt-learning sweep).

    `detector` is the registered class, `params` its validated parameters with the protocol merged in (the config's
    own win), `key` the content key of everything the unit reads (`unit_key`) and `parts` what it was computed from."""

    kind: str
    method: str
    key: str
    parts: Mapping[str, Any] = field(compare=False)
    detector: type[Detector] | None = field(default=None, compare=False)
    params: Mapping[str, Any] = field(default_factory=dict)
    load: str | None = None
    rules: tuple[str, ...] = ()  # detector units: the methods of the rule units re-scoring its trained model
    parent: Unit | None = field(default=None, compare=False)  # rule units: the training unit they re-score
    rule: str = ""  # rule units: the rule's detector name
    where: str = ""  # the config key of its entry (detectors[i]), for messages

    @property
    def name(self) -> str:
        """The registry name of the unit's detector ('' for fewshot)."""
        return self.detector.name if self.detector is not None else ""


@dataclass(frozen=True)
class Selection:
    metric: str
    split: str  # id of the OOD-validation split the sweeps use
    ties: str = "last"  # which tied point a sweep keeps (detectors.harness.protocols.TIE_RULES)


@dataclass(frozen=True)
class Plan:
    """Everything a run does, resolved and checked (see module docstring)."""

    out: Path
    cache_dir: Path
    runtime: Runtime
    splits: tuple[Split, ...]
    units: tuple[Unit, ...]
    transfer: tuple[Transfer, ...] = ()
    head: Head | None = None
    select: Selection | None = None
    class_names: tuple[str, ...] | None = None
    fewshot: FewShot | None = None
    needs_features: bool = False
    run_parts: Mapping[str, Any] = field(default_factory=dict, compare=False)
    protocol: str = "openood_v1.5"
    warnings: tuple[str, ...] = ()  # what the run will leave out (an OOD set with no image file)
    checkpoint: str = ""  # the trained classifier's checkpoint that runs (last | best; "" for a folder without one)

    def split(self, split_id: str) -> Split | None:
        return next((s for s in self.splits if s.id == split_id), None)

    def of_role(self, *roles: str) -> list[Split]:
        return [s for s in self.splits if s.role in roles]

    @property
    def ood_val(self) -> Split | None:
        """The OOD-validation rows given to fit and used for rule selection (`ood_val`, else `select.ood_val`)."""
        return self.split("ood_val-ood_val") or self.split("ood_val-select_ood_val")

    def describe(self, finished: Iterable[str] = ()) -> str:
        """The plan in a few lines: units to run / to reuse (`finished`: methods whose unit is up to date), caches,
        warnings."""
        done = set(finished)
        run = [u.method for u in self.units if u.method not in done]
        reuse = [u.method for u in self.units if u.method in done]
        sizes = ", ".join(f"{s.id} {len(s.manifest)}" for s in self.splits if len(s.manifest))
        model = f"{self.runtime.model}, checkpoint {self.checkpoint}" if self.checkpoint else self.runtime.model
        caches = (f"feature caches (model {model}): {sizes}" if self.needs_features
                  else f"image probes (pixel-only run): {sizes}")
        return "\n".join([f"plan: {len(self.units)} unit(s), out {self.out}",
                          f"units to run ({len(run)}): {', '.join(run) or '-'}",
                          f"units to reuse ({len(reuse)}): {', '.join(reuse) or '-'}",
                          f"caches to build or reuse under {self.cache_dir}: {caches}",
                          *(f"warning: {w}" for w in self.warnings)])


# -- building the plan ----------------------------------------------------------------------------------------------
def as_config(config: EvalConfig | Mapping[str, Any] | str | os.PathLike) -> EvalConfig:
    """The typed config of a config object, a mapping or a YAML path (parsed once)."""
    if isinstance(config, EvalConfig):
        return config
    if isinstance(config, Mapping):
        return EvalConfig.from_dict(dict(config))
    return EvalConfig.from_yaml(config)


def make_plan(config: EvalConfig | Mapping[str, Any] | str | os.PathLike) -> Plan:
    """Check and resolve a config (object, mapping or YAML path) into a Plan. Raises ConfigError naming the key."""
    config = as_config(config)
    model, checkpoint = classifier_checkpoint(config.model, config.checkpoint, config.protocol)
    if checkpoint:  # the chosen checkpoint's folder is the run's model; its level heads too, when they are the folder's
        levels_here = config.head is not None and Path(config.head.levels).resolve() == Path(config.model).resolve()
        config = replace(config, model=model, head=replace(config.head, levels=model) if levels_here else config.head)
    specs = config.specs()
    classes = [detector_class(spec.name) for spec in specs]  # each entry resolved to its class once
    merged = [{**protocol_params(config.protocol, spec.name), **spec.params} for spec in specs]
    built = [check_spec(cls, params, spec.load, f"detectors[{i}]") for i, (cls, params, spec)
             in enumerate(zip(classes, merged, specs))]
    splits = resolve_splits(config)
    check_released_classes(config, classes, splits)
    check_leaks(splits)
    check_transfer(config.threshold_transfer, splits)
    check_head(config.head)
    runtime = Runtime(config.model, runtime_device(config.device), config.precision, config.batch_size,
                      config.num_workers, config.chunk_rows, config.cache_hash, config.sweep_pixel_mb, config.pixels,
                      config.model_network, config.shard_fit_rows)
    id_train = next(s for s in splits if s.id == "id-id_train")
    class_names = tuple(config.class_names) if config.class_names else class_names_of(id_train.manifest)
    check_fewshot(config.fewshot, class_names)
    select = None
    if config.select is not None or config.ood_val is not None:  # OOD validation given: the protocol's sweeps run
        which = "ood_val-select_ood_val" if config.select is not None and config.select.ood_val is not None \
            else "ood_val-ood_val"
        ties = config.select.ties if config.select is not None and config.select.ties else TIES[config.protocol]
        select = Selection(config.select.metric if config.select is not None else "auroc", which, ties)
    classifier = {"model": source_fingerprint(config.model), **({"network": config.model_network}
                                                                 if config.model_network else {}),
                  "head": None if config.head is None else {**config.head.to_dict(),
                                                            "files": source_fingerprint(config.head.levels)},
                  **({"checkpoint": checkpoint} if checkpoint else {})}
    run_parts = {"version": PLAN_VERSION, "features": FEATURES_VERSION, "precision": config.precision,
                 "device": config.device, "batch_size": config.batch_size,
                 "chunk_rows": config.chunk_rows, "protocol": config.protocol, "pixels": config.pixels.to_dict()}
    out = Path(config.out)
    cache_dir = Path(config.cache_dir) if config.cache_dir else out / "cache"
    # by instance: a training method's `mode` decides whether it reads images (full) or features (heads)
    needs = any(reads_features(det or cls) or spec.rules for det, cls, spec in zip(built, classes, specs))
    if needs and not config.model:
        raise ConfigError("model: a classifier hub id or folder is needed by the chosen detectors (they read its "
                          "features or logits)", doc=config.doc_ref())
    units = plan_units(specs, classes, merged, built, splits, run_parts, classifier, class_names, config, select)
    return Plan(out, cache_dir, runtime, tuple(splits), tuple(units), tuple(config.threshold_transfer), config.head,
                select, class_names, config.fewshot, needs, {**run_parts, "classifier": classifier}, config.protocol,
                tuple(empty_set_warnings(splits)), checkpoint)


def classifier_checkpoint(model: str | None, given: str | None, protocol: str) -> tuple[str | None, str]:
    """(the folder the run loads as its classifier, the checkpoint recorded). A train_classifier folder (its
    `checkpoints.json`) gives the folder of `given`, else of the protocol's choice (`CHECKPOINTS`), its last where the
    run kept no best (trained without ID val rows); any other model runs as it is, recorded "". An explicit `best` that
    the model does not keep is one ConfigError line."""
    def folder_of(name: str) -> Path | None:
        try:
            return checkpoint_folder(model, name)
        except UserInputError as err:  # a malformed or planted checkpoints.json
            raise ConfigError(f"model: {err}") from None

    try:
        index = None if model is None or not os.path.isdir(model) else read_checkpoint_index(model)
    except UserInputError as err:
        raise ConfigError(f"model: {err}") from None
    if index is None:
        if given == "best":
            raise ConfigError(f"checkpoint: best: model {model} is not a train_classifier folder keeping a best epoch "
                              "(no checkpoints.json); use checkpoint: last or leave it out")
        return model, ""
    choice = given or CHECKPOINTS[protocol]
    folder = folder_of(choice)
    if folder is None and given:
        raise ConfigError(f"checkpoint: {given}: {model} keeps no {given} checkpoint (trained without ID val rows: its "
                          "checkpoints.json has none); use checkpoint: last")
    if folder is None:
        choice, folder = "last", folder_of("last")
    if folder is None:
        raise ConfigError(f"model: {model}: its checkpoints.json names no last checkpoint")
    return (model if folder == Path(model).resolve() else str(folder)), choice


def check_spec(cls: type[Detector], params: Mapping[str, Any], load: str | None, where: str,
               dims: dict[str, int] | None = None) -> Detector | None:
    """Build the detector once with its resolved parameters (no model loads) and check the files it names, so bad
    values fail in the plan as one line naming the parameter; with `dims` (the feature and class counts, known once
    features exist) run its dimension-bound checks instead. Returns the built detector in the plan (None for a
    `load:` spec or with `dims`)."""
    if load:
        if is_released_file(load):  # a released weight file: checked with the ID classes (check_released_classes)
            return None
        if dims is None and not (Path(load) / "config.json").is_file():
            raise ConfigError(f"{where}.load: {load} is not a saved detector folder (no config.json)")
        return None
    try:
        if dims is not None:
            cls.check_params(dict(params), dims)
            return None
        cls.check_files(dict(params))
        return cls(**params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.params.{param_named(err, params)}: {named(err, cls.name)}") from None


def check_head(head: Head | None) -> None:
    """`head.levels` is a saved multi-granularity head (its `levels.json`) and `head.level` one of its levels, checked
    as the run checks them, without loading weights."""
    if head is None:
        return
    if not Path(head.levels).is_dir():
        raise ConfigError(f"head.levels: {head.levels} is not a folder (a saved multi-granularity head)")
    try:
        levels = json.loads((Path(head.levels) / "levels.json").read_text(encoding="utf-8"))["levels"]
    except (OSError, ValueError, KeyError, TypeError):
        raise ConfigError(f"head.levels: {head.levels} holds no readable levels.json (written by train_classifier "
                          "with label levels)") from None
    if head.level not in levels:
        raise ConfigError(f"head.level: {head.level!r} is not a level of {head.levels} {sorted(levels)}")


def check_fewshot(fewshot: FewShot | None, class_names: tuple[str, ...] | None) -> None:
    """The few-shot sweep needs class names: its own, the config's, or the ID rows' `class_name` fields."""
    if fewshot is not None and not (fewshot.class_names or fewshot.class_names_file or class_names):
        raise ConfigError("fewshot: class names are needed (fewshot.class_names or class_names_file, config "
                          "`class_names`, or `class_name` fields in the ID manifest)")


def class_names_of(manifest: Manifest) -> tuple[str, ...] | None:
    """Class names from the ID rows' `class_name` (or `category`) fields, by label; None when there are none."""
    names: dict[int, str] = {}
    for row in manifest.rows:
        name = row.get("class_name") or row.get("category")
        if name is not None:
            names.setdefault(row["label"], str(name))
    if not names:
        return None
    return tuple(names.get(i, str(i)) for i in range(max(names) + 1))


def empty_set_warnings(splits: list[Split]) -> list[str]:
    """A line per test OOD or field set none of whose image files exists: the run records it and scores the rest."""
    found = []
    for split in splits:
        if split.role in ("ood", "field_ood") and not any(split.manifest.path(r).is_file()
                                                          for r in split.manifest.rows):
            found.append(f"{split.where}: none of the {len(split.manifest)} image file(s) of set {split.name!r} exists "
                         f"({split.source}); it will be recorded in failures.json and left out")
    return found


# -- splits -----------------------------------------------------------------------------------------------------------
SPLIT_DEFAULTS = {"ood": "test", "field": "test", "select.ood_val": "val", "ood_val": "val", "aux": "train"}
"""The split a source reads under each key when it names none (`Source.read_split`)."""


def resolve_splits(config: EvalConfig) -> list[Split]:
    """ID train/val/test, the test OOD sets, field sets, then OOD-validation and auxiliary rows, each with its data
    key."""
    splits = id_splits(config.id) + ood_splits(config.ood)
    splits += field_splits(config.field, {s.name for s in splits if s.role == "ood"})
    for key, src in config.sources().items():
        if key == "aux":
            splits.append(Split("aux", "aux", aux_rows(src), source=src.manifest, where="aux"))
        else:
            name = key.replace(".", "_")
            splits.append(Split(name, "ood_val", merged(sets_of(src, key, SPLIT_DEFAULTS[key])), source=src.manifest,
                                where=key))
    return [replace(s, data_key=images_fingerprint(s.manifest, config.cache_hash)) for s in splits]


def id_splits(folder: str) -> list[Split]:
    manifest = read(folder, "id")
    splits = [Split(f"id_{s}", "id", manifest.select(role="id", split=s), source=str(folder), where="id")
              for s in ("train", "val", "test")]
    if not len(splits[2].manifest):
        raise ConfigError(f"id: {folder}: no ID rows with split 'test'")
    if not len(splits[0].manifest):
        raise ConfigError(f"id: {folder}: no ID rows with split 'train' (detectors are fitted on them)")
    return splits


def ood_splits(sources: list[Source]) -> list[Split]:
    out: list[Split] = []
    seen: dict[str, str] = {}
    for i, src in enumerate(sources):
        for name, part in sets_of(src, f"ood[{i}]", SPLIT_DEFAULTS["ood"]).items():
            if name in seen:
                raise ConfigError(f"ood[{i}]: OOD set {name!r} is also given by {seen[name]}; set names must be unique "
                                  "(use `sets:` to pick)")
            seen[name] = f"ood[{i}] ({src.manifest})"
            out.append(Split(name, "ood", part, src.group or part.rows[0].get("group"), str(src.manifest),
                             where=f"ood[{i}]"))
    return out


def field_splits(sources: list[Source], taken: set[str]) -> list[Split]:
    out: list[Split] = []
    for i, src in enumerate(sources):
        where, split = f"field[{i}]", src.read_split(SPLIT_DEFAULTS["field"])
        manifest = _select(read(src.manifest, where), split)
        novel = sets_of(src, where, SPLIT_DEFAULTS["field"])
        if len(novel) != 1:
            raise ConfigError(f"{where}: a field set has one novel set, found {sorted(novel)}; pick one with `sets:`")
        (name, part), = novel.items()
        if name in taken:
            raise ConfigError(f"{where}: set name {name!r} is already an OOD set")
        taken.add(name)
        out += [Split(name, "field_id", manifest.select(role="id"), "field", str(src.manifest), where=where),
                Split(name, "field_ood", part, "field", str(src.manifest), where=where)]
    return out


def read(folder: str, where: str) -> Manifest:
    """The manifest in `folder`; a missing or malformed one is one ConfigError naming the config key first."""
    try:
        return read_manifest(folder)
    except (UserInputError, OSError) as err:
        raise ConfigError(f"{where}: {err}", doc=getattr(err, "doc", None)) from None


def _select(manifest: Manifest, split: str | None, **conditions: Any) -> Manifest:
    return manifest.select(**conditions, **({} if split is None else {"split": split}))


def sets_of(src: Source, where: str, default_split: str) -> dict[str, Manifest]:
    """The OOD sets of a source (role ood rows of its split, `sets` honoured), each with rows."""
    split = src.read_split(default_split)
    manifest = _select(read(src.manifest, where), split, role="ood")
    names = src.sets or manifest.ood_sets()
    if not names:
        raise ConfigError(f"{where}: {src.manifest} has no OOD rows with split {split!r}")
    found = {}
    for name in names:
        part = manifest.select(ood_set=name)
        if not len(part):
            raise ConfigError(f"{where}: OOD set {name!r} has no rows with split {split!r} in {src.manifest} "
                              f"(sets there: {manifest.ood_sets()})")
        found[name] = part
    return found


def merged(parts: dict[str, Manifest]) -> Manifest:
    return Manifest(next(iter(parts.values())).root, [r for p in parts.values() for r in p.rows])


def aux_rows(src: Source) -> Manifest:
    """Auxiliary (outlier-exposure) rows: the `auxiliary` set by default when the manifest has one; never ID rows."""
    split = src.read_split(SPLIT_DEFAULTS["aux"])
    manifest = _select(read(src.manifest, "aux"), split)
    sets = src.sets or (["auxiliary"] if "auxiliary" in manifest.ood_sets() else None)
    if sets:
        manifest = Manifest(manifest.root, [r for r in manifest.rows if r["role"] == "ood" and r["ood_set"] in sets])
    n_id = sum(r["role"] == "id" for r in manifest.rows)
    if n_id:
        raise ConfigError(f"aux: {src.manifest} split {split!r} holds {n_id} ID rows (role id); auxiliary data must be "
                          f"outliers only: pick its sets with `sets:` (sets there: {manifest.ood_sets()})")
    if not len(manifest):
        raise ConfigError(f"aux: no rows in {src.manifest} with split {split!r} and sets {sets}")
    return manifest


# -- checks
# -------------------------------------------------------------------------------------------------------------
def check_leaks(splits: list[Split]) -> None:
    """`aux` / `ood_val` rows may not be test OOD rows, field-set rows, or byte copies of any test image (ID test, OOD,
    field): compared by resolved path (a shard row's: its shard's and member's), then by content (sha256, only for
    images whose size matches a test image's), in either image store."""
    tests = [s for s in splits if s.role in TEST_ROLES or s.id == "id-id_test"]
    test_paths = {str(p): (p, s.role) for s in tests for p in (s.manifest.path(r).resolve() for r in s.manifest.rows)}
    by_path = {key: role for key, (_, role) in test_paths.items()}
    check_aux_apart(splits)
    for split in splits:
        if split.role not in ("aux", "ood_val"):
            continue
        where = split.where
        paths = {r["file_name"]: split.manifest.path(r).resolve() for r in split.manifest.rows}
        for role, what in (("ood", "test OOD rows"), ("field_id", "field-set rows"), ("field_ood", "field-set rows")):
            hits = [name for name, p in paths.items() if by_path.get(str(p)) == role]
            if hits:
                raise ConfigError(f"{where}: {len(hits)} row(s) are {what} (first: {hits[0]!r}); validation and "
                                  "auxiliary data must be disjoint from the evaluated sets")
        copies = byte_copies(list(paths.items()), [p for p, _ in test_paths.values()])
        if copies:
            raise ConfigError(f"{where}: {len(copies)} row(s) are byte copies of test images (first: {copies[0]!r}); "
                              "validation and auxiliary data must be disjoint from the evaluated sets")


def check_aux_apart(splits: list[Split]) -> None:
    """`aux` rows may not be OOD-validation rows: rule selection and sweeps would score a model on its own training
    outliers."""
    aux = next((s for s in splits if s.role == "aux"), None)
    if aux is None:
        return
    taken = {str(aux.manifest.path(r).resolve()) for r in aux.manifest.rows}
    for split in (s for s in splits if s.role == "ood_val"):
        hits = [r["file_name"] for r in split.manifest.rows if str(split.manifest.path(r).resolve()) in taken]
        if hits:
            raise ConfigError(f"aux and {split.where}: {len(hits)} row(s) are in both (first: {hits[0]!r}); auxiliary "
                              "outliers (trained on) and OOD validation (selected on) must be disjoint")


def byte_copies(candidates: list[tuple[str, Any]], tests: list[Any]) -> list[str]:
    """Names of `candidates` (name, image path: a file path or a shard member) whose bytes equal a test image's
    (sizes first, then sha256)."""
    def size(path: Any) -> int | None:
        try:
            return (Path(path) if isinstance(path, str) else path).stat().st_size
        except OSError:
            return None

    test_sizes: dict[int, list[Any]] = {}
    for path in tests:
        n = size(path)
        if n is not None:
            test_sizes.setdefault(n, []).append(path)
    hashes: dict[str, Any] = {}
    digest = lambda p: hashes.setdefault(str(p), file_identity(p, "content"))  # noqa: E731
    found = []
    for name, path in candidates:
        n = size(path)
        if n is None or n not in test_sizes:
            continue
        mine = digest(path)
        if mine is not None and any(digest(t) == mine for t in test_sizes[n] if str(t) != str(path)):
            found.append(name)
    return found


def check_transfer(rules: list[Transfer], splits: list[Split]) -> None:
    names = {s.name for s in splits if s.role in TEST_ROLES}
    for i, rule in enumerate(rules):
        if rule.positive == "ood" and rule.source not in names:
            raise ConfigError(f"threshold_transfer[{i}].source: {rule.source!r} is not an evaluated OOD set "
                              f"{sorted(names)}")
        for target in rule.targets:
            if target not in names:
                raise ConfigError(f"threshold_transfer[{i}].targets: {target!r} is not an evaluated OOD or field set "
                                  f"{sorted(names)}")


# -- units and their keys -------------------------------------------------------------------------------------------
def source_fingerprint(source: str | os.PathLike | None) -> Any:
    """What a model source holds, by content: every file of a local folder (relative path, sha256), a local file's
    sha256, a hub id's cached snapshot files when present (else the id itself); None for None."""
    if source is None:
        return None
    root = os.fspath(source)
    if os.path.isfile(root):
        return file_identity(root, "content")
    if not os.path.isdir(root):
        snapshot = _hub_snapshot(root)
        return root if snapshot is None else [root, source_fingerprint(snapshot)]
    found = []
    for folder, dirs, files in os.walk(root):
        dirs.sort()
        for name in sorted(files):
            path = os.path.join(folder, name)
            found.append([os.path.relpath(path, root), file_identity(path, "content")])
    return found


def load_fingerprint(load: str | None) -> Any:
    """What a `load:` holds, by content: a saved detector folder, or every file a released weight file's method is
    read from (ARPL's two parts; `pipelines.zoo.files_read`)."""
    if not is_released_file(load):
        return source_fingerprint(load)
    return [source_fingerprint(path) if path.is_file() else str(path) for path in files_read(load)]


def _hub_snapshot(repo_id: str) -> str | None:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached / not a hub id: the id itself is the identity
        return None


def _path_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Content of every parameter naming an existing local file or folder (a CLIP model, UNet, saved prompts), or a
    list naming some (an ensemble's members: each path's content, the other entries as given)."""
    def is_path(v: Any) -> bool:
        return isinstance(v, str) and bool(v) and (os.path.isdir(v) or os.path.isfile(v))

    out: dict[str, Any] = {k: source_fingerprint(v) for k, v in params.items() if is_path(v)}
    out.update({k: [source_fingerprint(x) if is_path(x) else x for x in v] for k, v in params.items()
                if isinstance(v, (list, tuple)) and any(is_path(x) for x in v)})
    return out


def plan_units(specs: list[DetectorSpec], classes: list[type[Detector]], params: list[dict[str, Any]],
               built: list[Detector | None], splits: list[Split], run_parts: Mapping[str, Any],
               classifier: Mapping[str, Any], class_names: tuple[str, ...] | None, config: EvalConfig,
               select: Selection | None) -> list[Unit]:
    """One unit per spec (`select` when swept), one `rule` unit per rule after it (its parameters resolved as a
    detector's, protocol merged), a `fewshot` unit last; every key by `unit_key`. `classifier` (the model's and the
    head's files) is in the key of the units that read the classifier's features or take the classifier."""
    run_key = combine(run_parts)
    runtime = _runtime(config)
    units: list[Unit] = []
    id_val = next(s for s in splits if s.id == "id-id_val")
    for i, (spec, cls, merged_params, det) in enumerate(zip(specs, classes, params, built)):
        if merged_params.get("checkpoint") == "best" and not spec.load and not len(id_val.manifest):
            raise ConfigError(f"detectors[{i}].params.checkpoint: best chooses {spec.method}'s fine-tuned epoch by ID "
                              f"val accuracy, and {id_val.source} has no ID val rows (give `checkpoint: last`)")
        sweep = unit_sweep(config.protocol, cls, select is not None, spec.params) if selectable(spec.load, cls) else {}
        kind = "select" if sweep else "detector"
        reads = unit_reads(cls, kind)
        uses_classifier = reads_features(det or cls) or "classifier" in cls.needs or bool(spec.rules)
        parts = {"kind": kind, "sweep": sweep, "name": cls.name, "params": merged_params,
                 "load": load_fingerprint(spec.load), "classifier": dict(classifier) if uses_classifier else None,
                 "param_files": _path_params(merged_params),
                 "class_names": list(class_names) if class_names and "class_names" in cls.needs else None,
                 "runtime": {k: v for k, v in runtime.items() if k in cls.needs},
                 "select": asdict(select) if select is not None and reads & {"ood_val"} else None}
        unit = Unit(kind, spec.method, *unit_key(run_key, parts, splits, reads), detector=cls, params=merged_params,
                    load=spec.load, rules=tuple(spec.methods()[1:]), where=f"detectors[{i}]")
        units.append(unit)
        for rule in spec.rules:
            rule_cls = detector_class(rule.name)
            rule_params = {**protocol_params(config.protocol, rule.name), **rule.params}
            rule_parts = {"kind": "rule", "parent": unit.method, "parent_key": unit.key, "name": rule.name,
                          "params": rule_params, "select": asdict(select) if select is not None else None}
            units.append(Unit("rule", f"{unit.method}+{rule.name}",
                              *unit_key(unit.key, rule_parts, splits, RULE_READS), detector=rule_cls,
                              params=rule_params, parent=unit, rule=rule.name))
    if config.fewshot is not None:
        fewshot = config.fewshot.to_dict()
        parts = {"kind": "fewshot", "fewshot": fewshot, "class_names": list(class_names or []),
                 "files": _path_params(fewshot)}
        units.append(Unit("fewshot", "fewshot", *unit_key(run_key, parts, splits, FEWSHOT_READS)))
    return units


BASE_READS = frozenset({"id_train", "id_test", "ood", "field"})
RULE_READS = frozenset({"id_val", "ood_val"})  # besides its parent's (in the parent's key): fit on ID val, rule choice
FEWSHOT_READS = frozenset({"id_train", "id_test", "ood"})


def unit_reads(cls: type[Detector], kind: str) -> frozenset[str]:
    """The splits a unit reads, by the class's declared `fit_inputs`: ID train / test, the OOD and field sets always;
    ID val, OOD val and aux only where it reads them (a sweep and a training method's rule choice read both vals)."""
    wants = set(cls.fit_inputs) & {"id_val", "ood_val", "aux"}
    if kind == "select" or cls.family == "training":
        wants |= {"id_val", "ood_val"}
    return BASE_READS | wants


SPLIT_READS = {"id": lambda s: s.name, "ood": lambda s: "ood", "field_id": lambda s: "field",
               "field_ood": lambda s: "field", "ood_val": lambda s: "ood_val", "aux": lambda s: "aux"}
"""Which `unit_reads` name covers each split (ID splits by their own name: id_train, id_val, id_test)."""


def unit_key(base: str, parts: dict[str, Any], splits: list[Split],
             reads: frozenset[str]) -> tuple[str, dict[str, Any]]:
    """The one cache-key recipe of a unit: `base` (the run's key, or a rule's parent key), the unit's own parts and
    the data keys of only the splits it reads. Returns (key, parts recorded in unit.json)."""
    data = [[s.role, s.name, s.group, s.data_key] for s in splits if SPLIT_READS[s.role](s) in reads]
    parts = {**parts, "reads": sorted(reads), "splits": data}
    return combine(base, parts), {"base": base, **parts}


def _runtime(config: EvalConfig) -> dict[str, Any]:
    """The runtime arguments a detector may take (locations excluded: they decide where, not what)."""
    return {"device": config.device, "precision": None if config.precision == "auto" else config.precision,
            "classifier": "run model" if config.model else None}


def selectable(load: str | None, cls: type[Detector]) -> bool:
    """Post-hoc-style detectors, on cached features or on images (ODIN, RP-ODIN), fitted here (not `load:`);
    training-time methods are not swept (a point would retrain). The grid is the protocol's (`unit_sweep`)."""
    return load is None and cls.family != "training"


def key_record(unit: Unit, plan: Plan) -> dict[str, Any]:
    """What `unit.json` records beside the key: the unit's parts and the run's (model files, settings)."""
    return json.loads(json.dumps({"unit": dict(unit.parts), "run": dict(plan.run_parts)}, default=str))
