"""The configuration of a generation job (`GenerationConfig`: every key typed, with its default, range and doc, on
`pipelines.params`) and `key=value` overrides. See docs/generation.md for each key."""
from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any, Literal

from gen.pairing import INHERIT, TASKS
from gen.zest import ZeSTCall, ZeSTConfig
from pipelines.cli import README_SECTIONS
from pipelines.errors import ConfigError
from pipelines.params import REQUIRED, config, param
from pipelines.runtime import ATTENTION_BACKENDS, PRECISIONS, item_seed
from pipelines.sources import Source

JOB_FOLDER = ".job"  # hidden, so that `datasets` ImageFolder sees only the manifest
NOT_DECISIVE = ("out", "limit", "batch_size", "attention", "compile", "plan_change")  # keys that never change an image
PLAN_CHANGES = ("refuse", "extend")


def existing_folder(value: str | None, key: str) -> None:
    """A `param(check=...)`: `value` (when set) must be an existing folder."""
    if value is not None and not Path(value).expanduser().is_dir():
        raise ConfigError(f"{key}: the folder {value!r} does not exist")


@config
class GenerationConfig(ZeSTCall):
    """Everything a generation job needs (docs/generation.md); ZeST's call parameters come from `ZeSTCall`.

    `models`: null (the real hub models of ZeSTConfig's defaults), a ZeSTConfig mapping (any subset of its keys), or
    "tiny" (tiny random-weight models built once into `$OODFORGE_CACHE/tiny_zest`, default ~/.cache/oodforge).
    `targets` / `materials` are `pipelines.sources.Source`s: a folder, or `{manifest, split, sets}`; `split: null`
    (and a bare folder) reads every split of a generation input.
    """

    DOC = README_SECTIONS["generation"]

    task: Literal[TASKS] = param(REQUIRED, "who is transferred onto whom (gen.pairing)")  # type: ignore[valid-type]
    targets: Source = param(REQUIRED, "the images the material is transferred onto (null split: every split)")
    materials: Source = param(REQUIRED, "the material exemplars (null split: every split)")
    out: str = param(REQUIRED, "the output folder (manifest, images/, and the hidden job folder .job/)")
    models: ZeSTConfig | Literal["tiny"] | None = param(
        None, "null: ZeST's hub models; a mapping of ZeSTConfig keys; tiny: tiny random-weight stand-ins")
    name: str | None = param(None, "the outputs' ood_set (null: the task)")
    batch_size: int = param(1, "items per pipeline call (never changes an image)", ge=1)
    seed: int = param(42, "the job's seed (ZeST: 42)")
    seed_mode: Literal["per_item", "constant"] = param(
        "per_item", "per_item: each item's seed from its global index; constant: `seed` for every item (ZeST's script)")
    precision: Literal[PRECISIONS] = param("auto", "auto: bf16/fp16 on a GPU, fp32 on the CPU")  # type: ignore[valid-type]
    limit: int | None = param(None, "keep the first planned items (raise it later and rerun to extend the job)", ge=0)
    per_target: int = param(1, "material exemplars per target", ge=1)
    inherit: Literal[INHERIT] | None = param(  # type: ignore[valid-type]
        None, "whose labels the outputs carry: material, target or none (null: the task's)")
    masks: str | None = param(None, "folder of given masks, named like the targets (null: made by mask_method)",
                              check=existing_folder)
    attention: Literal[ATTENTION_BACKENDS] = param("auto", "attention backend (speed only)")  # type: ignore[valid-type]
    compile: bool = param(False, "torch.compile the UNet and ControlNet (speed only)")
    plan_change: Literal[PLAN_CHANGES] = param(  # type: ignore[valid-type]
        "refuse", "what a rerun does when the input folders changed: refuse, or extend the stored plan")

    def check(self, dims: dict[str, int] | None = None) -> None:
        super().check(dims)
        for key in ("targets", "materials"):
            if getattr(self, key).group is not None:
                raise ConfigError(f"{key}.group: generated images are always group 'hard'; remove the key")
        if not self.out:
            raise ConfigError("out: must be a folder path, got ''")

    @classmethod
    def from_dict(cls, raw: dict[str, Any], where: str = "") -> GenerationConfig:
        """The typed config of a mapping; every fault is one `ConfigError` naming the key (`models.base: ...`)."""
        if not isinstance(raw, dict):
            raise ConfigError(f"a generation config is a mapping, got {type(raw).__name__}", doc=cls.DOC)
        return super().from_dict(raw, where)

    def call(self) -> ZeSTCall:
        """The ZeST call parameters of this job."""
        return ZeSTCall(**{name: getattr(self, name) for name in ZeSTCall.fields()})

    def call_params(self) -> dict[str, Any]:
        """The ZeSTPipeline call parameters and the precision (recorded in each output's provenance)."""
        return {**self.call().call_kwargs(), "precision": self.precision}

    def decisive(self) -> dict[str, Any]:
        """The keys that decide the outputs (all but `NOT_DECISIVE`)."""
        return {k: v for k, v in self.to_dict().items() if k not in NOT_DECISIVE}

    def item_seed(self, index: int) -> int:
        """The seed of the item at global plan position `index`: `item_seed(seed, index)` (per_item, the default) or
        `seed` itself for every item (constant: ZeST's single seed, 42 by default)."""
        return self.seed if self.seed_mode == "constant" else item_seed(self.seed, index)

    def fingerprint(self) -> str:
        """Hash of `decisive()`: a resumed job must match it."""
        return hashlib.sha256(json.dumps(self.decisive(), sort_keys=True, default=str).encode()).hexdigest()[:16]
