"""Named classifier-training recipes (each paper's values) and the checked config of `scripts/train_classifier.py`.

A config is a mapping of `KEYS`; `recipe` fills every key it names, explicit keys win. docs/training.md sets the
recipes side by side.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass, fields
from typing import Any

from pipelines.errors import ConfigError
from pipelines.hub_ids import RESNET_ID

DEFAULT_MODEL = RESNET_ID
DOC = "docs/training.md"

RECIPES: dict[str, dict[str, Any]] = {
    # Open-Insects (Chen et al.), Section 6.1: ResNet-50 from scratch per region, 120 epochs, batch 512, AdamW lr 0.01,
    # cosine schedule with 6 warm-up epochs. Weight decay is not stated: 1e-5 as the repository's fine-tuning recipe.
    "open-insects-scratch": {"pretrained": False, "epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-5,
                             "warmup_epochs": 6},
    # the same from ImageNet-1K weights (the C-America variant, the paper's Table 7)
    "open-insects-imagenet": {"pretrained": True, "epochs": 120, "batch_size": 512, "lr": 0.01, "weight_decay": 1e-5,
                              "warmup_epochs": 6},
    # ShiftedBronzes' pre-model is AKG, a multi-granularity dating classifier (category, coarse era, fine era); the paper
    # gives no training values. Ours: ImageNet-1K weights, one linear head per level, the sum of the per-level
    # cross-entropies, AdamW lr 1e-3, 30 epochs, batch 64, cosine with 2 warm-up epochs.
    "multi-granularity": {"pretrained": True, "epochs": 30, "batch_size": 64, "lr": 1e-3, "weight_decay": 1e-5,
                          "warmup_epochs": 2, "needs_levels": True},
}


@dataclass
class TrainConfig:
    """Every key of a training config (None = the recipe's value, else the default shown)."""

    id: str = ""
    out: str = ""
    model: str = DEFAULT_MODEL
    pretrained: bool | None = None
    recipe: str | None = None
    epochs: int | None = None
    batch_size: int | None = None
    lr: float | None = None
    weight_decay: float | None = None
    warmup_epochs: float | None = None
    image_size: int | None = None
    levels: list[str] | None = None
    seed: int = 0
    precision: str = "auto"
    num_workers: int | None = None
    compile: bool = False
    channels_last: bool = True
    sync_bn: bool = True
    cache_hash: str = "stat"  # image identity in the run's key: stat (size + mtime) or content (sha256 of the bytes)

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "config") -> "TrainConfig":
        from pipelines.cli import check_keys

        check_keys(raw, [f.name for f in fields(cls)], where, doc=DOC)
        config = cls(**raw)
        config.resolve(where)
        return config

    def resolve(self, where: str) -> None:
        """Fill unset keys from the recipe (or the plain defaults) and check every value."""
        for key in ("id", "out"):
            if not isinstance(getattr(self, key), str) or not getattr(self, key):
                raise ConfigError(f"{where}: `{key}` is required (a folder path)")
        recipe = dict(RECIPES.get(self.recipe or "open-insects-imagenet", {}))
        if self.recipe is not None and self.recipe not in RECIPES:
            raise ConfigError(f"{where}: recipe {self.recipe!r} is unknown; named recipes: {sorted(RECIPES)}")
        if recipe.pop("needs_levels", False) and not self.levels:
            raise ConfigError(f"{where}: recipe {self.recipe!r} needs `levels` (the label fields, one head each)")
        for key, value in recipe.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        if self.num_workers is None:  # decoding beside a GPU; on the CPU workers would compete with the model
            import os

            import torch

            self.num_workers = min(8, os.cpu_count() or 1) if torch.cuda.is_available() else 0
        self._check(where)

    def _check(self, where: str) -> None:
        positive = {"epochs": int, "batch_size": int, "lr": float}
        for key, kind in positive.items():
            value = getattr(self, key)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0 or (kind is int and value != int(value)):
                raise ConfigError(f"{where}: `{key}` must be a positive {kind.__name__}, got {value!r}")
        if self.image_size is not None and (not isinstance(self.image_size, int) or self.image_size < 8):
            raise ConfigError(f"{where}: `image_size` must be an integer >= 8, got {self.image_size!r}")
        if self.levels is not None and (not isinstance(self.levels, list) or not all(isinstance(v, str) for v in self.levels)):
            raise ConfigError(f"{where}: `levels` must be a list of field names, got {self.levels!r}")
        if self.cache_hash not in ("stat", "content"):
            raise ConfigError(f"{where}: `cache_hash` must be stat or content, got {self.cache_hash!r}")
        if self.precision not in ("auto", "bf16", "fp16", "fp32"):
            raise ConfigError(f"{where}: `precision` must be auto, bf16, fp16 or fp32, got {self.precision!r}")

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)
