"""`train_classifier(config)`: an ID manifest -> a trained image classifier folder (what `model:` in eval configs and
`ImageClassifier.from_pretrained` load), with its class names, `metrics.json` and a loss / accuracy plot.

The output folder holds the transformers model (`config.json` with `id2label` = the class names, weights) and its
image processor, `class_names.json`, `levels.json` + `levels.safetensors` when trained with label levels (the runner's
`head: {levels: <folder>, level: <name>}` reads them), `metrics.json` (top-1 accuracy per head on ID val and ID test,
the per-epoch history), `training.png`, the resolved `train_config.json` and `checkpoint.pt` (the last epoch's full
state: a rerun resumes from it, or does nothing when the run is complete).
"""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import torch

from pipelines.classifier import ImageClassifier
from pipelines.data import Manifest, read_manifest
from pipelines.errors import ConfigError
from pipelines.io import atomic_write_json
from pipelines.runtime import load_pretrained, seed_everything
from pipelines.training.loop import TrainResult, finetune
from pipelines.schema import CLASS_NAMES_FILE, read_class_names, write_class_names
from pipelines.training.objectives import PRIMARY, CrossEntropy, MultiGranularity, Objective
from pipelines.training.recipes import TrainConfig
from pipelines.training.transforms import RandomResizedCrop, ResizeCenterCrop

CLASS_NAMES = CLASS_NAMES_FILE
METRICS = "metrics.json"
WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin", "model.safetensors.index.json", "pytorch_model.bin.index.json")


def class_names_of(manifest: Manifest, folder: str | Path) -> tuple[list[str], str | None]:
    """Class names (index = label) and the field the label came from: `class_names.json`, else rows' `class_name`."""
    saved = read_class_names(folder)
    if saved is not None:
        return list(saved["names"]), saved.get("label_field")
    names: dict[int, str] = {}
    for row in manifest.rows:
        names.setdefault(row["label"], str(row.get("class_name", row["label"])))
    return [names.get(i, str(i)) for i in range(max(names) + 1)], None


def _has_weights(model: str) -> bool:
    folder = Path(model)
    return not folder.is_dir() or any((folder / name).is_file() for name in WEIGHT_FILES)


def build_classifier(config: TrainConfig, class_names: list[str]) -> ImageClassifier:
    """The backbone with a new head of len(class_names) outputs: pretrained weights, or random initialisation from
    the model's config when `pretrained: false` or the folder holds no weights. `image_size` resizes the processor."""
    from transformers import AutoConfig, AutoImageProcessor, AutoModelForImageClassification

    labels = {"id2label": dict(enumerate(class_names)),
              "label2id": {name: i for i, name in enumerate(class_names)}}
    seed_everything(config.seed)
    if config.pretrained and _has_weights(config.model):
        model = load_pretrained(AutoModelForImageClassification.from_pretrained, config.model, "image classifier",
                                ignore_mismatched_sizes=True, **labels)
    else:
        model_config = load_pretrained(AutoConfig.from_pretrained, config.model, "model config", **labels)
        model = AutoModelForImageClassification.from_config(model_config)
    processor = load_pretrained(AutoImageProcessor.from_pretrained, config.model, "image processor")
    if config.image_size is not None:
        _resize_processor(processor, config.image_size)
    classifier = ImageClassifier.from_model(model, processor, config.model)
    return classifier


def _resize_processor(processor: Any, size: int) -> None:
    if getattr(processor, "crop_pct", None) is not None or "shortest_edge" in dict(processor.size or {}):
        processor.size = {"shortest_edge": size}
    else:
        processor.size = {"height": size, "width": size}
    if getattr(processor, "do_center_crop", False):
        processor.crop_size = {"height": size, "width": size}


def transforms_for(classifier: ImageClassifier) -> tuple[RandomResizedCrop, Any]:
    """(train, eval) transforms at the classifier's input size; evaluation matches the image processor: resize +
    centre crop for ConvNext-style processors (`crop_pct`), the processor itself otherwise."""
    size = classifier.image_size[0]
    crop_pct = getattr(classifier.processor, "crop_pct", None)
    if crop_pct is not None:
        return RandomResizedCrop(size), ResizeCenterCrop(size, crop_pct if size < 384 else 1.0,
                                                         resample=int(getattr(classifier.processor, "resample", 3)))
    return RandomResizedCrop(size), _ProcessorTransform(classifier)


class _ProcessorTransform:
    """Evaluation pixels through the classifier's own image processor (already normalised floats)."""

    def __init__(self, classifier: ImageClassifier):
        self.preprocess = classifier.preprocess

    def __call__(self, image: Any, rng: Any = None) -> torch.Tensor:
        return self.preprocess([image])[0]


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


def run_key(config: TrainConfig, manifest: Manifest) -> str:
    """What decides the trained weights: every setting but the output folder and the worker count, and the rows."""
    settings = {k: v for k, v in config.as_dict().items() if k not in ("out", "num_workers")}
    text = json.dumps(settings, sort_keys=True) + manifest.fingerprint()
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def train_classifier(config: TrainConfig) -> Path:
    """Train `config.model` on the ID manifest `config.id` and write the output folder (module docstring)."""
    from pipelines.runtime import partial_state

    manifest, train, val, test = _splits(config)
    class_names, label_field = class_names_of(manifest, config.id)
    classifier = build_classifier(config, class_names)
    objective = _objective(config, label_field, train)
    out = Path(config.out)
    out.mkdir(parents=True, exist_ok=True)
    state = partial_state()
    if config.batch_size % state.num_processes:
        raise ConfigError(f"batch_size {config.batch_size} is the global batch: it must divide by the {state.num_processes} processes")
    result = finetune(classifier, train, val=val, test=test, objective=objective, epochs=config.epochs, lr=config.lr,
                      batch_size=config.batch_size, weight_decay=config.weight_decay, warmup_epochs=config.warmup_epochs,
                      seed=config.seed, precision=config.precision, num_workers=config.num_workers,
                      transforms=transforms_for(classifier), checkpoint=out / "checkpoint.pt",
                      checkpoint_key=run_key(config, manifest), channels_last=config.channels_last, compile=config.compile,
                      sync_bn=config.sync_bn)
    if state.is_main_process:
        _write_outputs(out, config, classifier, objective, result, class_names, label_field)
    state.wait_for_everyone()
    return out


def _write_outputs(out: Path, config: TrainConfig, classifier: ImageClassifier, objective: Objective,
                   result: TrainResult, class_names: list[str], label_field: str | None) -> None:
    classifier.model.to(memory_format=torch.contiguous_format)
    classifier.save_pretrained(out)
    heads = [PRIMARY, *getattr(objective, "levels", {})]
    if isinstance(objective, MultiGranularity):
        objective.save_pretrained(out)
    write_class_names(out, class_names, label_field, heads[1:])
    atomic_write_json(out / "train_config.json", config.as_dict())
    atomic_write_json(out / METRICS, metrics(result, heads, label_field))
    plot_history(result.history, out / "training.png")


def metrics(result: TrainResult, heads: list[str], label_field: str | None) -> dict[str, Any]:
    """Top-1 accuracy per head on ID val (last epoch) and ID test, `overall` (every head right), the history."""
    def top1(values: dict[str, float]) -> dict[str, float]:
        out = {head: values[f"acc_{head}"] for head in heads if f"acc_{head}" in values}
        return {**out, "overall": values["overall"]} if len(heads) > 1 and "overall" in values else out

    return {"top1": {"val": top1(result.final), "test": top1(result.test)}, "heads": heads, "label_field": label_field,
            "id_acc": result.test.get(f"acc_{PRIMARY}"), "epochs": len(result.history), "steps": result.steps,
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
