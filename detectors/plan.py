"""The runner's plan as a value: `make_plan(config)` checks the whole config, resolves every source into splits, guards
against leaks, and lists the units with their content keys, before any model loads.

`Runner(plan)` (detectors.evaluate) executes a `Plan` and never reads the raw config; `scripts/evaluate.py --dry-run`
prints `Plan.describe()`. A unit's key is computed here from content only: the files of the classifier and of every
folder a detector loads (hashed byte by byte, so weights rewritten in place with size and mtime kept give a new key),
the rows and image files of every split, `class_names`, and every runtime setting that decides a result. `unit.json`
records the key's parts so that a reuse can be audited.
"""
from __future__ import annotations

import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable, Mapping

from detectors.base import Detector
from detectors.protocols import unit_sweep
from detectors.registry import detector_class
from detectors.runconfig import ConfigError, DetectorSpec, EvalConfig, Source
from pipelines.data import Manifest, read_manifest
from pipelines.fingerprint import combine, file_identity, images_fingerprint
from pipelines.io import safe_name

FEATURE_INPUTS = frozenset({"features", "logits"})
PLAN_VERSION = "unit-v2"
FEATURES_VERSION = "features-v2"
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

    @property
    def id(self) -> str:
        """`<role>-<name>`, unique within a plan and safe as a file name part."""
        return f"{self.role}-{safe_name(self.name)}"


@dataclass(frozen=True)
class Runtime:
    """Settings that decide how (not what) the runner computes, plus the classifier source."""

    model: str | None
    device: str | None
    precision: str
    batch_size: int
    num_workers: int
    chunk_rows: int | None
    cache_hash: str


@dataclass(frozen=True)
class Unit:
    """One unit of work: `detector` (fit and score a spec), `select` (a validation sweep, then score), `rule` (a post-hoc
    rule on a training method's trained model) or `fewshot` (the prompt-learning sweep)."""

    kind: str
    method: str
    spec: DetectorSpec | None
    key: str
    parts: Mapping[str, Any] = field(compare=False)
    parent: str = ""  # rule units: the training method they re-score
    rule: str = ""


@dataclass(frozen=True)
class Selection:
    metric: str
    split: str  # id of the OOD-validation split the sweeps use


@dataclass(frozen=True)
class Plan:
    """Everything a run does, resolved and checked (see module docstring)."""

    out: Path
    cache_dir: Path
    runtime: Runtime
    splits: tuple[Split, ...]
    units: tuple[Unit, ...]
    transfer: tuple[dict[str, Any], ...] = ()
    head: dict[str, str] | None = None
    select: Selection | None = None
    class_names: tuple[str, ...] | None = None
    fewshot: dict[str, Any] | None = None
    needs_features: bool = False
    run_parts: Mapping[str, Any] = field(default_factory=dict, compare=False)
    protocol: str = "openood_v1.5"

    def split(self, split_id: str) -> Split | None:
        return next((s for s in self.splits if s.id == split_id), None)

    def of_role(self, *roles: str) -> list[Split]:
        return [s for s in self.splits if s.role in roles]

    @property
    def ood_val(self) -> Split | None:
        """The OOD-validation rows given to fit and used for rule selection (`ood_val`, else `select.ood_val`)."""
        return self.split("ood_val-ood_val") or self.split("ood_val-select_ood_val")

    def describe(self, finished: Iterable[str] = ()) -> str:
        """The plan in a few lines: units to run / to reuse (`finished`: methods whose unit is up to date), caches."""
        done = set(finished)
        run = [u.method for u in self.units if u.method not in done]
        reuse = [u.method for u in self.units if u.method in done]
        sizes = ", ".join(f"{s.id} {len(s.manifest)}" for s in self.splits if len(s.manifest))
        caches = (f"feature caches (model {self.runtime.model}): {sizes}" if self.needs_features
                  else f"image probes (pixel-only run): {sizes}")
        return "\n".join([f"plan: {len(self.units)} unit(s), out {self.out}",
                          f"units to run ({len(run)}): {', '.join(run) or '-'}",
                          f"units to reuse ({len(reuse)}): {', '.join(reuse) or '-'}",
                          f"caches to build or reuse under {self.cache_dir}: {caches}"])


# -- building the plan ----------------------------------------------------------------------------------------------
def as_config(config: EvalConfig | Mapping[str, Any] | str | os.PathLike) -> EvalConfig:
    if isinstance(config, EvalConfig):
        return config
    if isinstance(config, Mapping):
        return EvalConfig.from_dict(dict(config))
    return EvalConfig.from_yaml(config)


def make_plan(config: EvalConfig | Mapping[str, Any] | str | os.PathLike) -> Plan:
    """Check and resolve a config (object, mapping or YAML path) into a Plan. Raises ConfigError naming the key."""
    config = as_config(config)
    specs = config.validate()
    built = [check_spec(spec, f"detectors[{i}]") for i, spec in enumerate(specs)]
    splits = resolve_splits(config)
    check_leaks(splits)
    check_transfer(config.threshold_transfer, splits)
    check_head(config.head)
    runtime = Runtime(config.model, config.device, config.precision, config.batch_size, config.num_workers,
                      config.chunk_rows, config.cache_hash)
    id_train = next(s for s in splits if s.id == "id-id_train")
    class_names = tuple(config.class_names) if config.class_names else class_names_of(id_train.manifest)
    select = None
    if config.select is not None or config.ood_val is not None:  # OOD validation given: the protocol's sweeps run
        which = "ood_val-select_ood_val" if config.select and "ood_val" in config.select else "ood_val-ood_val"
        select = Selection((config.select or {}).get("metric", "auroc"), which)
    run_parts = {"version": PLAN_VERSION, "features": FEATURES_VERSION, "model": source_fingerprint(config.model),
                 "head": None if config.head is None else {**config.head, "files": source_fingerprint(config.head["levels"])},
                 "select": config.select, "splits": [[s.role, s.name, s.group, s.data_key] for s in splits],
                 "precision": config.precision, "device": config.device, "batch_size": config.batch_size,
                 "chunk_rows": config.chunk_rows, "protocol": config.protocol}
    out = Path(config.out)
    cache_dir = Path(config.cache_dir) if config.cache_dir else out / "cache"
    units = plan_units(specs, run_parts, class_names, config)
    # by instance: a training method's `mode` decides whether it reads images (full) or features (heads)
    needs = any(reads_features(det or detector_class(s.name)) or s.rules for det, s in zip(built, specs))
    return Plan(out, cache_dir, runtime, tuple(splits), tuple(units), tuple(config.threshold_transfer), config.head,
                select, class_names, config.fewshot, needs, run_parts, config.protocol)


def check_spec(spec: DetectorSpec, where: str, dims: dict[str, int] | None = None) -> Detector | None:
    """Build the detector once with its parameters (no model loads) and run its value checks (`check_params`, with
    the feature and class counts once known), so bad values fail in the plan as one line naming the parameter.
    Returns the built detector in the plan (None for a `load:` spec or with `dims`)."""
    cls = detector_class(spec.name)
    if spec.load:
        if dims is None and not (Path(spec.load) / "config.json").is_file():
            raise ConfigError(f"{where}.load: {spec.load} is not a saved detector folder (no config.json)")
        return None
    try:
        cls.check_params(dict(spec.params), dims)
        if dims is None:
            cls.check_files(dict(spec.params))
    except ValueError as err:
        raise ConfigError(f"{where}.params.{_param_named(err, spec.params)}: {_named(err, spec.name)}") from None
    if dims is not None:
        return None
    try:
        return cls(**spec.params)
    except (TypeError, ValueError) as err:
        raise ConfigError(f"{where}.params: {_named(err, spec.name)}") from None


def _named(err: Exception, name: str) -> str:
    """The error's message, starting with the detector's name once."""
    text = str(err)
    return text if text.startswith(f"{name}:") else f"{name}: {text}"


def _param_named(err: ValueError, params: Mapping[str, Any]) -> str:
    """The parameter a check_params error names (its first word that is a parameter), else 'value'."""
    words = str(err).replace(":", " ").replace("=", " ").split()
    return next((w.strip("`'\",.[]") for w in words if w.strip("`'\",.[]") in params), "value")


def check_head(head: Mapping[str, str] | None) -> None:
    if head is not None and not Path(head["levels"]).is_dir():
        raise ConfigError(f"head.levels: {head['levels']} is not a folder (a saved multi-granularity head)")


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


# -- splits -----------------------------------------------------------------------------------------------------------
def resolve_splits(config: EvalConfig) -> list[Split]:
    """ID train/val/test, the test OOD sets, field sets, then OOD-validation and auxiliary rows, each with its data key."""
    splits = id_splits(config.id) + ood_splits(config.ood)
    splits += field_splits(config.field_sources(), {s.name for s in splits if s.role == "ood"})
    for key, src in config.sources().items():
        if key == "aux":
            splits.append(Split("aux", "aux", aux_rows(src), source=src.manifest))
        else:
            name = key.replace(".", "_")
            splits.append(Split(name, "ood_val", merged(sets_of(src, key)), source=src.manifest))
    hashing = config.cache_hash
    return [Split(s.name, s.role, s.manifest, s.group, s.source, images_fingerprint(s.manifest, hashing)) for s in splits]


def id_splits(folder: str) -> list[Split]:
    manifest = read_manifest(folder)
    splits = [Split(f"id_{s}", "id", manifest.select(role="id", split=s), source=str(folder)) for s in ("train", "val", "test")]
    if not len(splits[2].manifest):
        raise ConfigError(f"id: {folder}: no ID rows with split 'test'")
    if not len(splits[0].manifest):
        raise ConfigError(f"id: {folder}: no ID rows with split 'train' (detectors are fitted on them)")
    return splits


def ood_splits(sources: list[Source]) -> list[Split]:
    out: list[Split] = []
    seen: dict[str, str] = {}
    for i, src in enumerate(sources):
        for name, part in sets_of(src, f"ood[{i}]").items():
            if name in seen:
                raise ConfigError(f"ood[{i}]: OOD set {name!r} is also given by {seen[name]}; set names must be unique "
                                  "(use `sets:` to pick)")
            seen[name] = f"ood[{i}] ({src.manifest})"
            out.append(Split(name, "ood", part, src.group or part.rows[0].get("group"), str(src.manifest)))
    return out


def field_splits(sources: list[Source], taken: set[str]) -> list[Split]:
    out: list[Split] = []
    for i, src in enumerate(sources):
        manifest = read_manifest(src.manifest).select(split=src.split)
        novel = sets_of(src, f"field[{i}]")
        if len(novel) != 1:
            raise ConfigError(f"field[{i}]: a field set has one novel set, found {sorted(novel)}; pick one with `sets:`")
        (name, part), = novel.items()
        if name in taken:
            raise ConfigError(f"field[{i}]: set name {name!r} is already an OOD set")
        taken.add(name)
        out += [Split(name, "field_id", manifest.select(role="id"), "field", str(src.manifest)),
                Split(name, "field_ood", part, "field", str(src.manifest))]
    return out


def sets_of(src: Source, where: str) -> dict[str, Manifest]:
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


def merged(parts: dict[str, Manifest]) -> Manifest:
    return Manifest(next(iter(parts.values())).root, [r for p in parts.values() for r in p.rows])


def aux_rows(src: Source) -> Manifest:
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


# -- checks -------------------------------------------------------------------------------------------------------------
def check_leaks(splits: list[Split]) -> None:
    """`aux` / `ood_val` rows may not be test OOD rows, field-set rows, or byte copies of any test image (ID test, OOD,
    field): compared by path, then by content (sha256, only for files whose size matches a test file's)."""
    tests = [s for s in splits if s.role in TEST_ROLES or s.id == "id-id_test"]
    by_path = {str(s.manifest.path(r).resolve()): s.role for s in tests for r in s.manifest.rows}
    for split in splits:
        if split.role not in ("aux", "ood_val"):
            continue
        where = "select.ood_val" if split.name == "select_ood_val" else split.name
        paths = {r["file_name"]: str(split.manifest.path(r).resolve()) for r in split.manifest.rows}
        for role, what in (("ood", "test OOD rows"), ("field_id", "field-set rows"), ("field_ood", "field-set rows")):
            hits = [name for name, p in paths.items() if by_path.get(p) == role]
            if hits:
                raise ConfigError(f"{where}: {len(hits)} row(s) are {what} (first: {hits[0]!r}); validation and "
                                  "auxiliary data must be disjoint from the evaluated sets")
        copies = byte_copies(list(paths.items()), [p for p in by_path])
        if copies:
            raise ConfigError(f"{where}: {len(copies)} row(s) are byte copies of test images (first: {copies[0]!r}); "
                              "validation and auxiliary data must be disjoint from the evaluated sets")


def byte_copies(candidates: list[tuple[str, str]], tests: list[str]) -> list[str]:
    """Names of `candidates` (name, path) whose bytes equal a test file's (sizes first, then sha256)."""
    def size(path: str) -> int | None:
        try:
            return os.stat(path).st_size
        except OSError:
            return None

    test_sizes: dict[int, list[str]] = {}
    for path in tests:
        n = size(path)
        if n is not None:
            test_sizes.setdefault(n, []).append(path)
    hashes: dict[str, Any] = {}
    digest = lambda p: hashes.setdefault(p, file_identity(p, "content"))  # noqa: E731
    found = []
    for name, path in candidates:
        n = size(path)
        if n is None or n not in test_sizes:
            continue
        mine = digest(path)
        if mine is not None and any(digest(t) == mine for t in test_sizes[n] if t != path):
            found.append(name)
    return found


def check_transfer(rules: list[dict[str, Any]], splits: list[Split]) -> None:
    names = {s.name for s in splits if s.role in TEST_ROLES}
    for i, rule in enumerate(rules):
        if rule.get("positive", "ood") == "ood" and rule["source"] not in names:
            raise ConfigError(f"threshold_transfer[{i}].source: {rule['source']!r} is not an evaluated OOD set {sorted(names)}")
        for target in rule["targets"]:
            if target not in names:
                raise ConfigError(f"threshold_transfer[{i}].targets: {target!r} is not an evaluated OOD or field set {sorted(names)}")


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


def _hub_snapshot(repo_id: str) -> str | None:
    if repo_id.count("/") != 1 or repo_id.startswith(("/", ".")):
        return None
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo_id, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached / not a hub id: the id itself is the identity
        return None


def _path_params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Content of every parameter naming an existing local file or folder (a CLIP model, UNet, saved prompts)."""
    return {k: source_fingerprint(v) for k, v in params.items()
            if isinstance(v, str) and v and (os.path.isdir(v) or os.path.isfile(v))}


def plan_units(specs: list[DetectorSpec], run_parts: Mapping[str, Any], class_names: tuple[str, ...] | None,
               config: EvalConfig) -> list[Unit]:
    """One unit per spec (`select` when swept), one `rule` unit per rule after it, a `fewshot` unit last."""
    run_key = combine(run_parts)
    units: list[Unit] = []
    for spec in specs:
        cls = detector_class(spec.name)
        has_val = config.select is not None or config.ood_val is not None
        sweep = unit_sweep(config.protocol, cls, has_val, spec.params) if selectable(spec) else {}
        kind = "select" if sweep else "detector"
        parts = {"kind": kind, "sweep": sweep, "spec": {k: v for k, v in spec.__dict__.items() if k != "rules"},
                 "load": source_fingerprint(spec.load), "param_files": _path_params(spec.params),
                 "class_names": list(class_names) if class_names and "class_names" in cls.needs else None,
                 "runtime": {k: v for k, v in _runtime(config).items() if k in cls.needs}}
        key = combine(run_key, parts)
        units.append(Unit(kind, spec.method, spec, key, {"run": run_key, **parts}))
        for rule in spec.rules:
            rule_parts = {"kind": "rule", "parent": spec.method, "parent_key": key, "rule": rule}
            units.append(Unit("rule", f"{spec.method}+{rule}", spec, combine(key, rule), rule_parts, spec.method, rule))
    if config.fewshot is not None:
        parts = {"kind": "fewshot", "fewshot": config.fewshot, "class_names": list(class_names or []),
                 "files": _path_params(config.fewshot)}
        units.append(Unit("fewshot", "fewshot", None, combine(run_key, parts), {"run": run_key, **parts}))
    return units


def _runtime(config: EvalConfig) -> dict[str, Any]:
    """The runtime arguments a detector may take (locations excluded: they decide where, not what)."""
    return {"device": config.device, "precision": None if config.precision == "auto" else config.precision,
            "classifier": "run model" if config.model else None}


def selectable(spec: DetectorSpec) -> bool:
    """Post-hoc-style detectors, on cached features or on images (ODIN, RP-ODIN), fitted here (not `load:`);
    training-time methods are not swept (a point would retrain). The grid is the protocol's (`unit_sweep`)."""
    return spec.load is None and detector_class(spec.name).family != "training"


def key_record(unit: Unit, plan: Plan) -> dict[str, Any]:
    """What `unit.json` records beside the key: the unit's parts and the run's (model files, splits, settings)."""
    return json.loads(json.dumps({"unit": dict(unit.parts), "run": dict(plan.run_parts)}, default=str))
