"""The configuration of a generation job (`GenerationConfig`: every key, validated, with its default) and `key=value`
overrides. See docs/generation.md for each key."""
from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from dataclasses import dataclass
from typing import Any, Sequence

from gen.jobplan import PLAN_CHANGES, parse_source
from gen.pairing import TASKS
from pipelines.cli import README_SECTIONS, check_keys, load_yaml
from pipelines.errors import ConfigError
from pipelines.masks import MASK_METHODS
from pipelines.runtime import ATTENTION_BACKENDS, PRECISIONS, item_seed

JOB_FOLDER = ".job"  # hidden, so that `datasets` ImageFolder sees only the manifest
SEED_MODES = ("per_item", "constant")
NOT_DECISIVE = ("out", "limit", "batch_size", "attention", "compile", "plan_change")  # keys that never change an image


@dataclass
class GenerationConfig:
    """Everything a generation job needs; see docs/generation.md for each key.

    `models`: None (the real hub models of ZeSTConfig's defaults), a ZeSTConfig mapping (any subset of its keys), or
    "tiny" (tiny random-weight models built once into `$OODFORGE_CACHE/tiny_zest`, default ~/.cache/oodforge).
    `name` is the output's `ood_set` (default: the task). `limit` keeps the first planned items (raise it later and
    rerun to extend the same job). `mask_method` makes the masks of targets without a given mask (auto = rembg when
    installed, else OpenCV with a warning). `attention` (auto/sdpa/xformers) and `compile` only change speed;
    `plan_change` (refuse/extend) says what a rerun does when the input folders changed (gen.jobplan). `targets` and
    `materials` are folders or `{manifest, split, sets}` mappings (gen.jobplan.parse_source). `seed_mode` gives each
    item its own seed from its global index (per_item) or `seed` to every item (constant, as ZeST's script). The
    pipeline call parameters default to ZeST's (REFERENCE.md).
    """

    task: str
    targets: Any  # a folder, or {manifest, split, sets} (gen.jobplan.Source)
    materials: Any
    out: str
    models: Any = None
    name: str | None = None
    resolution: int = 1024
    num_inference_steps: int = 30
    batch_size: int = 1
    seed: int = 42
    seed_mode: str = "per_item"
    precision: str = "auto"
    limit: int | None = None
    per_target: int = 1
    inherit: str | None = None
    masks: str | None = None
    mask_method: str = "auto"
    resize: str = "squash"
    composite: bool = False
    strength: float = 0.9999
    guidance_scale: float = 5.0
    controlnet_conditioning_scale: float = 0.9
    ip_adapter_scale: float = 1.0
    attention: str = "auto"
    compile: bool = False
    plan_change: str = "refuse"

    def __post_init__(self) -> None:
        check_config(self)

    @classmethod
    def keys(cls) -> list[str]:
        return [f.name for f in dataclasses.fields(cls)]

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> "GenerationConfig":
        """Build from a mapping; an unknown key raises a `ConfigError` naming it and the closest known one."""
        if not isinstance(values, dict):
            raise ConfigError(f"a generation config is a mapping, got {type(values).__name__}")
        check_keys(values, cls.keys(), "generation config", doc=README_SECTIONS["generation"])
        missing = [k for k in ("task", "targets", "materials", "out") if values.get(k) in (None, "")]
        if missing:
            raise ConfigError(f"generation config is missing required keys {missing}")
        return cls(**values)

    @classmethod
    def from_yaml(cls, path: str | os.PathLike, overrides: Sequence[str] = ()) -> "GenerationConfig":
        """Read a YAML config and apply `key=value` overrides (values parsed as YAML; `models.depth=DIR` sets a
        nested key); a missing file or bad YAML is a one-line `ConfigError` (pipelines.cli.load_yaml)."""
        return cls.from_dict(load_yaml(path, overrides))

    def to_dict(self) -> dict[str, Any]:
        return {k: getattr(self, k) for k in self.keys()}

    def call_params(self) -> dict[str, Any]:
        """The ZeSTPipeline call parameters (recorded in each output's provenance)."""
        return {
            "num_inference_steps": self.num_inference_steps, "strength": self.strength,
            "guidance_scale": self.guidance_scale, "controlnet_conditioning_scale": self.controlnet_conditioning_scale,
            "ip_adapter_scale": self.ip_adapter_scale, "resolution": self.resolution, "resize": self.resize,
            "composite": self.composite, "precision": self.precision, "mask_method": self.mask_method,
        }

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


def check_config(config: GenerationConfig) -> None:
    """Every key's type and allowed values; a bad one is a `ConfigError` naming it."""
    if config.task not in TASKS:
        raise ConfigError(f"config 'task' must be one of {TASKS}, got {config.task!r}")
    parse_source(config.targets, "targets")
    parse_source(config.materials, "materials")
    if not isinstance(config.out, (str, os.PathLike)) or not str(config.out):
        raise ConfigError(f"config 'out' must be a folder path, got {config.out!r}")
    for key in ("resolution", "num_inference_steps", "batch_size", "per_target"):
        value = getattr(config, key)
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ConfigError(f"config {key!r} must be a positive integer, got {value!r}")
    if isinstance(config.seed, bool) or not isinstance(config.seed, int):
        raise ConfigError(f"config 'seed' must be an integer, got {config.seed!r}")
    limit = config.limit
    if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int) or limit < 0):
        raise ConfigError(f"config 'limit' must be a non-negative integer or null, got {limit!r}")
    if not (config.models is None or config.models == "tiny" or isinstance(config.models, dict)):
        raise ConfigError(f"config 'models' must be null, 'tiny' or a mapping of ZeSTConfig keys, got {config.models!r}")
    for key in ("composite", "compile"):
        if not isinstance(getattr(config, key), bool):
            raise ConfigError(f"config {key!r} must be true or false, got {getattr(config, key)!r}")
    for key, allowed in (("precision", PRECISIONS), ("mask_method", MASK_METHODS), ("attention", ATTENTION_BACKENDS),
                         ("plan_change", PLAN_CHANGES), ("seed_mode", SEED_MODES)):
        if getattr(config, key) not in allowed:
            raise ConfigError(f"config {key!r} must be one of {allowed}, got {getattr(config, key)!r}")
    for key in ("strength", "guidance_scale", "controlnet_conditioning_scale", "ip_adapter_scale"):
        if isinstance(getattr(config, key), bool) or not isinstance(getattr(config, key), (int, float)):
            raise ConfigError(f"config {key!r} must be a number, got {getattr(config, key)!r}")
