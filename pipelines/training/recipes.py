"""Named classifier-training recipes (each paper's values), the training protocols, and `TrainConfig`, the typed config
of `scripts/train_classifier.py`.

A config names a `recipe` (its values fill every key the config leaves out) and a `protocol` (how the loop trains and
which pixels it sees): "open-insects" is what RolnickLab/Open-Insect's code ran, "exact" our corrected variant.
Explicit keys win over both. docs/training.md sets the recipes and the protocols side by side, with the reference's
files and lines.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

from pipelines.errors import ConfigError
from pipelines.hub_ids import RESNET_ID
from pipelines.params import REQUIRED, Config, config, convert, param
from pipelines.runtime import check_model_ref, check_safe_folder, looks_local
from pipelines.training.settings import Precision, Schedule, TrainSettings, optional, setting

DEFAULT_MODEL = RESNET_ID
DOC = "docs/training.md"

Protocol = Literal["open-insects", "exact"]
RecipeName = Literal["open-insects-scratch", "open-insects-imagenet", "multi-granularity"]
DEFAULT_RECIPE = "open-insects-imagenet"

TRAINING_PROTOCOLS: dict[str, dict[str, Any]] = {
    # Open-Insect's trainers (src/openood/trainers/base_trainer.py): timm's cosine stepped with its step counter, every
    # partial batch kept (DataLoader's default drop_last=False), fp32 (no autocast anywhere in the trainers)
    "open-insects": {"schedule": "reference", "drop_last": False, "precision": "fp32"},
    # ours: warm-up + cosine over exactly the steps taken, full batches only, bf16 autocast on a GPU
    "exact": {"schedule": "clean", "drop_last": True, "precision": "auto"},
}
"""Loop settings per protocol, shared by classifier training and the training-time detectors' fine-tunes."""

CLASSIFIER_PIXELS: dict[str, dict[str, Any]] = {
    # configs/preprocessors/base_preprocessor.yml + configs/datasets/<region>.yml (name ami_<region>: the "ami" branch)
    "open-insects": {"augment": "ami", "image_size": 126, "pre_size": 128},
    # RandomResizedCrop(0.08-1) + flip at the model processor's own size
    "exact": {"augment": "imagenet", "image_size": None, "pre_size": None},
}
"""Classifier-training pixels per protocol (`pipelines.training.transforms.reference_train`)."""

RECIPES: dict[str, dict[str, Any]] = {
    # Open-Insects (Chen et al.), Section 6.1 and configs/pipelines/train/baseline.yml: ResNet-50 from scratch per
    # region,
    # 120 epochs, batch 512, AdamW lr 0.01, weight decay 1e-5, cosine with 6 warm-up epochs
    "open-insects-scratch": {"pretrained": False, "epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-5,
                             "warmup_epochs": 6, "protocol": "open-insects"},
    # the same from ImageNet-1K weights (the C-America variant, the paper's Table 7); the reference weights are
    # torchvision's `resnet50-0676ba61.pth` (`model:` may name that file: pipelines.torchvision_resnet converts it)
    "open-insects-imagenet": {"pretrained": True, "epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-5,
                              "warmup_epochs": 6, "protocol": "open-insects"},
    # ShiftedBronzes' pre-model is AKG, a multi-granularity dating classifier (category, coarse era, fine era); the
    # paper
    # gives no training values. Ours: ImageNet-1K weights, one linear head per level, the sum of the per-level
    # cross-entropies, AdamW lr 1e-3, 30 epochs, batch 64, cosine with 2 warm-up epochs.
    "multi-granularity": {"pretrained": True, "epochs": 30, "batch_size": 64, "lr": 1e-3, "weight_decay": 1e-5,
                          "warmup_epochs": 2, "protocol": "exact"},
}
REFERENCE_WEIGHTS = {"open-insects-imagenet": "torchvision ResNet50_Weights.IMAGENET1K_V1 (resnet50-0676ba61.pth)"}
"""The checkpoint each recipe's reference run started from, where it is not `model`'s default."""


def check_model(value: str, key: str) -> None:
    """A hub id passes; a local path must exist: a torchvision checkpoint file, or a model folder with a config.json
    (weights optional: without them, or with `pretrained: false`, the model starts from random weights)."""
    if not looks_local(value):
        return
    path = Path(value).expanduser()
    if path.is_dir() and not (path / "config.json").is_file():
        raise ConfigError(f"{key}: the local model folder {value!r} has no config.json", doc=DOC)
    check_safe_folder(value, key)  # no code of its own, well-formed safetensors: the dry run refuses what the run would
    if not path.exists():
        check_model_ref(value, key)


def check_manifest(value: str, key: str) -> None:
    """The ID manifest folder must exist."""
    if not Path(value).expanduser().is_dir():
        raise ConfigError(f"{key}: the manifest folder {value!r} does not exist (oodforge import-folder writes one)",
                          doc=DOC)


@config
class TrainConfig(Config):
    """Every key of a training config; null values come from the recipe, then the protocol (module docstring)."""

    DOC = DOC

    id: str = param(REQUIRED, "the ID manifest folder (role id rows, splits train / val / test)", check=check_manifest)
    out: str = param(REQUIRED, "the output model folder")
    model: str = param(DEFAULT_MODEL, "hub id, local model folder or torchvision ResNet-50 checkpoint (.pth)",
                       check=check_model)
    recipe: RecipeName = param(DEFAULT_RECIPE, "the named recipe filling every key left out")
    protocol: Protocol | None = param(None, "open-insects (the reference code) or exact; null: the recipe's")
    pretrained: bool | None = param(None, "start from the model's weights (false: random initialisation)")
    epochs: int | None = optional("epochs")
    batch_size: int | None = optional("batch_size")
    lr: float | None = optional("lr")
    weight_decay: float | None = optional("weight_decay")
    warmup_epochs: float | None = optional("warmup_epochs", " (must be below epochs)")
    schedule: Schedule | None = optional("schedule")
    drop_last: bool | None = optional("drop_last")
    augment: Literal["ami", "region", "imagenet"] | None = param(None, "training pixels: Open-Insect's ami or region "
                                                                       "preprocessor, or RandomResizedCrop + flip")
    image_size: int | None = param(None, "training and evaluation crop; null: the model processor's size", ge=8)
    pre_size: int | None = param(None, "evaluation resize (shorter side) before the centre crop; null: the processor's",
                                 ge=8)
    levels: list[str] | None = param(None, "label fields with one head each (multi-granularity)")
    seed: int = setting("seed")
    precision: Precision | None = optional("precision")
    num_workers: int | None = param(None, "data-loader workers; null: every core but one beside a GPU, 0 on the CPU",
                                    ge=0, runtime=True)
    draft: bool = param(True, "decode training JPEGs at the DCT scale the random crop needs (false: full decode; "
                              "docs/training.md gives the measured difference)")
    compile: bool = param(False, "torch.compile the model (GPU speed option)", runtime=True)
    channels_last: bool = param(True, "channels-last memory on GPU", runtime=True)
    sync_bn: bool = param(True, "batch-norm statistics over the global batch with several processes")
    cache_hash: Literal["stat", "content"] = param("stat", "image identity in the run's key: stat (size + mtime) or "
                                                           "content (sha256 of the bytes)")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "") -> TrainConfig:
        """The recipe's values, then the protocol's, under the config's own keys; then the one typed loader. Errors
        name the key (after `where:`, the config file, when given)."""
        try:
            return cls._resolve(raw)
        except ConfigError as err:
            if not where:
                raise
            raise ConfigError(f"{where}: {err}", doc=err.doc) from None

    @classmethod
    def _resolve(cls, raw: Any) -> TrainConfig:
        if not isinstance(raw, dict):
            return super().from_value(raw, "")
        given = {k: v for k, v in raw.items() if v is not None}
        recipe = convert(given.get("recipe", DEFAULT_RECIPE), cls.hints()["recipe"], "recipe")
        values = RECIPES[recipe]
        protocol = convert(given.get("protocol", values["protocol"]), Protocol, "protocol")
        merged = {**TRAINING_PROTOCOLS[protocol], **CLASSIFIER_PIXELS[protocol], **values, **given,
                  "recipe": recipe, "protocol": protocol}
        return super().from_dict(merged, "")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        if self.epochs is not None and self.warmup_epochs is not None and self.warmup_epochs >= self.epochs:
            raise ConfigError(f"warmup_epochs ({self.warmup_epochs:g}) must be below epochs ({self.epochs}): the whole "
                              "run would be a warm-up (set warmup_epochs: 0 for short runs)", doc=DOC)
        if self.recipe == "multi-granularity" and not self.levels:
            raise ConfigError("levels: recipe 'multi-granularity' needs `levels` (the label fields, one head each)",
                              doc=DOC)
        if self.augment == "region" and self.image_size is not None and self.pre_size is not None \
                and self.pre_size < self.image_size:
            raise ConfigError(f"pre_size ({self.pre_size}) must be at least image_size ({self.image_size})", doc=DOC)

    def settings(self) -> TrainSettings:
        """The resolved training hyperparameters (`from_dict` filled every one from the recipe and the protocol)."""
        return TrainSettings.of(self)

    def workers(self) -> int:
        """`num_workers`, or the default (`pipelines.pixels.default_workers`): every core but one beside a GPU; on the
        CPU workers would compete with the model."""
        from pipelines.pixels import default_workers

        return self.num_workers if self.num_workers is not None else default_workers()
