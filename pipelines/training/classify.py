"""`train_classifier(config)`: an ID manifest -> a trained image classifier folder (what `model:` in eval configs and
`ImageClassifier.from_pretrained` load), with its class names, `metrics.json` and a loss / accuracy plot.

The output folder holds the transformers model of the LAST epoch (`config.json` with `id2label` = the class names,
weights) and its image processor, `class_names.json`, `levels.json` + `levels.safetensors` when trained with label
levels (the runner's `head: {levels: <folder>, level: <name>}` reads them), and `best/`, the same files for the BEST
epoch by ID-val top-1 accuracy (later ties win, as the reference's `best.ckpt`; no `best/` when the best epoch is the
last, none without ID val rows). `checkpoints.json` says which folder holds which (`pipelines.checkpoints`), what the
evaluation's `checkpoint: last|best` reads. Beside them: `metrics.json` (top-1 accuracy per head on ID val and ID test
of the last epoch, `checkpoints` with both epochs' accuracies, the per-epoch history and the run's key), `training.png`,
the resolved `train_config.json`, `checkpoint.safetensors` (the last epoch's full state, no pickle: a killed run
resumes from it) and `checkpoint.best.safetensors` (the best epoch's weights, written after its epoch's checkpoint, so a
killed and resumed run keeps the best an uninterrupted one keeps).

The run's key (`run_key`) covers what decides the folder's content: the settings, the starting model's files, the class
names and the ID rows with each image file's identity (`cache_hash`: stat or content, as the evaluation caches). A rerun
whose key equals the one in `metrics.json` (written last) does nothing: no file is rewritten, so the folder's
fingerprint and every evaluation unit keyed by it stay as they are. Another key trains again (from scratch: the
checkpoint's key differs too).
"""
from __future__ import annotations

import json
import logging
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from pipelines.checkpoints import checkpoint_epoch, write_checkpoint_index
from pipelines.class_names import ClassNames, names_from_rows, read_class_names, write_class_names
from pipelines.classifier import ImageClassifier
from pipelines.data import Manifest, read_manifest
from pipelines.errors import ConfigError
from pipelines.fingerprint import combine, images_fingerprint, source_identity
from pipelines.hub_ids import RESNET_ID
from pipelines.io import atomic_write_json, remove_orphan_temps
from pipelines.pixels import training_pixels
from pipelines.runtime import load_pretrained, seed_everything
from pipelines.training.loop import TrainResult, drop_last, finetune, load_best_weights
from pipelines.training.objectives import PRIMARY, CrossEntropy, MultiGranularity, Objective
from pipelines.training.recipes import TrainConfig
from pipelines.training.schedule import describe as describe_schedule
from pipelines.training.schedule import lr_landmarks, planned_lrs
from pipelines.training.transforms import Compose, ResizeCenterCrop, reference_eval, reference_train

log = logging.getLogger(__name__)

METRICS = "metrics.json"
CHECKPOINT = "checkpoint.safetensors"
BEST_FOLDER = "best"
BEST_RULE = ("best: the epoch of highest ID-val top-1 accuracy (primary head), a later epoch winning a tie "
             "(Open-Insect/OpenOOD src/openood/recorders/base_recorder.py:40-55, `acc >= best_acc`); last: the final "
             "epoch (:57-62)")
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json",
                "pytorch_model.bin.index.json")


def class_names_of(manifest: Manifest, folder: str | Path) -> tuple[list[str], str | None]:
    """Class names (index = label) and the field the label came from: `class_names.json`, else the ID rows'
    `class_name` / `species` (`pipelines.class_names`)."""
    saved = read_class_names(folder) or names_from_rows(manifest.rows)
    return list(saved.names), saved.label_field


def _has_weights(model: str) -> bool:
    folder = Path(model)
    return not folder.is_dir() or any((folder / name).is_file() for name in WEIGHT_FILES)


def config_source(model: str) -> str:
    """Where the architecture and processor configs come from: the model itself, or, for a torchvision checkpoint or
    an untrained hub model whose configs ship in pipelines/hub_configs, those files (no download)."""
    from pipelines.hub import PACKAGED_CONFIGS
    from pipelines.torchvision_resnet import is_torchvision_checkpoint

    if is_torchvision_checkpoint(model):
        return str(PACKAGED_CONFIGS / RESNET_ID)
    packaged = PACKAGED_CONFIGS / model
    return str(packaged) if not Path(model).exists() and (packaged / "config.json").is_file() else model


def build_classifier(config: TrainConfig, class_names: list[str]) -> ImageClassifier:
    """The backbone with a new head of len(class_names) outputs: pretrained weights (a transformers model, or a
    torchvision ResNet checkpoint converted on load), or random initialisation from the model's config when
    `pretrained: false` or the folder holds no weights. The processor is set to the config's evaluation pixels."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

    from pipelines.torchvision_resnet import is_torchvision_checkpoint, load_torchvision_resnet

    labels = {"id2label": dict(enumerate(class_names)),
              "label2id": {name: i for i, name in enumerate(class_names)}}
    seed_everything(config.seed)
    torchvision_file = is_torchvision_checkpoint(config.model)
    source = config_source(config.model) if torchvision_file or not config.pretrained else config.model
    try:
        if config.pretrained and not torchvision_file and _has_weights(config.model):
            model = load_pretrained(AutoModelForImageClassification.from_pretrained, config.model, "image classifier",
                                    ignore_mismatched_sizes=True, **labels)
        else:
            model_config = load_pretrained(AutoConfig.from_pretrained, source, "model config", **labels)
            model = AutoModelForImageClassification.from_config(model_config)
            if config.pretrained and torchvision_file:
                load_torchvision_resnet(config.model, model)
        processor = load_pretrained(AutoImageProcessor.from_pretrained, source, "image processor")
    except OSError as err:  # a hub model neither cached nor reachable: one line naming the key
        raise ConfigError(f"model: {' '.join(str(err).split())}") from None
    _set_eval_pixels(processor, config)
    return ImageClassifier.from_model(model, processor, RESNET_ID if torchvision_file else config.model)


def _set_eval_pixels(processor: Any, config: TrainConfig) -> None:
    """`image_size` (and `pre_size`: the resize before the centre crop, bilinear as the reference's) on the processor,
    so the saved model folder evaluates as it was validated."""
    size = config.image_size
    if size is None:
        return
    if getattr(processor, "crop_pct", None) is not None or "shortest_edge" in dict(processor.size or {}):
        processor.size = {"shortest_edge": size}
        if config.pre_size is not None:
            crop_pct = size / config.pre_size
            # the processor resizes to int(size / crop_pct): keep that the integer pre_size despite float rounding
            processor.crop_pct = crop_pct if int(size / crop_pct) == config.pre_size else size / (config.pre_size + 0.5)
            processor.resample = 2  # bilinear: the reference's `interpolation: bilinear`
    else:
        processor.size = {"height": size, "width": size}
    if getattr(processor, "do_center_crop", False):
        processor.crop_size = {"height": size, "width": size}


def transforms_for(classifier: ImageClassifier, augment: str = "imagenet",
                   pre_size: int | None = None) -> tuple[Compose, Any]:
    """(train, eval) transforms at the classifier's input size. Training: the `augment` branch of
    `transforms.reference_train` ("region" resizes to `pre_size`, default the processor's resize). Evaluation: the
    reference's Resize(pre_size) + CenterCrop when `pre_size` is given, else what the image processor does (resize +
    centre crop for ConvNext-style processors, the processor itself otherwise)."""
    size = classifier.image_size[0]
    crop_pct = getattr(classifier.processor, "crop_pct", None)
    train = reference_train(augment, size, pre_size or (int(size / crop_pct) if crop_pct is not None else size))
    if pre_size is not None:
        return train, reference_eval(size, pre_size)
    if crop_pct is not None:
        return train, Compose([ResizeCenterCrop(size, crop_pct if size < 384 else 1.0,
                                                resample=int(getattr(classifier.processor, "resample", 3)))])
    return train, _ProcessorTransform(classifier)


class _ProcessorTransform:
    """Evaluation pixels through the classifier's own image processor (already normalised floats)."""

    def __init__(self, classifier: ImageClassifier):
        self.preprocess = classifier.preprocess

    def __call__(self, image: Any, rng: Any = None) -> torch.Tensor:
        return self.preprocess([image])[0]

    def __repr__(self) -> str:
        return "the image processor"


def _splits(config: TrainConfig) -> tuple[Manifest, Manifest, Manifest | None, Manifest | None]:
    """(whole manifest, train, val, test) ID rows of `config.id`; no ID train row is one ConfigError line."""
    manifest = read_manifest(config.id)
    ids = manifest.select(role="id")
    parts = [ids.select(split=s) for s in ("train", "val", "test")]
    if not len(parts[0]):
        raise ConfigError(f"id: {config.id} holds no ID train rows (role id, split train)")
    return manifest, parts[0], parts[1] if len(parts[1]) else None, parts[2] if len(parts[2]) else None


def _objective(config: TrainConfig, label_field: str | None, train: Manifest) -> Objective:
    """Cross-entropy, or one head per level (`levels` minus the field the label itself came from)."""
    extra = [level for level in config.levels or [] if level not in (label_field, PRIMARY)]
    for level in extra:
        if not any(level in row for row in train.rows):
            raise ConfigError(f"levels: the ID train rows of {config.id} have no field {level!r}")
    return MultiGranularity({level: level for level in extra}) if extra else CrossEntropy()


def run_key(config: TrainConfig, class_names: list[str], label_field: str | None,
            splits: tuple[Manifest | None, ...]) -> str:
    """What decides the output folder: every setting but the output folder, the worker count and the identity mode,
    the starting model's files (`source_identity`), the class names, and the ID train/val/test rows with each image
    file's identity in the `cache_hash` mode."""
    settings = {k: v for k, v in config.as_dict().items() if k not in ("out", "num_workers", "cache_hash")}
    return combine("train-classifier-v2", settings, source_identity(config.model), class_names, label_field,
                   [None if m is None else images_fingerprint(m, config.cache_hash) for m in splits])


def finished(out: Path, key: str) -> bool:
    """True when `out` holds the complete output of the run keyed `key` (its `metrics.json`, written last, says so)."""
    try:
        metrics = json.loads((out / METRICS).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return False
    return isinstance(metrics, dict) and metrics.get("run_key") == key and _has_weights(str(out))


def train_classifier(config: TrainConfig) -> Path:
    """Train `config.model` on the ID manifest `config.id` and write the output folder (module docstring); a rerun
    of a finished run with the same key touches nothing. One run writes a folder at a time: a second one on the same
    `out` is refused in one line (`pipelines.locks.FolderBusy`)."""
    from pipelines.locks import output_lock
    from pipelines.runtime import partial_state

    with output_lock(config.out, "train_classifier", partial_state().is_main_process):
        return _train_classifier(config)


def _train_classifier(config: TrainConfig) -> Path:
    """`train_classifier` with the output folder locked."""
    from pipelines.runtime import partial_state

    plan = check_training(config)
    train, val, test = plan.train, plan.val, plan.test
    class_names, label_field, key = plan.class_names, plan.label_field, plan.key
    out = Path(config.out)
    state = partial_state()
    if plan.state == "up to date":
        if state.is_main_process:
            log.info("[oodforge] %s is up to date (same settings, starting model, class names and images): nothing to "
                     "do",
                     out)
        return out
    classifier = build_classifier(config, class_names)
    objective = plan.objective
    out.mkdir(parents=True, exist_ok=True)
    if state.is_main_process:
        remove_orphan_temps(out)  # what a killed run's writes left (a live writer's temp files stay)
    transforms = training_pixels(classifier, transforms_for(classifier, config.augment, config.pre_size),
                                 config.protocol, config.draft)
    if state.is_main_process:
        log.info("recipe %s, protocol %s: train pixels %r; eval pixels %r; batch %s (last partial batch %s), "
                 "precision %s", config.recipe, config.protocol, transforms[0], transforms[1], config.batch_size,
                 "dropped" if config.drop_last else "kept", config.precision)
    result = finetune(classifier, train, settings=config.settings(), val=val, test=test, objective=objective,
                      num_workers=config.workers(), transforms=transforms, checkpoint=out / CHECKPOINT,
                      checkpoint_key=key, keep_best=True, channels_last=config.channels_last, compile=config.compile,
                      sync_bn=config.sync_bn)
    if state.is_main_process:
        _write_outputs(out, config, classifier, objective, result, class_names, label_field, key)
    state.wait_for_everyone()
    return out


@dataclass(frozen=True)
class TrainingPlan:
    """What `check_training` found: the ID splits, class names, objective, the run's key and state, and the
    optimiser steps an epoch takes."""

    train: Manifest
    val: Manifest | None
    test: Manifest | None
    class_names: list[str]
    label_field: str | None
    objective: Objective
    key: str
    state: str  # "up to date", "resumes after epoch N" or "new"
    batches: int

    def describe(self, config: TrainConfig) -> str:
        """The plan in a few lines (the dry run's output)."""
        sizes = ", ".join(f"{name} {0 if m is None else len(m)}" for name, m in
                          (("train", self.train), ("val", self.val), ("test", self.test)))
        lrs = planned_lrs(config.schedule, epochs=config.epochs, warmup_epochs=config.warmup_epochs,
                          batches=self.batches, rows=len(self.train), batch_size=config.batch_size, lr=config.lr,
                          advances=self.objective.advances_schedule)
        heads = [PRIMARY, *getattr(self.objective, "levels", {})]
        kept = (f"checkpoints: last (the folder) and best by ID-val top-1 ({BEST_FOLDER}/, later ties win)" if self.val
                else "checkpoints: last only (no ID val rows to choose a best epoch)")
        return "\n".join([
            f"train {config.model} on {config.id} -> {config.out} ({self.state})",
            f"ID rows: {sizes}; {len(self.class_names)} classes ({self.label_field or 'label'}); heads {heads}", kept,
            f"recipe {config.recipe}, protocol {config.protocol}, batch {config.batch_size} "
            f"({'last partial batch dropped' if config.drop_last else 'last partial batch kept'}), precision "
            f"{config.precision}",
            describe_schedule(config.schedule, lrs, epochs=config.epochs, batches=self.batches,
                              warmup_epochs=config.warmup_epochs, lr=config.lr)])


def check_training(config: TrainConfig) -> TrainingPlan:
    """Every check `train_classifier` runs before it loads the model (shared by `--dry-run`): the ID splits (two
    classes or more), the class names, the label levels and the global batch against the processes."""
    from pipelines.runtime import partial_state

    manifest, train, val, test = _splits(config)
    labels = {row["label"] for row in train.rows}
    if len(labels) < 2:
        raise ConfigError(f"id: {config.id} has one ID class ({next(iter(labels))!r}) in its train rows: a one-class "
                          "classifier learns nothing (its cross-entropy is 0 whatever the weights) and its softmax "
                          "scores are constant (AUROC 50 by construction); import two or more classes")
    class_names, label_field = class_names_of(manifest, config.id)
    key = run_key(config, class_names, label_field, (train, val, test))
    out = Path(config.out)
    objective = _objective(config, label_field, train)
    dropped = drop_last(len(train), config.batch_size, not config.drop_last)  # the training loader's own rule
    batches = len(train) // config.batch_size if dropped else math.ceil(len(train) / config.batch_size)
    if finished(out, key):  # nothing will run: the run-time checks below do not apply
        return TrainingPlan(train, val, test, class_names, label_field, objective, key, "up to date", batches)
    processes = partial_state().num_processes
    if config.batch_size % processes:
        raise ConfigError(f"batch_size {config.batch_size} is the global batch: it must divide by the {processes} "
                          "processes")
    epoch = checkpoint_epoch(out / CHECKPOINT, key)
    state = f"resumes after epoch {epoch}" if epoch else "new"
    return TrainingPlan(train, val, test, class_names, label_field, objective, key, state, batches)


def _write_outputs(out: Path, config: TrainConfig, classifier: ImageClassifier, objective: Objective,
                   result: TrainResult, class_names: list[str], label_field: str | None, key: str) -> None:
    """Every output file, `metrics.json` (with the run's key) last: its presence says the folder is complete. The
    last epoch's model first, then the best epoch's in `best/` (or none when it is the last), then
    `checkpoints.json`."""
    (out / METRICS).unlink(missing_ok=True)
    heads = [PRIMARY, *getattr(objective, "levels", {})]
    names = ClassNames(class_names, label_field, heads[1:])
    _save_model(out, classifier, objective, names)
    atomic_write_json(out / "train_config.json", config.as_dict())
    plot_history(result.history, out / "training.png")
    entries = checkpoint_entries(result, heads)
    best_folder = out / BEST_FOLDER
    if entries["best"] is not None and entries["best"]["folder"] == BEST_FOLDER:
        load_best_weights(result, classifier, objective)
        _save_model(best_folder, classifier, objective, names)
    elif best_folder.is_dir():  # a previous run's best epoch: this run has none apart from the last
        import shutil

        shutil.rmtree(best_folder)
    write_checkpoint_index(out, entries, BEST_RULE)
    atomic_write_json(out / METRICS,
                      {**metrics(result, heads, label_field, config.warmup_epochs), "checkpoints": entries,
                                      "run_key": key})


def _save_model(folder: Path, classifier: ImageClassifier, objective: Objective, names: ClassNames) -> None:
    """The classifier's model folder (weights, config, processor), its level heads and its class names."""
    classifier.model.to(memory_format=torch.contiguous_format)
    classifier.save_pretrained(folder)
    if isinstance(objective, MultiGranularity):
        objective.save_pretrained(folder)
    write_class_names(folder, names)


def _top1(values: dict[str, float], heads: list[str]) -> dict[str, float]:
    out = {head: values[f"acc_{head}"] for head in heads if f"acc_{head}" in values}
    return {**out, "overall": values["overall"]} if len(heads) > 1 and "overall" in values else out


def checkpoint_entries(result: TrainResult, heads: list[str]) -> dict[str, dict[str, Any] | None]:
    """`last` and `best` (None without ID val accuracy) as `checkpoints.json` records them: the folder holding the
    model (`.`: the output folder itself; the best epoch's is `best/` unless it is the last epoch), the epoch, its
    top-1 accuracy per head on ID val and on ID test."""
    last = {"folder": ".", "epoch": len(result.history), "val": _top1(result.final, heads),
            "test": _top1(result.test, heads)}
    if result.best is None:
        return {"last": last, "best": None}
    folder = "." if result.best == len(result.history) else BEST_FOLDER
    return {"last": last, "best": {"folder": folder, "epoch": result.best, "val": _top1(result.best_entry, heads),
                                   "test": _top1(result.best_test, heads)}}


def metrics(result: TrainResult, heads: list[str], label_field: str | None, warmup_epochs: float) -> dict[str, Any]:
    """Top-1 accuracy per head on ID val (last epoch) and ID test, `overall` (every head right), the lr at the
    schedule's landmarks (`lr_landmarks`), the history."""
    def top1(values: dict[str, float]) -> dict[str, float]:
        return _top1(values, heads)

    return {"top1": {"val": top1(result.final), "test": top1(result.test)}, "heads": heads, "label_field": label_field,
            "id_acc": result.test.get(f"acc_{PRIMARY}"), "epochs": len(result.history), "steps": result.steps,
            "lr_at": lr_landmarks(result.lrs, len(result.lrs) // max(len(result.history), 1), warmup_epochs),
            "seconds": round(result.seconds, 3), "history": result.history,
            "failures": [vars(f) for f in result.failures]}


def plot_history(history: list[dict[str, float]], path: Path) -> None:
    """Training loss and validation top-1 accuracy per epoch, side by side."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pipelines.io import atomic_path

    epochs = [h["epoch"] for h in history]
    fig, (left, right) = plt.subplots(1, 2, figsize=(9, 3.5))
    left.plot(epochs, [h["loss"] for h in history], marker="o")
    left.set(xlabel="epoch", ylabel="training loss")
    for key in sorted({k for h in history for k in h if k.startswith("acc_")}):
        right.plot(epochs, [h.get(key) for h in history], marker="o", label=key[4:])
    right.set(xlabel="epoch", ylabel="ID val top-1", ylim=(0, 1))
    if right.lines:
        right.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=100, format="png")
    plt.close(fig)
