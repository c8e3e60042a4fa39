"""`TrainSettings`: the training hyperparameters, defined once with their defaults, ranges and docs.

The loop (`loop.LoopSettings` extends it), `finetune` and `train_heads` (`settings=`), the training-time detectors'
`Params` (they extend it) and the classifier-training config (`recipes.TrainConfig`: `optional` fields, resolved from
its recipe and protocol, then `TrainConfig.settings()`) all read these fields. The defaults are the Open-Insects
fine-tuning recipe (30 epochs, batch 512, AdamW lr 1e-3, weight decay 1e-5, 2 warm-up epochs; REFERENCE.md) under
the `exact` protocol's loop settings (`recipes.TRAINING_PROTOCOLS`); a protocol or a recipe changes them by name.
The methods that train with their own loop (CLIP prompt learning, OpenGAN) hold their reference training as a
`TrainSettings` (`Params.training`), declare the fields users set with `setting` and read them back with
`TrainSettings.read`.
"""
from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import MISSING, dataclass, fields
from typing import Any, Literal

from pipelines.params import Params, param

Schedule = Literal["clean", "reference"]
Precision = Literal["auto", "bf16", "fp16", "fp32"]


@dataclass(frozen=True)
class TrainSettings(Params):
    """How a model trains: AdamW with a per-step schedule over `epochs` epochs of `batch_size` rows."""

    epochs: int = param(30, "training epochs", ge=1)
    lr: float = param(1e-3, "AdamW learning rate", gt=0)
    batch_size: int = param(512, "global batch size (split across processes)", ge=1)
    weight_decay: float = param(1e-5, "AdamW weight decay", ge=0)
    warmup_epochs: float = param(2, "linear warm-up epochs before the cosine", ge=0)
    schedule: Schedule = param(
        "clean", "lr schedule: clean warm-up + cosine, or the reference trainers' timm schedule and step counter")
    drop_last: bool = param(True, "drop the last partial training batch (the reference keeps it)")
    seed: int = param(0, "seed of initialisation, order and augmentation")
    precision: Precision = param("auto", "training precision (auto: bf16 on GPU, fp32 on CPU; the reference: fp32)",
                                 runtime=True)

    @classmethod
    def of(cls, values: Any) -> TrainSettings:
        """The settings read from `values` (any object with these attributes: a config, another settings)."""
        return cls(**{f.name: getattr(values, f.name) for f in fields(cls)})

    @classmethod
    def read(cls, params: type[Params], values: Mapping[str, Any]) -> TrainSettings:
        """The settings a method trains with: its reference `params.training` with the value `values` hold for each
        field of `params` declared by `setting` (under the method's own key: LoCoOp's `train_batch` is
        `batch_size`)."""
        named = {f.metadata["setting"]: key for key, f in params.fields().items() if "setting" in f.metadata}
        return dataclasses.replace(params.training, **{name: values[key] for name, key in named.items()})


def setting(name: str, more: str = "", default: Any = MISSING, doc: str | None = None) -> Any:
    """A config field for `TrainSettings.<name>`: its doc (`more` appended; `doc` in the method's words, an SGD
    learning rate say), bounds and runtime flag, and its default unless `default` is given (a method's reference
    value: `default=training.lr`). The field records which setting it is (`TrainSettings.read`)."""
    field = TrainSettings.fields()[name]
    meta = field.metadata
    value = field.default if default is MISSING else default
    made = param(value, (meta["doc"] if doc is None else doc) + more, runtime=meta["runtime"], **meta["bounds"])
    return dataclasses.field(default=made.default, metadata={**made.metadata, "setting": name})


def optional(name: str, more: str = "") -> Any:
    """`setting(name)` that may be left null, to be filled in later (a recipe, a protocol)."""
    return setting(name, more, default=None)
